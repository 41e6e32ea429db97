package runtime

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// HibernatedProcessesEnded is the hibernation berth makes, under runc and
// gVisor alike: every process of the sandbox ended (its task removed),
// its container, writable layer, host directory and network namespace
// kept. (Memory checkpoints need CRIU under runc, which does not work on
// the kernels berth is tested on, and a checkpoint in the runc shim that
// Debian's runsc 2022-12 lacks: docs/state.md.)
const HibernatedProcessesEnded = "processes-ended"

// Hibernate ends every process of sandbox id and removes its task,
// keeping its container: the sandbox then holds no memory and no CPU, and
// RestartTask starts it again with its files (Woken clears the mark). The
// mark (labelHibernated) is recorded on the container before the task is
// touched, so that a berthd stopped at any point afterwards finds a
// hibernated sandbox, not an orphan. A paused task is thawed for its
// SIGKILL (thawForDelete). It returns the host pid of the task it
// removed, 0 when there was none. A hibernated sandbox stays so (no
// error). Errors: ErrSandboxNotFound; ErrTaskNotRunning when the sandbox
// is not hibernated and its task neither runs nor is paused.
func (r *Runtime) Hibernate(ctx context.Context, id string) (_ uint32, err error) {
	c := r.begin(ctx, "hibernate sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return 0, r.containerError(id, err)
	}
	labels, err := container.Labels(ctx)
	if err != nil {
		return 0, r.containerError(id, err)
	}
	if labels[labelSandbox] != "true" {
		return 0, fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
	}
	marked := labels[labelHibernated] != ""
	var pid uint32
	task, err := container.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
		if marked {
			return 0, nil
		}
		return 0, fmt.Errorf("%w: sandbox %s has no task", ErrTaskNotRunning, id)
	case err != nil:
		return 0, fmt.Errorf("load task %s: %w", id, err)
	}
	pid = task.Pid()
	if !marked {
		// A task that exited (and is being restarted, or left stopped)
		// is not hibernated: what ran in it is gone already.
		st, err := task.Status(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("task status %s: %w", id, err)
		}
		if err == nil && st.Status != containerd.Running && st.Status != containerd.Paused && st.Status != containerd.Pausing {
			return 0, fmt.Errorf("%w: sandbox %s's task is %s", ErrTaskNotRunning, id, st.Status)
		}
		c.changes()
		if _, err := container.SetLabels(ctx, map[string]string{labelHibernated: HibernatedProcessesEnded}); err != nil {
			return 0, r.containerError(id, err)
		}
	}
	c.changes()
	if err := r.deleteTask(ctx, container); err != nil {
		return 0, err
	}
	return pid, nil
}

// Woken clears sandbox id's hibernation mark once RestartTask started its
// new task. Errors: ErrSandboxNotFound, containerd's.
func (r *Runtime) Woken(ctx context.Context, id string) error {
	return r.setLabels(ctx, id, map[string]string{labelHibernated: ""})
}
