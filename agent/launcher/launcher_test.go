package launcher_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sandbox/berth/agent/launcher"
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

// TestStart runs processes through a launcher: they are this process's
// children, a missing program is an *ExecError, and a script without a
// shebang runs under /bin/sh.
func TestStart(t *testing.T) {
	l := launcher.New(launcher.Config{})
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

// BenchmarkStart measures starting `true` through the launcher and reaping
// it, beside fork+exec from this process.
func BenchmarkStart(b *testing.B) {
	stdio := devNulls(b)
	b.Run("launcher", func(b *testing.B) {
		l := launcher.New(launcher.Config{})
		defer l.Close()
		for b.Loop() {
			pid, err := l.Start(&launcher.Request{Path: "/bin/true", Argv: []string{"true"}, Dir: "/", Stdio: stdio})
			if err != nil {
				b.Fatal(err)
			}
			wait(b, pid)
		}
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
