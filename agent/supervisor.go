package agent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// exitStatus is how a child ended, as reported by wait4(2).
type exitStatus struct {
	ws unix.WaitStatus
	ru unix.Rusage
	at time.Time // when it was reaped
}

// supervisor reaps every child of the agent. It is the only caller of
// wait4(2) in the agent: os.Process.Wait and exec.Cmd.Wait are never used,
// so a status is collected exactly once. Starting a process and registering
// its pid happen under the same mutex as reaping, so a process that exits at
// once cannot be reaped before its owner is known; children nobody
// registered (orphans re-parented to the agent as PID 1 or subreaper) are
// reaped and forgotten.
type supervisor struct {
	sigc chan os.Signal

	mu     sync.Mutex
	owners map[int]chan<- exitStatus
}

func newSupervisor() *supervisor {
	return &supervisor{sigc: make(chan os.Signal, 1), owners: make(map[int]chan<- exitStatus)}
}

// notify subscribes to SIGCHLD. Call it before the first start.
func (s *supervisor) notify() { signal.Notify(s.sigc, unix.SIGCHLD) }

// run reaps children on every SIGCHLD until ctx ends. One buffered signal
// stands for any number of exits: each wake-up reaps until none is left.
func (s *supervisor) run(ctx context.Context) {
	defer signal.Stop(s.sigc)
	s.reap() // children that exited before notify
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.sigc:
			s.reap()
		}
	}
}

// reap collects every exited child without blocking and hands each status to
// its owner. The loop ends when wait4 reports no exited child (0) or no
// child at all (ECHILD); each iteration consumes one zombie.
func (s *supervisor) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var st exitStatus
		// No __WALL: the agent's own children exit with SIGCHLD, and the
		// kernel resets an orphan's exit signal to SIGCHLD when it
		// re-parents it (kernel/exit.c reparent_leader). Leaving "clone"
		// children alone keeps the reaper off the one the Go runtime forks
		// to probe pidfd support, which it reaps itself.
		pid, err := unix.Wait4(-1, &st.ws, unix.WNOHANG, &st.ru)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		st.at = time.Now()
		if ch, ok := s.owners[pid]; ok {
			delete(s.owners, pid)
			ch <- st // buffered for exactly this one status
		}
	}
}

// start calls fork, which starts a process and returns its pid, under the
// reaping lock, and registers the pid. The returned channel receives the
// process's exit status once.
func (s *supervisor) start(fork func() (int, error)) (pid int, exited <-chan exitStatus, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err = fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	s.owners[pid] = ch
	return pid, ch, nil
}
