package runtime

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// TakesFDs reports whether TakeFD may take descriptors of the agent of
// sandbox id, host process pid: not under gVisor, whose agent's
// descriptors are its sentry's. It asks containerd once per task.
func (r *Runtime) TakesFDs(ctx context.Context, id string, pid uint32) bool {
	gvisor, err := r.kinds.gvisor(ctx, id, pid, r.Get)
	return err == nil && !gvisor && pid != 0
}

// TakeFD returns a duplicate, in berthd, of descriptor fd of the agent of
// sandbox id, host process pid (as Reach found it): pidfd_getfd(2) (Linux
// 5.6) on a pidfd of pid once that process is proven the sandbox's, as
// DialPort proves it (sandboxProcess). The duplicate shares the agent's
// open file description (use pread(2): the offset is shared) and is
// close-on-exec; the caller closes it. What it refers to is whatever the
// agent chose: the caller must check it before use. It fails with
// ErrNoDirectPath (wrapped) for a gVisor sandbox, whose agent's
// descriptors are numbers in its sentry rather than the host's process,
// and for a process not proven the sandbox's; otherwise with
// pidfd_getfd's error (EBADF for a number the agent has not open, EPERM
// where ptrace access is denied).
func (r *Runtime) TakeFD(ctx context.Context, id string, pid uint32, fd int32) (int, error) {
	gvisor, err := r.kinds.gvisor(ctx, id, pid, r.Get)
	if err != nil {
		return -1, fmt.Errorf("%w: runtime of sandbox %s: %v", ErrNoDirectPath, id, err)
	}
	if gvisor {
		return -1, fmt.Errorf("%w: sandbox %s runs under gVisor, whose descriptors are its sentry's", ErrNoDirectPath, id)
	}
	if fd < 0 {
		return -1, fmt.Errorf("descriptor %d of the agent of sandbox %s: %w", fd, id, unix.EBADF)
	}
	pidfd, err := r.sandboxProcess(id, pid)
	if err != nil {
		return -1, fmt.Errorf("%w: %v", ErrNoDirectPath, err)
	}
	defer unix.Close(pidfd)
	taken, err := unix.PidfdGetfd(pidfd, int(fd), 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_getfd of descriptor %d of the agent of sandbox %s (process %d): %w", fd, id, pid, err)
	}
	return taken, nil
}
