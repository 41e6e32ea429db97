package procfs

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStat reads this process (whose command name a parser splitting on
// spaces would miscount when it holds some) and refuses what is no process.
func TestStat(t *testing.T) {
	fields, err := Stat(uint32(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	if fields[1] != strconv.Itoa(os.Getpid()) {
		t.Errorf("fields[1] = %q, want the pid", fields[1])
	}
	if _, err := strconv.ParseUint(fields[StartTimeField], 10, 64); err != nil {
		t.Errorf("start time %q: %v", fields[StartTimeField], err)
	}
	// A command name with spaces and a parenthesis.
	link := t.TempDir() + "/a b) c"
	if err := os.Symlink("/bin/sleep", link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(link, "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if f, err := Stat(uint32(cmd.Process.Pid)); err != nil || f[1] != strconv.Itoa(cmd.Process.Pid) {
		t.Errorf("Stat of a command named %q = %v, %v", "a b) c", f, err)
	} else if _, err := strconv.ParseUint(f[StartTimeField], 10, 64); err != nil {
		t.Errorf("start time of %q: %q", "a b) c", f[StartTimeField])
	}
	for _, pid := range []uint32{0, 1 << 30} {
		if _, err := Stat(pid); err == nil {
			t.Errorf("Stat(%d) succeeded", pid)
		}
	}
}

// TestStartTime starts a process between two readings of the clock:
// its start time lies between them, less one clock tick (10 ms) of
// rounding down — not a second early, as with /proc/stat's btime, which
// put a new runtime's started_at before the old task's exit.
func TestStartTime(t *testing.T) {
	before := time.Now()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	got, err := StartTime(uint32(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if got.Before(before.Add(-time.Second/clockTicks)) || got.After(after) {
		t.Errorf("start time of a process started between %v and %v = %v", before, after, got)
	}
	if _, err := StartTime(0); err == nil {
		t.Error("StartTime(0) succeeded")
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Error("StartTime(no such pid) succeeded")
	}
}

// TestProcessID checks that a process's id names it while it runs, and no
// longer once it exited (its pid may be another process's then).
func TestProcessID(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id := ProcessID(cmd.Process.Pid)
	fields, err := Stat(uint32(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(cmd.Process.Pid) + ":" + fields[StartTimeField]; id != want {
		t.Errorf("ProcessID(%d) = %q, want %q", cmd.Process.Pid, id, want)
	}
	if !Running(id) {
		t.Errorf("Running(%q) = false for a running process", id)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if Running(id) {
		t.Errorf("Running(%q) = true after the process exited", id)
	}
	for _, id := range []string{"", "x", "0:1", strconv.Itoa(os.Getpid()) + ":1"} {
		if Running(id) {
			t.Errorf("Running(%q) = true", id)
		}
	}
}

// TestCgroupCPU reads this process's cgroup (v1 cpuacct or v2 cpu.stat):
// the time grows while this process burns CPU, and pid 0 or a gone
// process fail.
func TestCgroupCPU(t *testing.T) {
	pid := uint32(os.Getpid())
	before, err := CgroupCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
		after, err := CgroupCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cgroup's CPU time stayed %v through 5 s of burning CPU", before)
		}
	}
	for _, pid := range []uint32{0, 1 << 30} {
		if _, err := CgroupCPU(pid); err == nil {
			t.Errorf("CgroupCPU(%d) succeeded", pid)
		}
	}
}

// TestCgroupCPUFiles: the files found once for this process's cgroup read
// the same counter as CgroupCPU, growing as it does (Usage: without the
// throttled time, no more than Read after it), with at most two
// allocations a reading (the exec path reads them once an exec); files of
// no cgroup fail to read, and readSmall refuses a file longer than its
// buffer rather than cut it.
func TestCgroupCPUFiles(t *testing.T) {
	pid := uint32(os.Getpid())
	files, err := CgroupCPUFilesOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	first, err := files.Read()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := CgroupCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	second, err := files.Read()
	if err != nil {
		t.Fatal(err)
	}
	if first <= 0 || whole < first || second < whole {
		t.Errorf("Read %v, CgroupCPU %v, Read %v: want positive and never decreasing", first, whole, second)
	}
	usage, err := files.Usage()
	if err != nil {
		t.Fatal(err)
	}
	third, err := files.Read()
	if err != nil {
		t.Fatal(err)
	}
	if usage <= 0 || third < usage {
		t.Errorf("Usage %v, then Read %v: want positive usage, and Read (usage + throttled) no less", usage, third)
	}
	if allocs := testing.AllocsPerRun(20, func() { files.Read() }); allocs > 2 {
		t.Errorf("Read: %.0f allocations, want at most 2", allocs)
	}
	if _, err := (CgroupCPUFiles{}).Read(); err == nil {
		t.Error("Read of no files succeeded")
	}
	if _, err := CgroupCPUFilesOf(0); err == nil {
		t.Error("CgroupCPUFilesOf(0) succeeded")
	}
	var small [8]byte
	if b, err := readSmall("/proc/self/status", small[:]); err == nil {
		t.Errorf("readSmall of /proc/self/status into 8 bytes = %q, want an error", b)
	}
}

// TestCgroupDirs: this process's cgroup directories are directories
// holding their controller's files (cpuacct.usage; freezer.state but in a
// hierarchy's root cgroup, which cannot be frozen; cgroup.controllers in
// the unified hierarchy), and each lists this process; pid 0 fails.
func TestCgroupDirs(t *testing.T) {
	pid := os.Getpid()
	d, err := CgroupDirsOf(uint32(pid))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.V1) == 0 && d.Unified == "" {
		t.Fatalf("CgroupDirsOf(self) = %+v: no cgroup", d)
	}
	check := func(dir, file string) {
		t.Helper()
		if _, err := os.Stat(dir + "/" + file); err != nil {
			t.Errorf("cgroup directory %s: %v", dir, err)
		}
		procs, err := os.ReadFile(dir + "/cgroup.procs")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
			t.Errorf("%s/cgroup.procs does not list this process (%d)", dir, pid)
		}
	}
	for c, file := range map[string]string{"cpuacct": "cpuacct.usage", "freezer": "freezer.state"} {
		if dir, ok := d.V1[c]; ok {
			if c == "freezer" && strings.HasSuffix(dir, "/") {
				file = "cgroup.procs"
			}
			check(dir, file)
		}
	}
	if d.Unified != "" && len(d.V1) == 0 {
		check(d.Unified, "cgroup.controllers")
	}
	if _, err := CgroupDirsOf(0); err == nil {
		t.Error("CgroupDirsOf(0) succeeded")
	}
}

// TestThreadStates: a process sleeping in a signal-stopped state shows T,
// this one (running the test) shows R among its threads, and a gone
// process has none; WorkingState counts R and D only.
func TestThreadStates(t *testing.T) {
	if states := ThreadStates(uint32(os.Getpid())); !bytes.ContainsRune(states, 'R') {
		t.Errorf("states of this running process = %q, want an R", states)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for string(ThreadStates(uint32(cmd.Process.Pid))) != "T" {
		if time.Now().After(deadline) {
			t.Fatalf("states of a stopped sleep = %q, want T", ThreadStates(uint32(cmd.Process.Pid)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if states := ThreadStates(0); len(states) != 0 {
		t.Errorf("ThreadStates(0) = %q", states)
	}
	for state, want := range map[byte]bool{'R': true, 'D': true, 'S': false, 'T': false, 't': false, 'Z': false, 'I': false} {
		if WorkingState(state) != want {
			t.Errorf("WorkingState(%c) = %v, want %v", state, !want, want)
		}
	}
}

// TestStopped: a process stopped by a signal is stopped, a running or
// sleeping one and no process are not; and Stopped, which the exec path
// calls once an exec (agentreach's proven connection), reads the state
// without building Stat's fields (at most 3 allocations, not 13 and 4 KB).
func TestStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := uint32(cmd.Process.Pid)
	if Stopped(pid) {
		t.Errorf("Stopped(sleeping process) = true, want false")
	}
	if Stopped(uint32(os.Getpid())) || Stopped(0) {
		t.Errorf("Stopped(this process) or Stopped(0) = true, want false")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !Stopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("Stopped(process sent SIGSTOP) = false after 5 s, want true")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if allocs := testing.AllocsPerRun(100, func() { Stopped(pid) }); allocs > 3 {
		t.Errorf("Stopped allocates %.0f times a call, want at most 3", allocs)
	}
}

// TestExited: a running process has not exited; once it exits it has,
// as a zombie not yet reaped and once reaped (its stat file gone); no
// process (pid 0) has not.
func TestExited(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	if Exited(pid) || Exited(uint32(os.Getpid())) || Exited(0) {
		t.Fatalf("Exited(running process), Exited(this process) or Exited(0) = true, want false")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie, state Z.
	deadline := time.Now().Add(5 * time.Second)
	for !Exited(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("Exited(killed process, not reaped) = false after 5 s, want true")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if state, ok := stateOf("/proc/" + strconv.Itoa(int(pid)) + "/stat"); !ok || state != 'Z' {
		t.Errorf("state of the killed process in /proc/%d/stat = %q (read %v), want Z", pid, state, ok)
	}
	_ = cmd.Wait()
	if !Exited(pid) {
		t.Errorf("Exited(reaped process) = false, want true")
	}
}

// TestChildrenNamed finds this process's sleep children by their command
// name and nothing for another name or a process that is gone.
func TestChildrenNamed(t *testing.T) {
	var want []uint32
	for range 2 {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		want = append(want, uint32(cmd.Process.Pid))
	}
	self := uint32(os.Getpid())
	got := ChildrenNamed(self, "sleep")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ChildrenNamed(this process, sleep) = %v, want %v", got, want)
	}
	if got := ChildrenNamed(self, "sleeper"); len(got) != 0 {
		t.Errorf("ChildrenNamed(this process, sleeper) = %v, want none", got)
	}
	if got := ChildrenNamed(0, "sleep"); len(got) != 0 {
		t.Errorf("ChildrenNamed(0, sleep) = %v, want none", got)
	}
}
