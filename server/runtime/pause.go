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
// is in that state already. A runc task is frozen and thawed through its
// cgroup's freezer (freezer.go): a resume of a task this berthd froze
// writes one file and asks containerd nothing; otherwise one request reads
// the task's status and pid first. A task containerd holds paused (paused
// by an earlier berthd, or a gVisor task) and a gVisor task are paused and
// resumed through containerd's task service (containerd → shim → `runc`
// or `runsc pause`/`resume`).
func (r *Runtime) freeze(ctx context.Context, id string, pause bool) (err error) {
	op := "resume the task of sandbox " + id
	if pause {
		op = "pause the task of sandbox " + id
	}
	c := r.begin(ctx, op)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	if k, ok := r.freezers.get(id); !pause && ok && k.ours {
		// Frozen by this berthd: containerd's shim holds the task running.
		if frozen, ferr := k.f.frozen(); ferr == nil {
			if frozen {
				c.changes()
				if err := k.f.thaw(); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
			}
			r.freezers.setOurs(id, false)
			return nil
		}
		// The cgroup is gone: the task ended (or was restarted).
		r.freezers.forget(id)
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
	case !running && !paused:
		return fmt.Errorf("%w: sandbox %s's task is %s", ErrTaskNotRunning, id, strings.ToLower(t.GetStatus().String()))
	case paused && pause:
		// Held paused by containerd; frozen too, unless someone thawed
		// its cgroup under the shim (resumeHeld).
		if f, ok := r.runcFreezer(ctx, id, t.GetPid()); ok {
			if frozen, err := f.frozen(); err == nil && !frozen {
				c.changes()
				if err := f.freeze(ctx); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
			}
		}
		return nil
	case paused:
		c.changes()
		if err := r.resumeHeld(ctx, id, t.GetPid()); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	}
	if f, ok := r.runcFreezer(ctx, id, t.GetPid()); ok {
		frozen, err := f.frozen()
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		switch {
		case frozen == pause:
			// containerd holds the task running: a frozen cgroup
			// is a berthd's freeze.
			r.freezers.setOurs(id, frozen)
			return nil
		case pause:
			c.changes()
			err = f.freeze(ctx)
		default:
			c.changes()
			err = f.thaw()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		r.freezers.setOurs(id, pause)
		return nil
	}
	if !pause {
		return nil
	}
	c.changes()
	if err := r.pauseTask(ctx, id); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// resumeHeld resumes sandbox id's task pid, which containerd holds paused,
// through containerd (its shim's `runc resume` or `runsc resume`). When the
// shim's runc finds the task's cgroup thawed already (someone thawed it
// under the shim: berthd's fast resume of a task that `ctr task pause`
// paused), it refuses ("container not paused") and the shim would hold the
// task paused for good, refusing to delete it: the cgroup is frozen again
// and the resume asked once more.
func (r *Runtime) resumeHeld(ctx context.Context, id string, pid uint32) error {
	_, err := r.client.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id})
	if err == nil {
		return nil
	}
	f, ferr := freezerOf(pid)
	if ferr != nil {
		return errgrpc.ToNative(err)
	}
	if frozen, ferr := f.frozen(); ferr != nil || frozen {
		return errgrpc.ToNative(err)
	}
	if ferr := f.freeze(ctx); ferr != nil {
		return fmt.Errorf("%w (freezing its thawed cgroup for containerd's resume: %v)", errgrpc.ToNative(err), ferr)
	}
	_, err = r.client.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id})
	return errgrpc.ToNative(err)
}

// runcFreezer returns the freezer of sandbox id's task pid when it runs
// under runc and its cgroup has one (recording it for the next resume),
// false for a gVisor task and a cgroup without a freezer: those are paused
// through containerd.
func (r *Runtime) runcFreezer(ctx context.Context, id string, pid uint32) (taskFreezer, bool) {
	if k, ok := r.freezers.get(id); ok && k.pid == pid {
		return k.f, true
	}
	gvisor, err := r.kinds.gvisor(ctx, id, pid, r.Get)
	if err != nil || gvisor {
		return taskFreezer{}, false
	}
	f, err := freezerOf(pid)
	if err != nil {
		return taskFreezer{}, false
	}
	r.freezers.put(id, pid, f)
	return f, true
}

// frozenByFreezer reports whether task pid of sandbox id, which containerd
// holds running, is frozen by its cgroup's freezer (a runc task paused by
// berthd: freezer.go; `runsc pause` leaves a gVisor task's freezer
// thawed). It asks containerd nothing.
func (r *Runtime) frozenByFreezer(id string, pid uint32) bool {
	k, ok := r.freezers.get(id)
	if !ok || k.pid != pid {
		f, err := freezerOf(pid)
		if err != nil {
			return false
		}
		k = knownFreezer{pid: pid, f: f}
	}
	frozen, err := k.f.frozen()
	return err == nil && frozen
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
// they thaw, running nothing more) and the task is resumed: through its
// freezer when berthd froze it (freezer.go), through containerd when
// containerd holds it paused. A task that is not paused is left alone.
func (r *Runtime) thawForDelete(ctx context.Context, task containerd.Task) {
	st, err := task.Status(ctx)
	if err != nil {
		return
	}
	switch {
	case st.Status == containerd.Paused || st.Status == containerd.Pausing:
		_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		_ = r.resumeHeld(ctx, task.ID(), task.Pid())
	case st.Status == containerd.Running:
		f, err := freezerOf(task.Pid())
		if err != nil {
			return
		}
		if frozen, err := f.frozen(); err == nil && frozen {
			_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
			_ = f.thaw()
		}
	}
}
