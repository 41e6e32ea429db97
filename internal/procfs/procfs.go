// Package procfs reads what berthd needs of a host process from /proc
// (proc(5)).
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// StartTimeField is the field of Stat holding the process's start time, in
// clock ticks since boot (proc(5): starttime).
const StartTimeField = 22

// Stat returns the fields of /proc/<pid>/stat numbered as proc(5) numbers
// them (fields[1] is the pid; fields[2], the command name, is left empty),
// so that fields[StartTimeField] is the start time. It fails for pid 0, a
// process that is gone, and a line too short.
func Stat(pid uint32) ([]string, error) {
	if pid == 0 {
		return nil, errors.New("no pid")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command name, field 2, is in parentheses and may hold spaces and
	// parentheses itself: fields are counted after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := append([]string{"", strconv.FormatUint(uint64(pid), 10), ""}, strings.Fields(string(b[i+1:]))...)
	if len(fields) <= StartTimeField {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)-1)
	}
	return fields, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's starttime: 100 on
// every Linux architecture berth runs on (proc(5)).
const clockTicks = 100

// bootTime is when the host booted, to the nanosecond: the wall clock less
// CLOCK_BOOTTIME, the clock /proc/<pid>/stat's starttime counts on
// (proc(5)), taken once so that a runtime's start time reads the same every
// time. /proc/stat's btime has whole seconds only, which put start times up
// to a second early — before events they followed.
var bootTime = sync.OnceValues(func() (time.Time, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, fmt.Errorf("clock_gettime(CLOCK_BOOTTIME): %w", err)
	}
	return time.Now().Add(-time.Duration(ts.Nano())), nil
})

// StartTime returns when host process pid started: boot time plus
// field 22 (starttime, in clock ticks) of /proc/<pid>/stat (proc(5)). Its
// resolution is a clock tick (10 ms), rounded down.
func StartTime(pid uint32) (time.Time, error) {
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, err
	}
	fields, err := Stat(pid)
	if err != nil {
		return time.Time{}, err
	}
	ticks, err := strconv.ParseUint(fields[StartTimeField], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat starttime: %w", pid, err)
	}
	return boot.Add(time.Duration(ticks) * (time.Second / clockTicks)), nil
}

// CPU returns the CPU time host process pid has used in its current
// threads, to the nanosecond: the sum of the first field of
// /proc/<pid>/task/<tid>/schedstat (run time, ns), falling back to fields
// 14 and 15 (utime, stime: 10 ms ticks) of /proc/<pid>/stat (proc(5)). A
// thread that exits takes its time with it, so only a change means work.
func CPU(pid uint32) (time.Duration, error) {
	if pid == 0 {
		return 0, errors.New("no pid")
	}
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		var sum uint64
		read := 0
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				if ns, err := strconv.ParseUint(f[0], 10, 64); err == nil {
					sum += ns
					read++
				}
			}
		}
		if read > 0 {
			return time.Duration(sum), nil
		}
	}
	fields, err := Stat(pid)
	if err != nil {
		return 0, err
	}
	const utime, stime = 14, 15
	u, err1 := strconv.ParseUint(fields[utime], 10, 64)
	s, err2 := strconv.ParseUint(fields[stime], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat utime, stime: %w", pid, err)
	}
	return time.Duration(u+s) * (time.Second / clockTicks), nil
}

// ThreadStates returns the state (field 3 of /proc/<pid>/task/<tid>/stat,
// proc(5): R, S, D, T, ...) of each thread of host process pid; none for
// pid 0 and a process that is gone.
func ThreadStates(pid uint32) []byte {
	if pid == 0 {
		return nil
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	states := make([]byte, 0, len(tasks))
	for _, task := range tasks {
		if state, ok := stateOf(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name())); ok {
			states = append(states, state)
		}
	}
	return states
}

// stateOf returns the state, field 3, of the stat file at path (proc(5)),
// read into a buffer on the stack: the exec path asks once an exec
// (Stopped). The state follows the command name's last ')'; the name is
// at most 64 bytes (a kernel thread's, TASK_COMM_LEN for others) and the
// fields after it hold no ')', so the line's first 256 bytes hold both.
func stateOf(path string) (byte, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var buf [256]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return 0, false
	}
	b := buf[:n]
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2], true
	}
	return 0, false
}

// WorkingState reports whether a thread in state (field 3 of
// /proc/<pid>/stat, proc(5)) makes progress or waits only for the host:
// R (running or runnable) and D (uninterruptible sleep).
func WorkingState(state byte) bool {
	return state == 'R' || state == 'D'
}

// CgroupCPU returns the CPU time the processes of host process pid's cgroup
// have used, plus the time the cgroup's CPU limit held them back
// (throttled): a sum that grows while any process of the cgroup runs or
// wants to. It reads cgroup v2's cpu.stat (usage_usec, throttled_usec) or,
// on cgroup v1, cpuacct.usage (ns) and the cpu controller's cpu.stat
// (throttled_time, ns), under /sys/fs/cgroup, at the path
// /proc/<pid>/cgroup names (cgroups(7)). The throttled time is left out
// where the cpu controller has none. It fails for pid 0, a process that is
// gone, and a cgroup whose files cannot be read.
func CgroupCPU(pid uint32) (time.Duration, error) {
	files, err := CgroupCPUFilesOf(pid)
	if err != nil {
		return 0, err
	}
	return files.Read()
}

// CgroupCPUFiles are the files CgroupCPU reads for one cgroup: found once
// from /proc/<pid>/cgroup (CgroupCPUFilesOf), they serve every later
// reading of the same process's cgroup (Read), which berthd takes once an
// exec.
type CgroupCPUFiles struct {
	usage     string // cgroup v1's cpuacct.usage, or v2's cpu.stat
	throttled string // v1: the cpu controller's cpu.stat; "" when none
	v2        bool
}

// CgroupDirs are the directories of a host process's cgroups under
// /sys/fs/cgroup, as /proc/<pid>/cgroup names them (cgroups(7): lines of
// hierarchy-ID:controller-list:cgroup-path).
type CgroupDirs struct {
	// V1 holds, by cgroup v1 controller ("cpuacct", "freezer", ...), the
	// directory of the process's cgroup in that controller's hierarchy,
	// e.g. /sys/fs/cgroup/cpu,cpuacct/berth/sb-1.
	V1 map[string]string
	// Unified is the directory of its cgroup v2 cgroup, "" when it is in
	// none.
	Unified string
}

// CgroupDirsOf reads host process pid's cgroup directories. It fails for
// pid 0 and a process that is gone.
func CgroupDirsOf(pid uint32) (CgroupDirs, error) {
	if pid == 0 {
		return CgroupDirs{}, errors.New("no pid")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return CgroupDirs{}, err
	}
	d := CgroupDirs{V1: make(map[string]string)}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			d.Unified = "/sys/fs/cgroup" + parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			d.V1[c] = "/sys/fs/cgroup/" + parts[1] + parts[2]
		}
	}
	return d, nil
}

// CgroupCPUFilesOf finds the files CgroupCPU reads for host process pid's
// cgroup. It fails for pid 0, a process that is gone, and a
// /proc/<pid>/cgroup that names neither a cpuacct nor a cgroup v2
// hierarchy.
func CgroupCPUFilesOf(pid uint32) (CgroupCPUFiles, error) {
	d, err := CgroupDirsOf(pid)
	if err != nil {
		return CgroupCPUFiles{}, err
	}
	if acct, ok := d.V1["cpuacct"]; ok {
		f := CgroupCPUFiles{usage: acct + "/cpuacct.usage"}
		if cpu, ok := d.V1["cpu"]; ok {
			f.throttled = cpu + "/cpu.stat"
		}
		return f, nil
	}
	if d.Unified == "" {
		return CgroupCPUFiles{}, fmt.Errorf("/proc/%d/cgroup names neither a cpuacct nor a cgroup v2 hierarchy", pid)
	}
	return CgroupCPUFiles{usage: d.Unified + "/cpu.stat", v2: true}, nil
}

// Read returns the cgroup's CPU time plus its throttled time, as
// CgroupCPU: the files are read into a buffer on the stack, with no
// os.File, one or two system calls each. It fails when the usage cannot be
// read (the cgroup is gone).
func (f CgroupCPUFiles) Read() (time.Duration, error) {
	usage, err := f.Usage()
	if err != nil {
		return 0, err
	}
	var throttled uint64
	switch {
	case f.v2:
		throttled, _ = statField(f.usage, "throttled_usec")
		throttled *= uint64(time.Microsecond)
	case f.throttled != "":
		throttled, _ = statField(f.throttled, "throttled_time")
	}
	return usage + time.Duration(throttled), nil
}

// Usage returns the CPU time the cgroup's processes have used, without
// the time its CPU limit held them back: cpuacct.usage, or cgroup v2's
// usage_usec.
func (f CgroupCPUFiles) Usage() (time.Duration, error) {
	if f.v2 {
		usage, err := statField(f.usage, "usage_usec")
		return time.Duration(usage) * time.Microsecond, err
	}
	var buf [64]byte
	b, err := readSmall(f.usage, buf[:])
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f.usage, err)
	}
	return time.Duration(ns), nil
}

// readSmall reads the file at path into buf, which must hold all of it
// (the small /proc and cgroup files above), and returns what it read.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
	return nil, fmt.Errorf("%s: longer than %d bytes", path, len(buf))
}

// statField returns the value of key in a cgroup file of "key value" lines
// (cpu.stat).
func statField(file, key string) (uint64, error) {
	// cpu.stat: a few lines (v1: 3 to 6, v2: up to a dozen).
	var buf [1024]byte
	b, err := readSmall(file, buf[:])
	if err != nil {
		return 0, err
	}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		if k, v, ok := bytes.Cut(line, []byte(" ")); ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %s: %w", file, key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s has no %s", file, key)
}

// ChildrenNamed returns the children of host process pid whose command
// name (/proc/<child>/comm) is comm, found in /proc/<pid>/task/*/children
// (proc(5): each thread lists the children it forked). A process that is
// gone has none.
func ChildrenNamed(pid uint32, comm string) []uint32 {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var pids []uint32
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, child := range strings.Fields(string(b)) {
			n, err := strconv.ParseUint(child, 10, 32)
			if err != nil {
				continue
			}
			if c, err := os.ReadFile("/proc/" + child + "/comm"); err == nil && strings.TrimSpace(string(c)) == comm {
				pids = append(pids, uint32(n))
			}
		}
	}
	return pids
}

// Stopped reports whether host process pid is stopped by a signal
// (state T, or t when traced, in its stat file, proc(5); see leaderStat).
func Stopped(pid uint32) bool {
	if pid == 0 {
		return false
	}
	state, ok := stateOf(leaderStat(pid))
	return ok && (state == 'T' || state == 't')
}

// leaderStat returns the path of the stat file of process pid's main
// thread, /proc/<pid>/task/<pid>/stat. Its state is the one
// /proc/<pid>/stat shows, which is the main thread's too (fs/proc/array.c,
// do_task_stat), and it goes with the process when it is reaped; the
// process's own file also sums the CPU times and faults of every thread
// to make, which the exec path, asking twice an exec for an agent of some
// 20 threads, does not need (issue 23).
func leaderStat(pid uint32) string {
	n := strconv.FormatUint(uint64(pid), 10)
	return "/proc/" + n + "/task/" + n + "/stat"
}

// Exited reports whether host process pid has exited: its stat file
// (leaderStat) does not exist (ENOENT, ESRCH), or its state is Z (a zombie
// not yet reaped) or X (dead), proc(5). Any other failure to read it
// (EMFILE) is not taken for an exit.
func Exited(pid uint32) bool {
	if pid == 0 {
		return false
	}
	path := leaderStat(pid)
	state, ok := stateOf(path)
	if !ok {
		_, err := os.Stat(path)
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	return state == 'Z' || state == 'X'
}

// ProcessID returns host process pid as "<pid>:<start time>" (the start
// time in clock ticks since boot, field StartTimeField of Stat): a name
// that a pid reused by a later process does not share. It returns "" when
// the process is gone.
func ProcessID(pid int) string {
	if pid <= 0 {
		return ""
	}
	fields, err := Stat(uint32(pid))
	if err != nil {
		return ""
	}
	return strconv.Itoa(pid) + ":" + fields[StartTimeField]
}

// Running reports whether the process a ProcessID names still runs on this
// host: its pid names a process that started at the same time.
func Running(id string) bool {
	pid, _, _ := strings.Cut(id, ":")
	p, err := strconv.Atoi(pid)
	return err == nil && p > 0 && ProcessID(p) == id
}
