package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// ErrTaskNotRunning means a sandbox's task is neither running nor paused
// (stopped, or never started): it cannot be paused or resumed.
var ErrTaskNotRunning = errors.New("sandbox task not running")

// Pause freezes every process of sandbox id's task: containerd's
// task.Pause, the cgroup freezer under runc, `runsc pause` under gVisor.
// It returns once they are frozen. A task paused already stays so (no
// error). It fails with ErrSandboxNotFound, or ErrTaskNotRunning when the
// task is neither running nor paused.
func (r *Runtime) Pause(ctx context.Context, id string) (err error) {
	return r.freeze(ctx, id, true)
}

// Resume thaws sandbox id's paused task (task.Resume); a running task
// stays so (no error). Errors as for Pause.
func (r *Runtime) Resume(ctx context.Context, id string) (err error) {
	return r.freeze(ctx, id, false)
}

// freeze pauses (pause) or resumes sandbox id's task, doing nothing when it
// is in that state already. It asks containerd's task service directly:
// a resume of a paused task is one request (containerd → shim → `runc
// resume`), a pause two (the task's status, then the pause); the status
// is read after a failed resume, to tell a running or stopped task from a
// failure.
func (r *Runtime) freeze(ctx context.Context, id string, pause bool) (err error) {
	op := "resume the task of sandbox " + id
	if pause {
		op = "pause the task of sandbox " + id
	}
	c := r.begin(ctx, op)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	var resumeErr error
	if !pause {
		c.changes()
		if _, resumeErr = r.client.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id}); resumeErr == nil {
			return nil
		}
	}
	t, err := r.task(ctx, id)
	if errdefs.IsNotFound(err) {
		if _, err := r.client.LoadContainer(ctx, id); err != nil {
			return r.containerError(id, err)
		}
		return fmt.Errorf("%w: sandbox %s has no task", ErrTaskNotRunning, id)
	}
	if err != nil {
		return fmt.Errorf("task status %s: %w", id, err)
	}
	running := t.GetStatus() == tasktypes.Status_RUNNING
	paused := t.GetStatus() == tasktypes.Status_PAUSED || t.GetStatus() == tasktypes.Status_PAUSING
	switch {
	case pause && paused, !pause && running:
		return nil
	case !running && !paused:
		return fmt.Errorf("%w: sandbox %s's task is %s", ErrTaskNotRunning, id, strings.ToLower(t.GetStatus().String()))
	case !pause:
		return fmt.Errorf("%s: %w", op, errgrpc.ToNative(resumeErr))
	}
	c.changes()
	if err := r.pauseTask(ctx, id); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// pauseAttempts bounds pauseTask's tries.
const pauseAttempts = 3

// pauseTask freezes sandbox id's task, trying again while it still runs:
// runc's cgroup v1 freezer gives up when the cgroup stays FREEZING through
// its own retries (it thaws and fails "unable to freeze", libcontainer/
// cgroups/fs/freezer.go), which a workload that forks fast can cause on a
// loaded host; a later try usually catches it between forks. Seen as an
// INTERNAL PauseSandbox in TestPauseResume at load 15.
func (r *Runtime) pauseTask(ctx context.Context, id string) error {
	for attempt := 1; ; attempt++ {
		_, err := r.client.TaskService().Pause(ctx, &tasks.PauseTaskRequest{ContainerID: id})
		err = errgrpc.ToNative(err)
		if err == nil || attempt == pauseAttempts || errdefs.IsNotFound(err) || ctx.Err() != nil {
			return err
		}
		if t, terr := r.task(ctx, id); terr != nil || t.GetStatus() != tasktypes.Status_RUNNING {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

// thawForDelete makes a paused task killable before deleteTask removes it:
// under the cgroup v1 freezer a frozen process takes SIGKILL only once it
// is thawed, so the task's processes are sent SIGKILL first (they die as
// they thaw, running nothing more) and the task is resumed. A task that is
// not paused is left alone.
func thawForDelete(ctx context.Context, task containerd.Task) {
	st, err := task.Status(ctx)
	if err != nil || (st.Status != containerd.Paused && st.Status != containerd.Pausing) {
		return
	}
	_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
	_ = task.Resume(ctx)
}
