package launcher_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/procfs"
)

// devNulls returns /dev/null three times as a process's stdio.
func devNulls(tb testing.TB) [3]*os.File {
	tb.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return [3]*os.File{f, f, f}
}

// wait reaps pid, a child of this process (CLONE_PARENT), and returns its
// status.
func wait(tb testing.TB, pid int) syscall.WaitStatus {
	tb.Helper()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			tb.Fatalf("wait4(%d): %v", pid, err)
		}
		return ws
	}
}

// TestStart runs processes through a launcher, native and Go: they are this process's
// children, a missing program is an *ExecError, and a script without a
// shebang runs under /bin/sh.
func TestStart(t *testing.T) {
	for _, binary := range []string{"", "/proc/self/exe"} { // the native launcher, the Go one
		t.Run("binary="+binary, func(t *testing.T) { testStart(t, binary) })
	}
}

func testStart(t *testing.T, binary string) {
	l := launcher.New(launcher.Config{Binary: binary})
	defer l.Close()
	stdio := devNulls(t)
	pid, err := l.Start(&launcher.Request{Path: "/bin/sh", Argv: []string{"sh", "-c", "exit 7"}, Dir: "/", Stdio: stdio})
	if err != nil {
		t.Fatal(err)
	}
	if ws := wait(t, pid); ws.ExitStatus() != 7 {
		t.Errorf("exit status %d, want 7", ws.ExitStatus())
	}
	_, err = l.Start(&launcher.Request{Path: "/no/such/program", Argv: []string{"x"}, Dir: "/", Stdio: stdio})
	var execErr *launcher.ExecError
	if !errors.As(err, &execErr) || execErr.Errno != syscall.ENOENT {
		t.Errorf("Start of a missing program: %v, want an *ExecError with ENOENT", err)
	}
	script := t.TempDir() + "/script"
	if err := os.WriteFile(script, []byte("exit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pid, err = l.Start(&launcher.Request{Path: script, Argv: []string{"script"}, Dir: "/", Stdio: stdio})
	if err != nil {
		t.Fatal(err)
	}
	if ws := wait(t, pid); ws.ExitStatus() != 3 {
		t.Errorf("script without a shebang: exit status %d, want 3", ws.ExitStatus())
	}
}

// TestStartNative checks, as this process's user and as nobody (the
// memfd is executed after the launcher switched to the workload user),
// that a Launcher runs the native launcher by
// default (no Go runtime: one thread, executed from its memfd) and that a
// process it starts leads its own process group, is this process's child
// (CLONE_PARENT) and is born with oom_score_adj 1000 while the launcher
// keeps this process's score.
func TestStartNative(t *testing.T) {
	t.Run("agent's user", func(t *testing.T) { testStartNative(t, nil) })
	if os.Getuid() == 0 {
		// The memfd is executed after the switch to the workload user.
		t.Run("nobody", func(t *testing.T) { testStartNative(t, &syscall.Credential{Uid: 65534, Gid: 65534}) })
	}
}

func testStartNative(t *testing.T, cred *syscall.Credential) {
	l := launcher.New(launcher.Config{Credential: cred})
	defer l.Close()
	pid, err := l.Start(&launcher.Request{Path: "/bin/sleep", Argv: []string{"sleep", "60"}, Dir: "/", Stdio: devNulls(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		wait(t, pid)
	}()
	lpid := launcherPID(t)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", lpid))
	if err != nil || !strings.HasPrefix(exe, "/memfd:"+launcher.Comm) {
		t.Errorf("launcher %d runs %q (%v), want the native launcher's memfd /memfd:%s", lpid, exe, err, launcher.Comm)
	}
	if threads := statusField(t, lpid, "Threads"); threads != "1" {
		t.Errorf("launcher has %s threads, want 1 (no Go runtime)", threads)
	}
	if uid := strings.Fields(statusField(t, pid, "Uid"))[0]; cred != nil && uid != strconv.Itoa(int(cred.Uid)) {
		t.Errorf("process runs as uid %s, want %d", uid, cred.Uid)
	}
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("process group %d (%v), want its own, %d", pgid, err, pid)
	}
	if ppid := statusField(t, pid, "PPid"); ppid != strconv.Itoa(os.Getpid()) {
		t.Errorf("parent %s, want this process %d (CLONE_PARENT)", ppid, os.Getpid())
	}
	own, _ := os.ReadFile("/proc/self/oom_score_adj")
	for p, want := range map[int]string{pid: strconv.Itoa(launcher.OOMScoreAdj), lpid: strings.TrimSpace(string(own))} {
		got, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", p))
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("oom_score_adj of %d = %q (%v), want %s", p, got, err, want)
		}
	}
}

// launcherPID returns the pid of this process's running launcher (its
// child named launcher.Comm that is not a zombie: a launcher closed
// earlier and not reaped).
func launcherPID(tb testing.TB) int {
	tb.Helper()
	lists, _ := filepath.Glob("/proc/self/task/*/children")
	for _, list := range lists {
		b, _ := os.ReadFile(list)
		for _, field := range strings.Fields(string(b)) {
			comm, _ := os.ReadFile("/proc/" + field + "/comm")
			pid, _ := strconv.Atoi(field)
			if strings.TrimSpace(string(comm)) == launcher.Comm && !strings.HasPrefix(statusField(tb, pid, "State"), "Z") {
				return pid
			}
		}
	}
	tb.Fatal("no launcher among this process's children")
	return 0
}

// statusField returns the value of field in /proc/<pid>/status.
func statusField(tb testing.TB, pid int, field string) string {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// TestStartLargeRequest starts a process whose environment (800 KB) is far
// larger than the launcher socket's buffer: the request, sent with its
// descriptors in one sendmsg(2) as far as the socket takes it, arrives
// whole with the rest written after.
func TestStartLargeRequest(t *testing.T) {
	l := launcher.New(launcher.Config{})
	defer l.Close()
	const n, size = 8, 100 << 10
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("BIG%d=%s", i, strings.Repeat(string(rune('a'+i)), size))
	}
	check := fmt.Sprintf(`for v in "$BIG0" "$BIG7"; do [ ${#v} -eq %d ] || exit 1; done; case "$BIG7" in hhh*hhh) exit 0;; esac; exit 2`, size)
	pid, err := l.Start(&launcher.Request{Path: "/bin/sh", Argv: []string{"sh", "-c", check}, Env: env, Dir: "/", Stdio: devNulls(t)})
	if err != nil {
		t.Fatal(err)
	}
	if ws := wait(t, pid); ws.ExitStatus() != 0 {
		t.Errorf("exit status %d, want 0 (1: a variable of the wrong length, 2: of the wrong content)", ws.ExitStatus())
	}
}

// TestStartLauncherDies runs a "launcher" that exits at once (/bin/true):
// each Start fails with ErrNoAnswer and ErrDied, naming the launcher's
// pid and its death rather than a bare "EOF", and runs a new launcher.
func TestStartLauncherDies(t *testing.T) {
	l := launcher.New(launcher.Config{Binary: "/bin/true"})
	defer l.Close()
	stdio := devNulls(t)
	for i := range 2 {
		_, err := l.Start(&launcher.Request{Path: "/bin/true", Argv: []string{"true"}, Dir: "/", Stdio: stdio})
		if !errors.Is(err, launcher.ErrNoAnswer) || !errors.Is(err, launcher.ErrDied) {
			t.Fatalf("start %d from a launcher that exits: %v, want ErrNoAnswer and ErrDied", i, err)
		}
		if msg := err.Error(); !regexp.MustCompile(`^launcher pid [0-9]+ died before answering \(.+\)$`).MatchString(msg) {
			t.Errorf("start %d: error %q, want \"launcher pid N died before answering (cause)\"", i, msg)
		}
	}
}

// launcherCPU returns the CPU time used so far by the running launcher,
// this process's child whose command name is launcher.Comm and that is
// not a zombie (a launcher closed earlier and not reaped): the run time of
// its threads (procfs.CPU).
func launcherCPU(tb testing.TB) time.Duration {
	tb.Helper()
	lists, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		tb.Fatal(err)
	}
	for _, list := range lists {
		b, _ := os.ReadFile(list)
		for _, field := range strings.Fields(string(b)) {
			pid, err := strconv.ParseUint(field, 10, 32)
			if err != nil {
				tb.Fatal(err)
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			stat, err := procfs.Stat(uint32(pid))
			if strings.TrimSpace(string(comm)) != launcher.Comm || err != nil || stat[3] == "Z" {
				continue
			}
			cpu, err := procfs.CPU(uint32(pid))
			if err != nil {
				tb.Fatal(err)
			}
			return cpu
		}
	}
	tb.Fatal("no launcher among this process's children")
	return 0
}

// BenchmarkStart measures starting `true` through the launcher and reaping
// it, beside fork+exec from this process. The launcher's side reports the
// CPU time the launcher process used per start (launcher-us/op: its fork
// and, for the Go launcher, its runtime's threads; not the process
// started). The launcher is the native one, or BERTH_TEST_LAUNCHER's
// program (/proc/self/exe: the Go launcher) to compare.
func BenchmarkStart(b *testing.B) {
	stdio := devNulls(b)
	b.Run("launcher", func(b *testing.B) {
		l := launcher.New(launcher.Config{Binary: os.Getenv("BERTH_TEST_LAUNCHER")})
		defer l.Close()
		start := func() {
			pid, err := l.Start(&launcher.Request{Path: "/bin/true", Argv: []string{"true"}, Dir: "/", Stdio: stdio})
			if err != nil {
				b.Fatal(err)
			}
			wait(b, pid)
		}
		start() // the launcher runs from here on
		before := launcherCPU(b)
		n := 0
		for b.Loop() {
			start()
			n++
		}
		b.ReportMetric(float64((launcherCPU(b)-before).Microseconds())/float64(n), "launcher-us/op")
	})
	b.Run("forkexec", func(b *testing.B) {
		fds := []uintptr{stdio[0].Fd(), stdio[1].Fd(), stdio[2].Fd()}
		for b.Loop() {
			pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Dir: "/", Files: fds, Sys: &syscall.SysProcAttr{Setpgid: true}})
			if err != nil {
				b.Fatal(err)
			}
			wait(b, pid)
		}
	})
}
