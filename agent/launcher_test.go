package agent_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// limitOf returns the soft and hard values of a limit in /proc/<pid>/limits.
func limitOf(t *testing.T, pid int, name string) (soft, hard string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name) {
			f := strings.Fields(strings.TrimPrefix(line, name))
			return f[0], f[1]
		}
	}
	t.Fatalf("no %q in /proc/%d/limits", name, pid)
	return "", ""
}

// TestLauncher checks what the launcher gives the processes it starts and
// what the agent keeps: children are born with oom_score_adj 1000 and the
// workload's soft descriptor limit, the agent's own score never moves, nor
// the launcher's between starts, and the agent's soft limit is its hard
// one; a killed launcher is replaced.
func TestLauncher(t *testing.T) {
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := startAgentCmd(t, dir, []string{"prlimit", "--nofile=512:4096", "--"}, "--workload-nofile", "777")
	agentScore := readOOMScore(t, a.pid)
	r := a.run(t, execID(t), shell(`cat /proc/self/oom_score_adj; ulimit -Sn; ulimit -Hn; sh -c 'cat /proc/self/oom_score_adj'`))
	if got, want := string(r.stdout), "1000\n777\n4096\n1000\n"; got != want {
		t.Errorf("child's oom_score_adj, soft and hard nofile, grandchild's score = %q, want %q", got, want)
	}
	if got := readOOMScore(t, a.pid); got != agentScore || got == "1000" {
		t.Errorf("agent's oom_score_adj = %q after a start, want its own %q (never 1000)", got, agentScore)
	}
	if soft, hard := limitOf(t, a.pid, "Max open files"); soft != "4096" || hard != "4096" {
		t.Errorf("agent's nofile = %s/%s, want 4096/4096: raised to the hard limit", soft, hard)
	}
	lp := agentbin.LauncherPID(a.pid)
	if lp == 0 {
		t.Fatal("no launcher among the agent's children")
	}
	// The launcher is 1000 only while it forks: between starts it is not
	// the OOM killer's pick.
	if got := readOOMScore(t, lp); got != agentScore {
		t.Errorf("launcher's oom_score_adj = %q between starts, want the agent's %q", got, agentScore)
	}

	// The workload (same uid) can kill the launcher: the next start brings
	// up another.
	if err := syscall.Kill(lp, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(lp, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // until the agent reaped it
	}
	if r := a.run(t, execID(t)+"-again", shell(`echo again`)); string(r.stdout) != "again\n" || r.result.GetExitCode() != 0 {
		t.Errorf("after the launcher was killed: stdout %q, result %v; want %q, exit 0", r.stdout, r.result, "again\n")
	}
	if next := agentbin.LauncherPID(a.pid); next == 0 || next == lp {
		t.Errorf("launcher pid after the kill = %d, want a new one (was %d)", next, lp)
	}
}

// TestMaxRSSIsTheCommands checks that max_rss_bytes is the command's own
// peak, not the agent's: with the agent holding 96 MiB of retained output,
// `true` reports a few MiB and a 64 MiB allocation at least 64 MiB.
func TestMaxRSSIsTheCommands(t *testing.T) {
	a := startAgent(t, "--ring-bytes", fmt.Sprint(128<<20), "--retained-bytes", fmt.Sprint(200<<20))
	// Fill the agent: a background exec nobody reads, all retained.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := execID(t) + "-fill"
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: id, Process: argv("head", "-c", fmt.Sprint(96<<20), "/dev/urandom"), Background: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	// Wait for its end without reading its output.
	wait, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: id, ExitOnly: true}}}); err != nil {
		t.Fatal(err)
	}
	if r := collect(t, wait, nil); r.result.GetStdoutBytes() != 96<<20 || len(r.stdout) != 0 {
		t.Fatalf("exit-only attach: %d output bytes, result %v; want none and 96 MiB written", len(r.stdout), r.result)
	}
	if rss := rssOf(t, a.pid); rss < 96<<20 {
		t.Fatalf("agent RSS = %d MiB, want at least 96 MiB for the test to mean something", rss>>20)
	}
	small := a.run(t, execID(t)+"-true", argv("true")).result.GetMaxRssBytes()
	big := a.run(t, execID(t)+"-dd", argv("dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1")).result.GetMaxRssBytes()
	t.Logf("max_rss_bytes: true %d KiB, dd bs=64M %d KiB; agent RSS %d MiB", small>>10, big>>10, rssOf(t, a.pid)>>20)
	if small == 0 || small > 16<<20 {
		t.Errorf("max_rss_bytes of true = %d, want a few MiB (its own, not the agent's)", small)
	}
	if big < 64<<20 || big > 96<<20 {
		t.Errorf("max_rss_bytes of dd bs=64M = %d, want 64 MiB and a little", big)
	}
}

// rssOf returns a process's resident set size in bytes (VmRSS).
func rssOf(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestOutOfDescriptors runs the agent with 64 descriptors and starts more
// execs than fit: each one runs or fails with RESOURCE_EXHAUSTED
// DESCRIPTOR_LIMIT_REACHED before anything started; none reports an exit
// status for a command that never ran. Once they end, execs run again.
func TestOutOfDescriptors(t *testing.T) {
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := startAgentCmd(t, dir, []string{"prlimit", "--nofile=64:64", "--"})
	const execs = 40
	var (
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		ran, refused, wrong int
	)
	for i := range execs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			stream := a.startExec(t, ctx, fmt.Sprintf("%s-%d", execID(t), i), argv("sleep", "1"))
			stream.CloseSend()
			var exit int32 = -1
			var serr error
			for {
				resp, err := stream.Recv()
				if err != nil {
					serr = err
					break
				}
				if res := resp.GetExited().GetResult(); res != nil {
					exit = res.GetExitCode()
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case serr == nil && exit == 0:
				ran++
			case status.Code(serr) == codes.ResourceExhausted && rpcstatus.Reason(serr) == rpcstatus.ReasonDescriptorLimit:
				refused++
			default:
				wrong++
				t.Errorf("exec %d: exit %d, error %v; want exit 0 or DESCRIPTOR_LIMIT_REACHED", i, exit, serr)
			}
		})
	}
	wg.Wait()
	t.Logf("%d execs ran, %d were refused for lack of descriptors", ran, refused)
	if refused == 0 || ran == 0 {
		t.Errorf("ran %d, refused %d: want both with 64 descriptors for %d execs", ran, refused, execs)
	}
	if r := a.run(t, execID(t)+"-after", shell(`echo after`)); string(r.stdout) != "after\n" {
		t.Errorf("exec after the crowd: stdout %q, result %v", r.stdout, r.result)
	}
}
