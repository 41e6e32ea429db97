package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// bootID returns the agent boot id of a sandbox: it changes when the agent
// dies and its task is restarted.
func bootID(t *testing.T, sandboxID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sandboxID})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetSandbox().GetRuntime().GetAgentBootId()
	if id == "" {
		t.Fatalf("sandbox %s reports no agent boot id", sandboxID)
	}
	return id
}

// TestDetachedWritersKeepTheAgent starts 40 background execs of 8 MB each
// in a 256 MiB sandbox, with nobody reading: 320 MB of output, more than
// the sandbox's memory. The agent retains at most its budget (an eighth of
// the memory), sheds the output of ended execs first, and is never
// OOM-killed: its boot id stays the same.
func TestDetachedWritersKeepTheAgent(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 256 << 20}}).GetId()
	before := bootID(t, sb)
	const writers = 40
	ids := make([]string, writers)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", xid(t), i)
		openExec(t, env.sandboxes, &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
			SandboxId: sb, ExecId: ids[i], Process: &berthv1.ProcessSpec{Argv: []string{"head", "-c", "8000000", "/dev/urandom"}}, Background: true,
		}}}, 0).wait0()
	}
	if !poll(2*time.Minute, func() bool {
		execs := listExecs(t, env.sandboxes, sb)
		for _, id := range ids {
			if execs[id].GetState() != berthv1.ExecState_EXEC_STATE_EXITED {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the writers did not all end within 2 minutes")
	}
	for _, id := range ids {
		if r := listExecs(t, env.sandboxes, sb)[id].GetResult(); r.GetExitCode() != 0 || r.GetStdoutBytes() != 8000000 || r.GetOomKilled() {
			t.Errorf("exec %s: result %v, want exit 0 and 8000000 bytes", id, r)
		}
	}
	if after := bootID(t, sb); after != before {
		t.Errorf("agent boot id changed from %s to %s: the agent died", before, after)
	}
	// What each writer retains plus what an attach is told was shed is its
	// 8000000 bytes; together they retain at most the budget, an eighth of
	// the sandbox's memory (plus one 256 KiB event per writer in flight).
	var retained, lostAll uint64
	for _, id := range ids {
		ev := openExec(t, env.sandboxes, attachReq(sb, id, 0), 0).wait()
		var lost uint64
		for _, d := range ev.dropped {
			lost += d.GetLostBytes()
		}
		if got := uint64(len(ev.stdout)) + lost; got != 8000000 {
			t.Errorf("exec %s: %d bytes retained + %d lost = %d, want 8000000", id, len(ev.stdout), lost, got)
		}
		retained += uint64(len(ev.stdout))
		lostAll += lost
	}
	t.Logf("40 writers of 8 MB: %d KiB retained, %d KiB shed", retained>>10, lostAll>>10)
	if retained > 32<<20 || lostAll == 0 {
		t.Errorf("retained %d bytes, shed %d; want at most the 32 MiB budget retained", retained, lostAll)
	}
}

// TestMemoryPressureSparesTheAgent is the case that used to kill the agent:
// a 64 MiB sandbox with /dev/shm holding 28 MiB (of at most 32: /dev/shm
// leaves 32 MiB of the limit to processes), and 4 clients each running
// 10 execs of `dd bs=8M count=1` at once, so that the kernel's OOM killer
// runs while execs start. The OOM killer takes workload processes only: the
// agent keeps its boot id, every exec ends with a result, and the next exec
// works.
func TestMemoryPressureSparesTheAgent(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 64 << 20, ShmBytes: 32 << 20}}).GetId()
	before := bootID(t, sb)
	if ev := runExec(t, env.sandboxes, sb, "", sh("dd if=/dev/zero of=/dev/shm/fill bs=1M count=28 2>&1")); ev.result.GetExitCode() != 0 {
		t.Fatalf("fill /dev/shm: %s, result %v", ev.stdout, ev.result)
	}
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		ok, killed int
	)
	for c := range 4 {
		wg.Go(func() {
			for i := range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				stream, err := env.sandboxes.Exec(ctx)
				if err == nil {
					err = stream.Send(startReq(sb, fmt.Sprintf("%s-%d-%d", xid(t), c, i), &berthv1.ProcessSpec{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=8M", "count=1"}}))
				}
				var res *berthv1.ExecResult
				for err == nil && res == nil {
					var resp *berthv1.ExecResponse
					resp, err = stream.Recv()
					res = resp.GetExited().GetResult()
				}
				cancel()
				mu.Lock()
				switch {
				case err != nil && rpcstatus.Reason(err) == rpcstatus.ReasonMemoryLimit:
					killed++ // the start itself found no memory: typed, nothing ran
				case err != nil:
					t.Errorf("client %d exec %d: %v (reason %s)", c, i, status.Convert(err).Message(), rpcstatus.Reason(err))
				case res.GetExitCode() == 0:
					ok++
				case res.GetOomKilled():
					killed++
				default:
					t.Errorf("client %d exec %d: result %v, want exit 0 or an OOM kill", c, i, res)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("under memory pressure: %d execs ran, %d were OOM-killed or refused", ok, killed)
	if after := bootID(t, sb); after != before {
		t.Fatalf("agent boot id changed from %s to %s: the agent was OOM-killed", before, after)
	}
	if ev := runExec(t, env.sandboxes, sb, "", sh("rm /dev/shm/fill && echo ok")); string(ev.stdout) != "ok\n" || ev.result.GetExitCode() != 0 {
		t.Errorf("next exec: stdout %q, result %v; want ok", ev.stdout, ev.result)
	}
}

// TestManyConcurrentExecs starts 800 `sleep 5` execs at once in one
// sandbox: each runs to exit 0 or fails with a typed error — refused before
// anything started (the agent's descriptors, the sandbox's pids), or, on a
// loaded machine where the agent's queue of starts outlasts berthd's
// connect budget, SANDBOX_UNREACHABLE saying it is unknown whether it ran;
// none reports an exit status for a command that never ran.
func TestManyConcurrentExecs(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	const execs = 800
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ran     int
		refused = map[string]int{}
	)
	for i := range execs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			stream, err := env.sandboxes.Exec(ctx)
			if err == nil {
				err = stream.Send(startReq(sb, fmt.Sprintf("%s-%d", xid(t), i), &berthv1.ProcessSpec{Argv: []string{"sleep", "5"}}))
			}
			var res *berthv1.ExecResult
			for err == nil && res == nil {
				var resp *berthv1.ExecResponse
				resp, err = stream.Recv()
				res = resp.GetExited().GetResult()
			}
			mu.Lock()
			defer mu.Unlock()
			switch reason := rpcstatus.Reason(err); {
			case err == nil && res.GetExitCode() == 0:
				ran++
			case reason == rpcstatus.ReasonDescriptorLimit || reason == rpcstatus.ReasonPidsLimit || reason == rpcstatus.ReasonFleetBusy ||
				reason == rpcstatus.ReasonUnreachable:
				refused[reason]++
			case err != nil:
				t.Errorf("exec %d: %v (reason %q), want a result or a typed refusal", i, err, reason)
			default:
				t.Errorf("exec %d: result %v, want exit 0", i, res)
			}
		})
	}
	wg.Wait()
	t.Logf("%d execs at once: %d ran, refused %v", execs, ran, refused)
	if ran == 0 {
		t.Errorf("no exec ran")
	}
	if ev := runExec(t, env.sandboxes, sb, "", sh("echo ok")); string(ev.stdout) != "ok\n" {
		t.Errorf("exec after the crowd: stdout %q, result %v", ev.stdout, ev.result)
	}
}
