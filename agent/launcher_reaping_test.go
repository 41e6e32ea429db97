package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/agentbin"
)

// reapingLauncherPID returns the agent's launcher, failing unless it is a
// reaping one (its last argument "reap").
func reapingLauncherPID(t *testing.T, agent int) int {
	t.Helper()
	lp := agentbin.LauncherPID(agent)
	if lp == 0 {
		t.Fatal("no launcher among the agent's children")
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", lp))
	if !strings.HasSuffix(string(cmdline), "\x00reap\x00") {
		t.Fatalf("launcher %d runs %q, want a reaping launcher (last argument reap)", lp, cmdline)
	}
	return lp
}

// gone waits up to 30 s until pid no longer exists (reaped, not a zombie).
func gone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
	}
	t.Fatalf("pid %d still exists (or is an unreaped zombie) after 30 s", pid)
}

// TestReapingLauncher runs the agent with --reaping-launcher, the mode a
// gVisor sandbox gets (its kernel ignores CLONE_PARENT), on the host: the
// process is the launcher's child, its exit code, signal and CPU time come
// from the launcher's report, and what the runc path guarantees holds (OOM
// score, descriptor limit, the group killed on timeout). A launcher killed
// while an exec runs loses nothing: the exec ends with its own exit code
// (the agent reaps the orphan) and the next exec gets a new launcher.
// Concurrent execs each get their own status; a daemon an exec forks
// outlives it and is reaped when it ends.
func TestReapingLauncher(t *testing.T) {
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := startAgentCmd(t, dir, []string{"prlimit", "--nofile=512:4096", "--"}, "--reaping-launcher", "--workload-nofile", "777", "--kill-grace", "300ms")

	r := a.run(t, execID(t), shell(`echo $PPID; cat /proc/self/oom_score_adj; ulimit -Sn; grep SigBlk /proc/self/status; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exit 3`))
	lp := reapingLauncherPID(t, a.pid)
	// The launcher blocks SIGCHLD (it reads it from a signalfd); its
	// children must not inherit that mask.
	if got, want := string(r.stdout), fmt.Sprintf("%d\n1000\n777\nSigBlk:\t0000000000000000\n", lp); got != want {
		t.Errorf("parent, oom_score_adj, soft nofile, blocked signals = %q, want %q (the launcher's child)", got, want)
	}
	// The native launcher (no Go runtime: one thread, run from its memfd).
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", lp)); err != nil || !strings.HasPrefix(exe, "/memfd:berth-launcher") {
		t.Errorf("reaping launcher %d runs %q (%v), want the native launcher's memfd", lp, exe, err)
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", lp)); err != nil || !strings.Contains(string(status), "\nThreads:\t1\n") {
		t.Errorf("reaping launcher %d: want 1 thread (no Go runtime), status %q (%v)", lp, status, err)
	}
	if got := r.result.GetExitCode(); got != 3 {
		t.Errorf("exit code = %d, want 3", got)
	}
	if r.result.GetUserCpu().AsDuration() <= 0 || r.result.GetMaxRssBytes() == 0 {
		t.Errorf("user_cpu %v, max_rss_bytes %d: want the loop's CPU time and a peak RSS from the launcher's rusage",
			r.result.GetUserCpu().AsDuration(), r.result.GetMaxRssBytes())
	}

	t.Run("signal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		id := execID(t)
		stream := a.startExec(t, ctx, id, argv("sleep", "100"))
		run := &execRun{}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		run.recvEvent(t, resp)
		killExec(t, a, id)
		collect(t, stream, run)
		if got := run.result; got.GetExitCode() != 137 || got.GetSignal() != "SIGKILL" {
			t.Errorf("result = %v, want exit 137, SIGKILL", got)
		}
	})

	t.Run("timeout kills the group", func(t *testing.T) {
		spec := shell(`sh -c 'trap "" TERM; echo $$; exec sleep 100' & wait`)
		spec.Timeout = durationpb.New(time.Second)
		r := a.run(t, execID(t), spec)
		if !r.result.GetTimedOut() || r.result.GetExitCode() != 143 {
			t.Errorf("result = %v, want timed out, exit 143", r.result)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
		if err != nil {
			t.Fatalf("stdout %q: want the grandchild's pid", r.stdout)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kill(%d, 0) after the result = %v, want ESRCH: the grandchild survived", pid, err)
		}
	})

	t.Run("launcher killed mid-exec", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		flag := filepath.Join(dir, "go")
		stream := a.startExec(t, ctx, execID(t), shell(fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.02; done; exit 7`, flag)))
		run := &execRun{}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		run.recvEvent(t, resp)
		lp := reapingLauncherPID(t, a.pid)
		if err := syscall.Kill(lp, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone(t, lp)
		if err := os.WriteFile(flag, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		collect(t, stream, run)
		if got := run.result.GetExitCode(); got != 7 {
			t.Errorf("exec whose launcher was killed: result %v, want exit 7", run.result)
		}
		next := a.run(t, execID(t)+"-next", shell(`echo $PPID`))
		if next.result.GetExitCode() != 0 {
			t.Fatalf("exec after the kill: %v", next.result)
		}
		if now := reapingLauncherPID(t, a.pid); now == lp || string(next.stdout) != fmt.Sprintf("%d\n", now) {
			t.Errorf("exec after the kill ran from %q, launcher %d; want a new launcher (was %d)", next.stdout, now, lp)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		const n = 16
		runs := make([]*execRun, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				runs[i] = a.run(t, fmt.Sprintf("%s-%d", execID(t), i), shell(fmt.Sprintf(`echo %d; exit %d`, i, i+10)))
			})
		}
		wg.Wait()
		for i, r := range runs {
			if r.result.GetExitCode() != int32(i+10) || string(r.stdout) != fmt.Sprintf("%d\n", i) {
				t.Errorf("exec %d: stdout %q, exit %d; want %q, %d", i, r.stdout, r.result.GetExitCode(), fmt.Sprintf("%d\n", i), i+10)
			}
		}
	})

	t.Run("daemon outlives its exec", func(t *testing.T) {
		r := a.run(t, execID(t), shell(`sleep 100 >/dev/null 2>&1 </dev/null & echo $!`))
		if r.result.GetExitCode() != 0 {
			t.Fatalf("result %v, want exit 0", r.result)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
		if err != nil {
			t.Fatalf("stdout %q: want the daemon's pid", r.stdout)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("daemon %d after its exec ended: %v, want it running", pid, err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone(t, pid) // reaped by the agent: no zombie left
	})
}
