package agent

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// lowerOOMScore lowers the agent's own oom_score_adj (proc(5)) to the
// lowest value it may set, and returns the value it has. Without
// CAP_SYS_RESOURCE a process may go down to its oom_score_adj_min, which it
// inherited (the last value a privileged writer set: containerd's shim, or
// the OCI spec's oomScoreAdj through runc); the kernel refuses anything lower
// with EACCES, so the floor is found by bisection. The agent never raises
// its score: its children get the highest from the launcher (package
// launcher).
func lowerOOMScore(log *slog.Logger) string {
	const path = "/proc/self/oom_score_adj"
	b, err := os.ReadFile(path)
	if err != nil {
		log.Warn("oom_score_adj unavailable", "err", err)
		return "unknown"
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		log.Warn("oom_score_adj unreadable", "value", string(b))
		return strings.TrimSpace(string(b))
	}
	set := func(v int) bool { return os.WriteFile(path, []byte(strconv.Itoa(v)), 0) == nil }
	// The lowest accepted value is within lo..own; own is accepted.
	lo := -1000
	for lo < own {
		mid := lo + (own-lo)/2
		if set(mid) {
			own = mid
		} else {
			lo = mid + 1
		}
	}
	set(own)
	return strconv.Itoa(own)
}

// oomCounter reads how many processes the kernel's OOM killer has killed in
// the agent's memory cgroup: the oom_kill field of memory.oom_control on
// cgroup v1 or of memory.events on cgroup v2 (kernel 4.13 and later). The
// kernel counts a kill before it sends SIGKILL (mm/oom_kill.c), so a count
// read after reaping a victim includes it.
type oomCounter struct {
	path string // empty when no counter was found

	// mu guards fd and buf: the file kept open after the first count,
	// read at offset 0 each time (a cgroup file's contents are made anew
	// by a read at offset 0). Opening, reading and closing it, three times
	// an exec, was 3 % of the agent's time in an exec round trip (issue 23).
	// A descriptor, not an *os.File: os.Open puts a cgroup file (kernfs
	// polls) in Go's poller, non-blocking, and a pread(2) of it through
	// Fd made it blocking again with fcntl(2) at every count.
	mu  sync.Mutex
	fd  int  // the counter file, when ok
	ok  bool // fd is open
	buf [512]byte
}

// findOOMCounter locates the counter file under the cgroup filesystem
// mounted at root (normally /sys/fs/cgroup), given the content of
// /proc/self/cgroup. Inside a container without a cgroup namespace, the
// container's own cgroup directory is what is mounted (runc bind-mounts it
// for cgroup v1), so the mount's top directory is tried after the path
// /proc/self/cgroup names.
func findOOMCounter(root string, procSelfCgroup []byte) *oomCounter {
	var candidates []string
	for _, cg := range cgroupsOf(procSelfCgroup) {
		switch {
		case cg.unified():
			candidates = append(candidates,
				filepath.Join(root, cg.path, "memory.events"),
				filepath.Join(root, "memory.events"))
		case containsController(cg.controllers, "memory"):
			candidates = append(candidates,
				filepath.Join(root, "memory", cg.path, "memory.oom_control"),
				filepath.Join(root, "memory", "memory.oom_control"))
		}
	}
	for _, p := range candidates {
		if _, ok := readOOMKill(p); ok {
			return &oomCounter{path: p}
		}
	}
	return &oomCounter{}
}

// cgroupLine is one line of /proc/self/cgroup:
// hierarchy-ID:controller-list:cgroup-path (cgroups(7)).
type cgroupLine struct{ id, controllers, path string }

// unified reports whether the line is cgroup v2's ("0::path").
func (cg cgroupLine) unified() bool { return cg.id == "0" && cg.controllers == "" }

// cgroupsOf returns the lines of procSelfCgroup, the content of
// /proc/self/cgroup, skipping malformed ones.
func cgroupsOf(procSelfCgroup []byte) []cgroupLine {
	var lines []cgroupLine
	sc := bufio.NewScanner(bytes.NewReader(procSelfCgroup))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 {
			lines = append(lines, cgroupLine{id: parts[0], controllers: parts[1], path: parts[2]})
		}
	}
	return lines
}

func containsController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// count returns the current number of OOM kills, and false when the agent
// has no counter.
func (c *oomCounter) count() (uint64, bool) {
	if c.path == "" {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok {
		fd, err := unix.Open(c.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, false
		}
		c.fd, c.ok = fd, true
	}
	// One pread(2): a cgroup file's contents are made whole by a read at
	// offset 0 into a buffer larger than them; os.File.ReadAt read again
	// until it met the end, a second system call each count, two an exec
	// (issue 23).
	n, err := unix.Pread(c.fd, c.buf[:], 0)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Pread(c.fd, c.buf[:], 0)
	}
	if err != nil || n == len(c.buf) {
		// A file that cannot be read so (or is longer than the counter
		// files ever are) is read whole, and opened anew next time.
		c.close()
		return readOOMKill(c.path)
	}
	return parseOOMKill(c.buf[:n])
}

// close closes the counter file, if open. The caller holds c.mu.
func (c *oomCounter) close() {
	if c.ok {
		unix.Close(c.fd)
		c.ok = false
	}
}

// readOOMKill returns the value of the "oom_kill N" line of a
// memory.oom_control or memory.events file.
func readOOMKill(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseOOMKill(b)
}

// parseOOMKill returns the value of the "oom_kill N" line of b.
func parseOOMKill(b []byte) (uint64, bool) {
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// describe names the counter for the agent's log.
func (c *oomCounter) describe() string {
	if c.path == "" {
		return "none (OOM kills are not reported; mount the cgroup filesystem read-only at /sys/fs/cgroup)"
	}
	return c.path
}

// diedOfKill reports whether a process ended as an OOM victim does: killed
// by SIGKILL, or exiting 137 as a shell does when its child was.
func diedOfKill(ws unix.WaitStatus) bool {
	return ws.Signaled() && ws.Signal() == syscall.SIGKILL ||
		ws.Exited() && ws.ExitStatus() == 128+int(syscall.SIGKILL)
}

// oomVerdict decides ExecResult.oom_killed: the exec died of SIGKILL (or
// exit 137), the cgroup's OOM kill count rose while it ran, the agent had
// not sent SIGKILL itself (for a timeout, a stop or a client's signal), and
// one of the kills counted meanwhile is not another exec's already (see
// oomLedger).
func oomVerdict(ws unix.WaitStatus, before, after uint64, known, agentKilled bool, ledger *oomLedger) bool {
	return known && !agentKilled && after > before && diedOfKill(ws) && ledger.claim(before, after)
}

// oomLedger hands each OOM kill the cgroup counts to one exec at most. The
// counter is per cgroup, so a kill in one exec rises the count seen by
// every exec running beside it; before, an exec that a kill -9 ended while
// another was OOM-killed was reported OOM-killed too. The kills are
// numbered by the count after them: an exec that started at count before
// and ended killed at count after takes the lowest kill in (before, after]
// no exec has taken. Execs are settled as their supervisors finish (after
// draining output), not strictly in the order they died, so a kill an exec
// did not take stays free for another: an exec that started after kill 1
// and died of kill 2 takes 2 even when settled first, and leaves 1 to the
// exec that died of it. A kill -9 that ended an exec after every kill was
// taken finds none. (A shell whose child was the victim exits 137 after
// the child; an exec killed in between takes the kill first.)
type oomLedger struct {
	mu    sync.Mutex
	floor uint64              // kills up to this count count as taken (forgotten)
	taken map[uint64]struct{} // kills above floor that an exec took
}

// maxOOMLedger bounds the kills the ledger remembers; past it the oldest
// are forgotten, as taken (an exec that ran through that many OOM kills may
// not find its own).
const maxOOMLedger = 4096

// claim takes a kill in (before, after] for an exec and reports whether
// there was one.
func (l *oomLedger) claim(before, after uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	// At most len(l.taken) numbers are skipped: the loop is bounded.
	for n := max(before, l.floor) + 1; n <= after; n++ {
		if _, ok := l.taken[n]; ok {
			continue
		}
		if l.taken == nil {
			l.taken = make(map[uint64]struct{})
		}
		l.taken[n] = struct{}{}
		if len(l.taken) > maxOOMLedger {
			l.forgetOldest()
		}
		return true
	}
	return false
}

// forgetOldest drops the lowest kill taken and raises floor to it.
func (l *oomLedger) forgetOldest() {
	oldest := uint64(0)
	for n := range l.taken {
		if oldest == 0 || n < oldest {
			oldest = n
		}
	}
	delete(l.taken, oldest)
	l.floor = max(l.floor, oldest)
}
