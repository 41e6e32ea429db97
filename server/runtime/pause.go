package runtime

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
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
// is in that state already.
func (r *Runtime) freeze(ctx context.Context, id string, pause bool) (err error) {
	op := "resume the task of sandbox " + id
	if pause {
		op = "pause the task of sandbox " + id
	}
	c := r.begin(ctx, op)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return r.containerError(id, err)
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("%w: sandbox %s has no task", ErrTaskNotRunning, id)
	}
	if err != nil {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return fmt.Errorf("task status %s: %w", id, err)
	}
	switch {
	case pause && (st.Status == containerd.Paused || st.Status == containerd.Pausing),
		!pause && st.Status == containerd.Running:
		return nil
	case st.Status != containerd.Running && st.Status != containerd.Paused && st.Status != containerd.Pausing:
		return fmt.Errorf("%w: sandbox %s's task is %s", ErrTaskNotRunning, id, st.Status)
	}
	c.changes()
	if pause {
		err = pauseTask(ctx, task)
	} else {
		err = task.Resume(ctx)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// pauseAttempts bounds pauseTask's tries.
const pauseAttempts = 3

// pauseTask freezes task, trying again while it still runs: runc's cgroup
// v1 freezer gives up when the cgroup stays FREEZING through its own
// retries (it thaws and fails "unable to freeze", libcontainer/cgroups/fs/
// freezer.go), which a workload that forks fast can cause on a loaded
// host; a later try usually catches it between forks. Seen as an INTERNAL
// PauseSandbox in TestPauseResume at load 15.
func pauseTask(ctx context.Context, task containerd.Task) error {
	for attempt := 1; ; attempt++ {
		err := task.Pause(ctx)
		if err == nil || attempt == pauseAttempts || errdefs.IsNotFound(err) || ctx.Err() != nil {
			return err
		}
		if st, serr := task.Status(ctx); serr != nil || st.Status != containerd.Running {
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
