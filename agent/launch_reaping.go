package agent

import (
	"errors"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/agent/launcher"
)

// startReaped starts req as uid:gid from a reaping launcher
// (launcher.ReapingLauncher): the process is the launcher's child, and its
// exit comes from the launcher's report (reaped) or, when the launcher died
// first, from the supervisor's own wait4 of the orphan. Both find the pid
// in the supervisor's owners, registered before either can come (own).
// The caller holds s.starting.
func (s *Server) startReaped(uid, gid uint32, req *launcher.Request, before uint64, known bool) (int, <-chan exitStatus, error) {
	key := [2]uint32{uid, gid}
	l := s.reapingLaunchers[key]
	if l == nil {
		if len(s.reapingLaunchers) >= maxUserLaunchers+1 { // the workload user's and maxUserLaunchers others
			for k, other := range s.reapingLaunchers {
				if k != [2]uint32{s.cfg.UID, s.cfg.GID} {
					other.Close()
					delete(s.reapingLaunchers, k)
					break
				}
			}
		}
		l = launcher.NewReaping(launcher.Config{Credential: credential(uid, gid), Nofile: s.cfg.WorkloadNofile, Stderr: os.Stderr}, s.reaped, s.orphaned)
		s.reapingLaunchers[key] = l
	}
	ch := make(chan exitStatus, 1)
	own := func(pid int) { s.sup.own(pid, ch) }
	pid, err := s.startProcess(func(req *launcher.Request) (int, error) { return l.Start(req, own) }, req, before, known)
	if err != nil {
		return 0, nil, err
	}
	return pid, ch, nil
}

// reaped hands the exit a reaping launcher reported to the process's owner.
func (s *Server) reaped(x launcher.Exit) {
	st := exitStatus{ws: unix.WaitStatus(x.Status), at: time.Now()}
	st.ru.Utime = unix.Timeval{Sec: x.Rusage.Utime.Sec, Usec: x.Rusage.Utime.Usec}
	st.ru.Stime = unix.Timeval{Sec: x.Rusage.Stime.Sec, Usec: x.Rusage.Stime.Usec}
	st.ru.Maxrss = x.Rusage.Maxrss
	s.sup.exited(x.Pid, st)
}

// orphaned settles the processes a reaping launcher started and did not
// report before it died: once the launcher has been reaped, they are the
// agent's children, which it reaps, or their status is lost (the launcher
// reaped one and died before reporting it). Not before: a zombie launcher
// may still have threads exiting that hold children of their own (Linux
// re-parents a thread's children to its live siblings first).
func (s *Server) orphaned(launcherPID int, pids []int) {
	go func() {
		for deadline := time.Now().Add(time.Minute); !isReaped(launcherPID) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		for _, pid := range s.sup.lost(pids) {
			s.log.Error("exit status lost: the launcher reaped the process and died before reporting it", "pid", pid, "launcher_pid", launcherPID, "exit_code", exitLost)
		}
	}()
}

// isReaped reports whether pid is gone: no /proc/<pid> (a zombie still
// has one).
func isReaped(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, os.ErrNotExist)
}

// exitLost is the exit code of an exec whose status was lost (lost), as
// ssh(1) exits 255 when it loses its connection.
const exitLost = 255

// lost ends, with exitLost, the owned pids among pids that are not the
// agent's children (waitid(2) WNOWAIT says ECHILD): their launcher reaped
// them and died. It returns them. The others are the agent's, which reap
// settles.
func (s *supervisor) lost(pids []int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []int
	for _, pid := range pids {
		ch, ok := s.owners[pid]
		if !ok {
			continue
		}
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		for errors.Is(err, unix.EINTR) {
			err = unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		}
		if !errors.Is(err, unix.ECHILD) {
			continue
		}
		delete(s.owners, pid)
		ch <- exitStatus{ws: unix.WaitStatus(exitLost << 8), at: time.Now()}
		gone = append(gone, pid)
	}
	return gone
}

// own registers pid's owner: a process a reaping launcher started, whose
// status comes from exited or, once its launcher died and it was
// re-parented to the agent, from reap.
func (s *supervisor) own(pid int, ch chan<- exitStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.owners[pid] = ch
}

// exited hands st, pid's exit status as its launcher reaped it, to pid's
// owner. A pid nobody owns is forgotten.
func (s *supervisor) exited(pid int, st exitStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.owners[pid]; ok {
		delete(s.owners, pid)
		ch <- st // buffered for exactly this one status
	}
}
