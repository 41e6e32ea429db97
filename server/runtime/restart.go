package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"

	"github.com/berth-sandbox/berth/internal/agentproof"
)

var (
	// ErrTaskRunning means a sandbox's task is running when an operation
	// needs it stopped.
	ErrTaskRunning = errors.New("task is running")
	// ErrTaskReplaced means the sandbox's task is another one than the
	// operation was about: the sandbox was deleted and made anew meanwhile.
	ErrTaskReplaced = errors.New("task replaced")
)

// RestartTask starts a new task for the sandbox id whose task, with host pid
// exited, has exited: it deletes the exited task and starts a new one from
// the same container, so the sandbox keeps its filesystem (the container's
// snapshot) and gets a fresh agent as PID 1, with a new pid namespace,
// network namespace and boot id. A gVisor sandbox hibernated with its
// memory (HibernatedMemoryKept) is restored instead (restore): the same
// processes and agent; when that fails, a fresh task starts and a line in
// the sandbox's log says why. It returns the new task's host pid. It
// fails with ErrSandboxNotFound when the container is gone, ErrTaskReplaced
// when its task is not the one with pid exited, and ErrTaskRunning when its
// task runs.
func (r *Runtime) RestartTask(ctx context.Context, id string, exited uint32) (_ uint32, err error) {
	c := r.begin(ctx, "restart the task of sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return 0, r.containerError(id, err)
	}
	task, err := container.Task(ctx, nil)
	switch {
	case err == nil:
		if exited != 0 && task.Pid() != exited {
			return 0, fmt.Errorf("%w: sandbox %s runs task pid %d, not %d", ErrTaskReplaced, id, task.Pid(), exited)
		}
		st, err := task.Status(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("task status %s: %w", id, err)
		}
		if err == nil && st.Status != containerd.Stopped {
			return 0, fmt.Errorf("%w: sandbox %s is %s", ErrTaskRunning, id, st.Status)
		}
		if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("delete exited task %s: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return 0, fmt.Errorf("load task %s: %w", id, err)
	}
	// The new agent reads the sandbox's secret from its run directory.
	labels, err := container.Labels(ctx)
	if err != nil {
		return 0, r.containerError(id, err)
	}
	base, _ := strconv.ParseUint(labels[labelIDBase], 10, 32)
	// Sandboxes of berthds before 0710 sandbox directories get theirs.
	if err := lockHostDir(r.hostDir(id), labels[labelIDBase] != "", uint32(base)); err != nil {
		return 0, err
	}
	// A restored agent read its secret at its first start: none is
	// written for it (the workload, sandbox root, could read it there).
	restoring := labels[labelHibernated] == HibernatedMemoryKept
	writeSecret := func() error {
		if h := labels[labelAgentSecret]; h != "" {
			return r.writeSecret(id, h, uint32(base))
		}
		return nil
	}
	if !restoring {
		if err := writeSecret(); err != nil {
			return 0, err
		}
	}
	// The root stays mounted across tasks; a host's reboot unmounts it.
	if labels[labelRootFS] == RootFSIDMapped {
		if err := r.mountRoot(ctx, id, uint32(base)); err != nil {
			return 0, err
		}
	}
	// Volumes are mounted again: a host's reboot unmounted them.
	if vols := decodeVolumesLabel(labels[labelVolumes]); len(vols) > 0 {
		userns := labels[labelIDBase] != ""
		if err := r.mountVolumes(id, labels[LabelOwner], vols, userns, uint32(base)); err != nil {
			return 0, err
		}
	}
	// The shim appends to the log file: the new agent's lines follow the
	// old one's.
	if err := r.createLog(id); err != nil {
		return 0, err
	}
	c.changes()
	if restoring {
		os.Remove(filepath.Join(r.hostDir(id), "run", agentproof.SecretFile)) // left by a berthd before this one
		pid, err := r.restore(c.parent, container, id, uint32(base))
		if err == nil {
			return pid, nil
		}
		// The files are kept whatever the image holds: a fresh task.
		r.noteInLog(id, "berthd: the memory checkpoint of this hibernated sandbox could not be restored, a new task starts (processes and memory are lost, files kept): "+err.Error())
		if err := writeSecret(); err != nil {
			return 0, err
		}
	}
	task, err = container.NewTask(ctx, cio.LogFile(r.LogPath(id)))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
		}
		return 0, fmt.Errorf("create task %s: %w", id, err)
	}
	if err := task.Start(ctx); err != nil {
		if _, derr := task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill); derr != nil && !errdefs.IsNotFound(derr) {
			err = fmt.Errorf("%w (delete failed: %v)", err, derr)
		}
		return 0, fmt.Errorf("start task %s: %w", id, err)
	}
	return task.Pid(), nil
}
