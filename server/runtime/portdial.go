package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	goruntime "runtime"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/portconn"
)

// ErrNoDirectPath means berthd cannot connect in a sandbox's network
// namespace itself: its agent has to (a gVisor sandbox, whose network is
// gVisor's own stack rather than the host kernel's; a task berthd cannot
// prove is the sandbox's; a kernel without pidfds).
var ErrNoDirectPath = errors.New("berthd cannot connect in the sandbox's network namespace itself")

// DialPort connects to 127.0.0.1:port in the network namespace of the
// task of sandbox id, host process pid (the agent, as Reach found it), as
// the agent would, but from berthd: the socket is made on a thread moved
// into that namespace (setns(2) on a locked thread, which moves back
// afterwards) and stays there. The namespace is taken from a pidfd of pid
// (pidfd_open(2), setns(2) of a pidfd: Linux 5.8), once that process is
// proven the sandbox's: its root shows the sandbox's run directory
// (RunDir: the same mount as the host directory's "run", by device and
// inode) while the pidfd's process is alive, so a pid reused by another
// process, or one berthd cannot see (another pid namespace), is never
// joined. It fails with ErrNoDirectPath (wrapped) when the agent has to
// dial instead: a gVisor sandbox, a process not proven the sandbox's, no
// pidfds; and otherwise with the dial's own error (portconn.Refused says
// whether the port is closed).
func (r *Runtime) DialPort(ctx context.Context, id string, pid uint32, port uint32) (*net.TCPConn, error) {
	gvisor, err := r.kinds.gvisor(ctx, id, pid, r.Get)
	if err != nil {
		return nil, fmt.Errorf("%w: runtime of sandbox %s: %v", ErrNoDirectPath, id, err)
	}
	if gvisor {
		return nil, fmt.Errorf("%w: sandbox %s runs under gVisor, whose network stack is its own", ErrNoDirectPath, id)
	}
	pidfd, err := r.sandboxProcess(id, pid)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDirectPath, err)
	}
	defer unix.Close(pidfd)
	var conn *net.TCPConn
	err = inNetNS(netns.NsHandle(pidfd), func() (err error) {
		conn, err = portconn.Dial(ctx, port)
		return err
	})
	return conn, err
}

// sandboxProcess returns a pidfd of host process pid once it is proven a
// process of sandbox id (DialPort).
func (r *Runtime) sandboxProcess(id string, pid uint32) (int, error) {
	if pid == 0 {
		return -1, errors.New("the task's pid is unknown")
	}
	pidfd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open of task %d: %w", pid, err)
	}
	var theirs, ours unix.Stat_t
	err = errors.Join(
		unix.Lstat(fmt.Sprintf("/proc/%d/root%s", pid, RunDir), &theirs),
		unix.Lstat(filepath.Join(r.hostDir(id), "run"), &ours))
	if err == nil && (theirs.Dev != ours.Dev || theirs.Ino != ours.Ino) {
		err = fmt.Errorf("process %d does not see sandbox %s's run directory at %s", pid, id, RunDir)
	}
	if err == nil {
		// Alive now: /proc/<pid> above was the pidfd's process.
		err = unix.PidfdSendSignal(pidfd, 0, nil, 0)
	}
	if err != nil {
		unix.Close(pidfd)
		return -1, fmt.Errorf("task %d of sandbox %s: %w", pid, id, err)
	}
	return pidfd, nil
}

// inNetNS runs fn on a locked thread moved into the network namespace ns
// (setns(2) of a namespace file or a pidfd); sockets fn makes stay there.
// The thread moves back afterwards; one that cannot is never unlocked, so
// that Go ends it with the goroutine rather than run others there. At most
// maxNetNSDials run at once: past that it fails with ErrNoDirectPath
// without running fn.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	select {
	case netnsDials <- struct{}{}:
		defer func() { <-netnsDials }()
	default:
		return fmt.Errorf("%w: %d connections are being opened in sandboxes' network namespaces already, each on a thread of berthd's own", ErrNoDirectPath, maxNetNSDials)
	}
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			goruntime.UnlockOSThread()
			done <- fmt.Errorf("%w: berthd's network namespace: %v", ErrNoDirectPath, err)
			return
		}
		defer home.Close()
		if err := netns.Set(ns); err != nil {
			goruntime.UnlockOSThread() // still at home
			done <- fmt.Errorf("%w: setns: %v", ErrNoDirectPath, err)
			return
		}
		err = fn()
		if netns.Set(home) == nil {
			goruntime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// maxNetNSDials bounds the threads locked in sandboxes' network
// namespaces at once (inNetNS): each holds one of berthd's threads until
// its connect(2) ends, up to portconn.DialTimeout for a port whose listen
// backlog is full, and past 10,000 threads Go ends the process.
const maxNetNSDials = 32

// netnsDials holds a place for each inNetNS under way.
var netnsDials = make(chan struct{}, maxNetNSDials)

// taskKinds remembers whether each sandbox's task runs under gVisor, by
// sandbox id and task pid, so that containerd is asked once per task.
type taskKinds struct {
	mu sync.Mutex
	m  map[string]taskKind
}

type taskKind struct {
	pid    uint32
	gvisor bool
}

// maxTaskKinds bounds taskKinds: past it, it starts again empty.
const maxTaskKinds = 4096

// gvisor reports whether the task pid of sandbox id runs under gVisor,
// reading the sandbox's record with get when it is not known.
func (k *taskKinds) gvisor(ctx context.Context, id string, pid uint32, get func(context.Context, string) (Sandbox, error)) (bool, error) {
	k.mu.Lock()
	kind, ok := k.m[id]
	k.mu.Unlock()
	if ok && kind.pid == pid {
		return kind.gvisor, nil
	}
	sb, err := get(ctx, id)
	if err != nil {
		return false, err
	}
	kind = taskKind{pid: pid, gvisor: sb.Runtime == RuntimeGVisor}
	k.mu.Lock()
	if k.m == nil || len(k.m) >= maxTaskKinds {
		k.m = make(map[string]taskKind)
	}
	k.m[id] = kind
	k.mu.Unlock()
	return kind.gvisor, nil
}
