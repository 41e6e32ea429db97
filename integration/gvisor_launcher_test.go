package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// runSpec runs spec in the sandbox and returns the response, failing the
// test on an error.
func runSpec(t *testing.T, sandboxID string, spec *berthv1.ProcessSpec) *berthv1.RunResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sandboxID, Process: spec})
	if err != nil {
		t.Fatalf("Run %q: %v", spec.GetShellCommand(), err)
	}
	return resp
}

// TestGVisorReapingLauncher runs execs in a gVisor sandbox, whose kernel
// ignores CLONE_PARENT: after the first start the agent's launcher stays,
// starts each process as its own child and reports its exit. It checks exit
// codes, a signal, a process group killed at its timeout, a launcher
// killed while execs run (by an exec: both end with their own status, and
// the next exec gets a new launcher), concurrent execs, and a daemon that
// outlives its exec and is reaped by the agent once killed.
func TestGVisorReapingLauncher(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	id := sb.GetId()
	sh := func(cmd string) *berthv1.ProcessSpec { return &berthv1.ProcessSpec{ShellCommand: cmd} }
	// The first start finds that CLONE_PARENT is ignored; the launcher of
	// the next ones stays.
	if got := runSpec(t, id, sh("exit 4")); got.GetResult().GetExitCode() != 4 {
		t.Fatalf("first exec: %v, want exit 4", got.GetResult())
	}
	parent := func() (pid int, cmdline string) {
		got := runSpec(t, id, sh(`echo $PPID; tr '\0' ' ' </proc/$PPID/cmdline`))
		lines := strings.SplitN(string(got.GetStdout()), "\n", 2)
		pid, err := strconv.Atoi(lines[0])
		if err != nil || len(lines) < 2 || got.GetResult().GetExitCode() != 0 {
			t.Fatalf("parent of an exec: %q, %v", got.GetStdout(), got.GetResult())
		}
		return pid, lines[1]
	}
	lp, cmdline := parent()
	reaping := func(cmdline string) bool {
		return strings.HasPrefix(cmdline, "berth-agent-launcher ") && strings.HasSuffix(cmdline, " reap ")
	}
	if !reaping(cmdline) {
		t.Fatalf("an exec's parent runs %q, want the reaping launcher (berth-agent-launcher <nofile> reap)", cmdline)
	}
	// The native launcher: no Go runtime, one thread (gVisor's /proc
	// shows neither its memfd as exe nor SigBlk; the agent's unit test
	// TestReapingLauncher checks both on the host).
	if got := string(runSpec(t, id, sh(fmt.Sprintf(`grep '^Threads:' /proc/%d/status`, lp))).GetStdout()); got != "Threads:\t1\n" {
		t.Errorf("reaping launcher %d: %q, want 1 thread (the native launcher)", lp, got)
	}
	if again, _ := parent(); again != lp {
		t.Errorf("launcher pid %d, then %d: want the same launcher to stay", lp, again)
	}

	for _, code := range []int{0, 1, 2, 77} {
		if got := runSpec(t, id, sh(fmt.Sprintf("echo %d; exit %d", code, code))); got.GetResult().GetExitCode() != int32(code) || string(got.GetStdout()) != fmt.Sprintf("%d\n", code) {
			t.Errorf("exit %d: stdout %q, result %v", code, got.GetStdout(), got.GetResult())
		}
	}
	if got := runSpec(t, id, sh("kill -TERM $$")).GetResult(); got.GetExitCode() != 143 || got.GetSignal() != "SIGTERM" {
		t.Errorf("kill -TERM $$: %v, want exit 143, SIGTERM", got)
	}
	if got := runSpec(t, id, sh("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")).GetResult(); got.GetUserCpu().AsDuration() <= 0 {
		t.Errorf("a busy loop: user_cpu %v, want the launcher's rusage of it", got.GetUserCpu().AsDuration())
	}

	// A timeout kills the group: a grandchild that ignores SIGTERM is gone
	// when the result comes.
	spec := sh(`sh -c 'trap "" TERM; echo $$; exec sleep 100' & wait`)
	spec.Timeout = durationpb.New(2 * time.Second)
	got := runSpec(t, id, spec)
	if !got.GetResult().GetTimedOut() {
		t.Errorf("timeout: %v, want timed out", got.GetResult())
	}
	grandchild := strings.TrimSpace(string(got.GetStdout()))
	if out := runSpec(t, id, sh("kill -0 "+grandchild+" 2>/dev/null && echo alive || echo gone")); string(out.GetStdout()) != "gone\n" {
		t.Errorf("grandchild %s after the timeout: %q, want gone", grandchild, out.GetStdout())
	}

	// An exec kills its launcher while another waits: both end with their
	// own exit codes (the agent, PID 1, reaps what the launcher left).
	var wg sync.WaitGroup
	var waiter *berthv1.RunResponse
	wg.Go(func() {
		waiter = runSpec(t, id, sh("touch /tmp/waiting; while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 7"))
	})
	killer := runSpec(t, id, sh("while [ ! -e /tmp/waiting ]; do sleep 0.05; done; kill -KILL $PPID; touch /tmp/go; exit 5"))
	wg.Wait()
	if killer.GetResult().GetExitCode() != 5 || waiter.GetResult().GetExitCode() != 7 {
		t.Errorf("launcher killed: killer %v (want exit 5), waiter %v (want exit 7)", killer.GetResult(), waiter.GetResult())
	}
	if next, cmdline := parent(); next == lp || !reaping(cmdline) {
		t.Errorf("after the kill an exec's parent is %d %q, want a new reaping launcher (was %d)", next, cmdline, lp)
	}

	// Concurrent execs each get their own status.
	const n = 12
	results := make([]*berthv1.RunResponse, n)
	for i := range n {
		wg.Go(func() { results[i] = runSpec(t, id, sh(fmt.Sprintf("echo %d; exit %d", i, 20+i))) })
	}
	wg.Wait()
	for i, r := range results {
		if r.GetResult().GetExitCode() != int32(20+i) || string(r.GetStdout()) != fmt.Sprintf("%d\n", i) {
			t.Errorf("concurrent exec %d: stdout %q, result %v; want %d and exit %d", i, r.GetStdout(), r.GetResult(), i, 20+i)
		}
	}

	// A daemon outlives its exec; killed, it is reaped (no zombie left).
	daemon := strings.TrimSpace(string(runSpec(t, id, sh("sleep 1000 >/dev/null 2>&1 </dev/null & echo $!")).GetStdout()))
	if out := runSpec(t, id, sh("kill -0 "+daemon+" && echo alive")); string(out.GetStdout()) != "alive\n" {
		t.Fatalf("daemon %s after its exec: %q, want alive", daemon, out.GetStdout())
	}
	runSpec(t, id, sh("kill -KILL "+daemon))
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		out := runSpec(t, id, sh("kill -0 "+daemon+" 2>/dev/null && echo alive || echo gone"))
		if string(out.GetStdout()) == "gone\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon %s killed: still there after a minute (unreaped)", daemon)
		}
	}
}
