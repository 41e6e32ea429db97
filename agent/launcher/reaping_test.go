package launcher_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/agent/launcher"
)

// TestReapingStart runs processes through a ReapingLauncher, native and Go
// (the fallback where the native one cannot run): each is the launcher's
// child, its exit status and rusage come back through exited after its
// pid was handed to started, a missing program is an *ExecError, and a
// script without a shebang runs under /bin/sh. The native one has one
// thread.
func TestReapingStart(t *testing.T) {
	for _, binary := range []string{"", "/proc/self/exe"} { // the native launcher, the Go one
		t.Run("binary="+binary, func(t *testing.T) { testReapingStart(t, binary) })
	}
}

func testReapingStart(t *testing.T, binary string) {
	exits := make(chan launcher.Exit, 8)
	l := launcher.NewReaping(launcher.Config{Binary: binary}, func(x launcher.Exit) { exits <- x }, func(int, []int) {})
	defer l.Close()
	stdio := devNulls(t)
	run := func(path string, argv ...string) launcher.Exit {
		t.Helper()
		var started int
		pid, err := l.Start(&launcher.Request{Path: path, Argv: argv, Dir: "/", Stdio: stdio}, func(pid int) { started = pid })
		if err != nil {
			t.Fatal(err)
		}
		if started != pid {
			t.Errorf("started got pid %d, Start returned %d", started, pid)
		}
		select {
		case x := <-exits:
			if x.Pid != pid {
				t.Errorf("exit of pid %d, want %d", x.Pid, pid)
			}
			return x
		case <-time.After(30 * time.Second):
			t.Fatalf("no exit of pid %d after 30 s", pid)
			return launcher.Exit{}
		}
	}

	x := run("/bin/sh", "sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exit 7")
	if x.Status.ExitStatus() != 7 {
		t.Errorf("exit status %d, want 7", x.Status.ExitStatus())
	}
	if x.Rusage.Utime.Sec == 0 && x.Rusage.Utime.Usec == 0 || x.Rusage.Maxrss == 0 {
		t.Errorf("rusage %+v: want the loop's user time and a peak RSS", x.Rusage)
	}
	if x := run("/bin/sh", "sh", "-c", "kill -TERM $$"); !x.Status.Signaled() || x.Status.Signal() != syscall.SIGTERM {
		t.Errorf("kill -TERM $$: status %v, want killed by SIGTERM", x.Status)
	}
	_, err := l.Start(&launcher.Request{Path: "/no/such/program", Argv: []string{"x"}, Dir: "/", Stdio: stdio}, func(int) {})
	var execErr *launcher.ExecError
	if !errors.As(err, &execErr) || execErr.Errno != syscall.ENOENT {
		t.Errorf("Start of a missing program: %v, want an *ExecError with ENOENT", err)
	}
	script := t.TempDir() + "/script"
	if err := os.WriteFile(script, []byte("exit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if x := run(script, "script"); x.Status.ExitStatus() != 3 {
		t.Errorf("script without a shebang: exit status %d, want 3", x.Status.ExitStatus())
	}
	select {
	case x := <-exits:
		t.Errorf("an exit nobody started: %+v", x)
	default:
	}

	lpid := launcherPID(t)
	threads := statusField(t, lpid, "Threads")
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", lpid))
	if native := strings.HasPrefix(exe, "/memfd:"+launcher.Comm); native != (binary == "") || native && threads != "1" {
		t.Errorf("launcher %d runs %q with %s threads; want the native launcher (one thread) exactly when no binary is set (%q)", lpid, exe, threads, binary)
	}
}
