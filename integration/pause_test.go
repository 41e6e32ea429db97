package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// lineStream is an attached Exec stream whose output is counted as it
// arrives.
type lineStream struct {
	mu     sync.Mutex
	out    strings.Builder
	result *berthv1.ExecResult
	err    error
	done   chan struct{}
	// pausedBeats and resumedBeats count heartbeats with sandbox_paused
	// set, and unset after one that had it.
	pausedBeats, resumedBeats int
}

// startLines starts shell in sandbox id on an Exec stream and reads it in
// the background until it ends.
func startLines(t *testing.T, ctx context.Context, id, shell string) *lineStream {
	t.Helper()
	stream, err := env.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: shell}}}}); err != nil {
		t.Fatal(err)
	}
	ls := &lineStream{done: make(chan struct{})}
	go func() {
		defer close(ls.done)
		var lastSeq uint64
		for {
			msg, err := stream.Recv()
			if err != nil {
				ls.mu.Lock()
				ls.err = err
				ls.mu.Unlock()
				return
			}
			ls.mu.Lock()
			switch {
			case msg.GetOutput() != nil:
				if seq := msg.GetOutput().GetSeq(); seq != lastSeq+1 {
					ls.err = fmt.Errorf("output seq %d after %d", seq, lastSeq)
				}
				lastSeq = msg.GetOutput().GetSeq()
				ls.out.Write(msg.GetOutput().GetData())
			case msg.GetDropped() != nil:
				ls.err = fmt.Errorf("events dropped: %v", msg.GetDropped())
			case msg.GetHeartbeat() != nil:
				if msg.GetHeartbeat().GetLastSeq() > lastSeq {
					ls.err = fmt.Errorf("heartbeat last_seq %d ahead of output %d", msg.GetHeartbeat().GetLastSeq(), lastSeq)
				}
				if msg.GetHeartbeat().GetSandboxPaused() {
					ls.pausedBeats++
				} else if ls.pausedBeats > 0 {
					ls.resumedBeats++
				}
			case msg.GetExited() != nil:
				ls.result = msg.GetExited().GetResult()
				ls.mu.Unlock()
				return
			}
			ls.mu.Unlock()
		}
	}()
	return ls
}

func (ls *lineStream) lines() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return strings.Count(ls.out.String(), "\n")
}

// cgroupCPU is the CPU time used so far by sandbox id's cgroup (cpuacct).
func cgroupCPU(t *testing.T, ctx context.Context, id string) time.Duration {
	t.Helper()
	rec, err := env.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := procfs.CgroupCPU(rec.TaskPID)
	if err != nil {
		t.Fatalf("cpuacct of sandbox %s (pid %d): %v", id, rec.TaskPID, err)
	}
	return cpu
}

// sandboxState is the state GetSandbox reports.
func sandboxState(t *testing.T, ctx context.Context, id string) berthv1.SandboxState {
	t.Helper()
	got, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetSandbox().GetState()
}

// TestPauseResume pauses a runc sandbox running a counter loop, a CPU hog
// and an attached Exec stream printing lines: paused, the counter stops,
// the hog's cgroup uses no CPU (cpuacct over a second), no line arrives,
// and the state is PAUSED in GetSandbox, ListSandboxes and `berth sandbox
// ls`; a Run with berth-no-resume fails SANDBOX_PAUSED and leaves it
// paused; a plain Run resumes it, the counter goes on, and the stream
// delivers every line exactly once. Pausing twice and resuming twice
// succeed; DeleteSandbox removes a paused sandbox.
func TestPauseResume(t *testing.T) {
	need(t)
	testPauseResume(t, "")
}

// TestPauseResumeGVisor is TestPauseResume under gVisor (runsc pause).
func TestPauseResumeGVisor(t *testing.T) {
	needGVisor(t)
	testPauseResume(t, "gvisor")
}

func testPauseResume(t *testing.T, rtName string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: rtName})
	id := sb.GetId()
	startDetached(t, id, "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i >/tmp/counter; sleep 0.05; done")
	startDetached(t, id, "sh", "-c", "while :; do :; done")
	const lines = 60
	ls := startLines(t, ctx, id, fmt.Sprintf("for i in $(seq 1 %d); do echo \"line $i\"; sleep 0.05; done", lines))
	counter := func(c context.Context) int {
		t.Helper()
		resp, err := env.sandboxes.Run(c, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/tmp/counter"}}})
		if err != nil {
			t.Fatalf("read the counter: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(resp.GetStdout())))
		return n
	}
	waitFor(t, 30*time.Second, "the counter and the stream running", func() bool { return counter(ctx) > 3 && ls.lines() > 3 })

	// The hog uses CPU before the pause (cpuacct counts under runc; the
	// gVisor sandbox's cgroup holds its sentry, which runs the hog).
	before := cgroupCPU(t, ctx, id)
	time.Sleep(500 * time.Millisecond)
	if used := cgroupCPU(t, ctx, id) - before; used < 50*time.Millisecond {
		t.Errorf("CPU hog used %v in 500ms before the pause, want it busy", used)
	}

	for range 2 { // pausing a paused sandbox succeeds
		resp, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id})
		if err != nil {
			t.Fatalf("PauseSandbox: %v", err)
		}
		if resp.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
			t.Errorf("PauseSandbox returned state %v, want PAUSED", resp.GetSandbox().GetState())
		}
	}
	time.Sleep(200 * time.Millisecond) // what was in flight arrives
	linesAtPause := ls.lines()
	cpuAtPause := cgroupCPU(t, ctx, id)
	time.Sleep(time.Second)
	if used := cgroupCPU(t, ctx, id) - cpuAtPause; used > 20*time.Millisecond {
		t.Errorf("paused sandbox used %v of CPU in 1s, want ~0", used)
	}
	if n := ls.lines(); n != linesAtPause {
		t.Errorf("lines while paused: %d then %d, want none arriving", linesAtPause, n)
	}
	ls.mu.Lock()
	if ls.pausedBeats != 1 {
		t.Errorf("heartbeats saying paused on the attached stream: %d, want one", ls.pausedBeats)
	}
	ls.mu.Unlock()
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("GetSandbox state %v, want PAUSED", got)
	}
	list, err := env.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSandboxes() {
		if s.GetId() == id && s.GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
			t.Errorf("ListSandboxes state %v, want PAUSED", s.GetState())
		}
	}
	if out, stderr, code := berthCLI(t, nil, "sandbox", "ls"); code != 0 || !strings.Contains(lineOf(out, id), "paused") {
		t.Errorf("berth sandbox ls row of %s: %q (exit %d, %s), want state paused", id, lineOf(out, id), code, stderr)
	}

	// Opted out: SANDBOX_PAUSED, still paused.
	_, err = env.sandboxes.Run(client.NoResume(ctx), &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxPaused {
		t.Errorf("Run with berth-no-resume on a paused sandbox: %v, want FAILED_PRECONDITION SANDBOX_PAUSED", err)
	}
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("state after the refused Run: %v, want PAUSED", got)
	}

	// A plain Run resumes it, and the counter goes on.
	n1 := counter(ctx)
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after an auto-resuming Run: %v, want RUNNING", got)
	}
	waitFor(t, 10*time.Second, "the counter going on after the resume", func() bool { return counter(ctx) > n1 })
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Errorf("ResumeSandbox of a running sandbox: %v, want success", err)
	}

	select {
	case <-ls.done:
	case <-ctx.Done():
		t.Fatal("the attached stream did not end")
	}
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if ls.resumedBeats < 1 {
		t.Errorf("no heartbeat said the sandbox runs again after the resume (%d saying paused)", ls.pausedBeats)
	}
	if ls.err != nil || ls.out.String() != want.String() || ls.result.GetExitCode() != 0 {
		t.Errorf("attached stream across pause and resume: err %v, exit %d, %d bytes; want the %d lines once each, exit 0\n%s",
			ls.err, ls.result.GetExitCode(), ls.out.Len(), lines, ls.out.String())
	}

	// Delete of a paused sandbox.
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("DeleteSandbox of a paused sandbox: %v", err)
	}
	if _, err := env.rt.Get(ctx, id); err == nil {
		t.Errorf("paused sandbox %s still in containerd after DeleteSandbox", id)
	}
}

// lineOf returns the line of out that contains s.
func lineOf(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestPauseFilesAutoResume: a file call and a PortForward on a paused
// sandbox resume it; with berth-no-resume they fail SANDBOX_PAUSED. The
// CLI's sandbox pause, sandbox resume and --no-resume do the same.
func TestPauseFilesAutoResume(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	files := berthv1.NewFileServiceClient(env.conn)
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := files.Stat(client.NoResume(ctx), &berthv1.StatRequest{SandboxId: id, Location: &berthv1.StatRequest_Path{Path: "/workspace"}})
	if rpcstatus.Reason(err) != rpcstatus.ReasonSandboxPaused {
		t.Errorf("Stat with berth-no-resume of a paused sandbox: %v, want SANDBOX_PAUSED", err)
	}
	if _, err := files.Stat(ctx, &berthv1.StatRequest{SandboxId: id, Location: &berthv1.StatRequest_Path{Path: "/workspace"}}); err != nil {
		t.Errorf("Stat of a paused sandbox: %v, want it resumed and answered", err)
	}
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after Stat: %v, want RUNNING", got)
	}

	// PortForward: refused paused with the opt-out, resumed without it
	// (nothing listens on port 9: PORT_CLOSED from the resumed agent).
	forward := func(ctx context.Context) error {
		pf, err := env.sandboxes.PortForward(ctx)
		if err != nil {
			return err
		}
		if err := pf.Send(&berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: id, Port: 9}}}); err != nil {
			return err
		}
		_, err = pf.Recv()
		return err
	}
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if err := forward(client.NoResume(ctx)); rpcstatus.Reason(err) != rpcstatus.ReasonSandboxPaused {
		t.Errorf("PortForward with berth-no-resume into a paused sandbox: %v, want SANDBOX_PAUSED", err)
	}
	if err := forward(ctx); rpcstatus.Reason(err) != rpcstatus.ReasonPortClosed {
		t.Errorf("PortForward into a paused sandbox, port 9: %v, want it resumed and PORT_CLOSED", err)
	}

	if out, stderr, code := berthCLI(t, nil, "sandbox", "pause", id); code != 0 || out != id+"\n" {
		t.Fatalf("berth sandbox pause: %q, exit %d, %s", out, code, stderr)
	}
	if _, stderr, code := berthCLI(t, nil, "--no-resume", "exec", id, "--", "true"); code == 0 || !strings.Contains(stderr, "SANDBOX_PAUSED") {
		t.Errorf("berth --no-resume exec in a paused sandbox: exit %d, stderr %q; want a failure naming SANDBOX_PAUSED", code, stderr)
	}
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("state after berth sandbox pause and a refused exec: %v, want PAUSED", got)
	}
	if out, stderr, code := berthCLI(t, nil, "sandbox", "resume", id); code != 0 || out != id+"\n" {
		t.Fatalf("berth sandbox resume: %q, exit %d, %s", out, code, stderr)
	}
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after berth sandbox resume: %v, want RUNNING", got)
	}
}

// TestPauseOwnership: another principal's PauseSandbox and ResumeSandbox
// are NOT_FOUND and change nothing.
func TestPauseOwnership(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	alice, bob := berthv1.NewSandboxServiceClient(a.conn(t, aliceToken)), berthv1.NewSandboxServiceClient(a.conn(t, bobToken))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created, err := alice.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	t.Cleanup(func() { alice.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}) })
	if _, err := bob.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxNotFound {
		t.Errorf("bob's PauseSandbox of alice's sandbox: %v, want NOT_FOUND SANDBOX_NOT_FOUND", err)
	}
	if rec, err := env.rt.Get(ctx, id); err != nil || rec.Paused {
		t.Errorf("alice's sandbox after bob's pause: paused %v, %v; want running", rec.Paused, err)
	}
	if _, err := alice.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("bob's ResumeSandbox of alice's sandbox: %v, want NOT_FOUND", err)
	}
	// Nor does bob's Run resume it.
	if _, err := bob.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}}); status.Code(err) != codes.NotFound {
		t.Errorf("bob's Run in alice's paused sandbox: %v, want NOT_FOUND", err)
	}
	if rec, err := env.rt.Get(ctx, id); err != nil || !rec.Paused {
		t.Errorf("alice's sandbox after bob's resume and run: paused %v, %v; want paused", rec.Paused, err)
	}
}

// TestIdleActionPause: a sandbox created with idle_action PAUSE is paused
// (not removed) at its idle timeout, and the next call resumes it.
func TestIdleActionPause(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{IdleTimeout: durationpb.New(2 * time.Second), IdleAction: berthv1.IdleAction_IDLE_ACTION_PAUSE})
	if sb.GetIdleAction() != berthv1.IdleAction_IDLE_ACTION_PAUSE {
		t.Errorf("idle_action %v, want PAUSE", sb.GetIdleAction())
	}
	id := sb.GetId()
	// A background exec running past the timeout keeps it running.
	startDetached(t, id, "sleep", "4")
	began := time.Now()
	// GetSandbox counts as activity: look in containerd.
	waitFor(t, 20*time.Second, "the idle sandbox paused", func() bool {
		rec, err := env.rt.Get(ctx, id)
		if err != nil {
			t.Fatalf("idle sandbox with idle_action PAUSE: %v, want it kept", err)
		}
		return rec.Paused
	})
	if took := time.Since(began); took < 4*time.Second {
		t.Errorf("paused %v after a 4s background exec started, before it ended", took)
	}
	got := run(t, id, "echo", "back")
	if string(got.GetStdout()) != "back\n" {
		t.Errorf("Run after the idle pause: %q, want back", got.GetStdout())
	}
	if st := sandboxState(t, ctx, id); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after the resuming Run: %v, want RUNNING", st)
	}
}

// TestPauseSurvivesRestart: a paused sandbox stays paused across a berthd
// restart (SIGKILL): the new berthd reports PAUSED, leaves it alone, and
// the next Run resumes it.
func TestPauseSurvivesRestart(t *testing.T) {
	need(t)
	e, p1, id := startBerthdWithSandbox(t, "pz", "paused-rs")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e)
	got, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("GetSandbox after the restart: %v", err)
	}
	if got.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("state after the restart: %v, want PAUSED", got.GetSandbox().GetState())
	}
	if rec, err := e.rt.Get(ctx, id); err != nil || !rec.Paused {
		t.Errorf("containerd's task after the restart: paused %v, %v; want paused", rec.Paused, err)
	}
	resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}}})
	if err != nil || string(resp.GetStdout()) != "ok\n" {
		t.Errorf("Run after the restart: %q, %v; want ok", resp.GetStdout(), err)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// waitFor polls cond (poll) until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(d, cond) {
		t.Fatalf("%s: not within %v", what, d)
	}
}

// TestPauseRaces pauses, resumes and runs commands in one sandbox at once:
// every pause and resume succeeds (both idempotent), every Run gives its
// output once the sandbox runs (a Run that meets a paused sandbox resumes
// it, or waits for the resume when it was already under way), and the
// sandbox ends running and usable.
func TestPauseRaces(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	const rounds = 15
	var freezers, runners sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for _, pause := range []bool{true, false} {
		freezers.Add(1)
		go func() {
			defer freezers.Done()
			for range rounds {
				var err error
				if pause {
					_, err = env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id})
				} else {
					_, err = env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id})
				}
				if err != nil {
					errs <- fmt.Errorf("pause %v: %w", pause, err)
				}
			}
		}()
	}
	runners.Add(1)
	go func() {
		defer runners.Done()
		for i := range rounds {
			want := fmt.Sprintf("run %d\n", i)
			resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "run", strconv.Itoa(i)}}})
			if err != nil || string(resp.GetStdout()) != want {
				errs <- fmt.Errorf("Run %d: %q, %v; want %q", i, resp.GetStdout(), err, want)
			}
		}
	}()
	freezers.Wait()
	// A Run that was under way when the last pause came waits for this.
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	runners.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := run(t, id, "echo", "end"); string(got.GetStdout()) != "end\n" {
		t.Errorf("Run after the races: %q, want end", got.GetStdout())
	}
	if st := sandboxState(t, ctx, id); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after the races: %v, want RUNNING", st)
	}
}

// TestPauseMaxLifetime: the maximum lifetime removes a paused sandbox
// (docs/state.md): its frozen processes are killed, its task and record
// gone, and nothing of it is left running in containerd.
func TestPauseMaxLifetime(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{MaxLifetime: durationpb.New(4 * time.Second)})
	id := sb.GetId()
	startDetached(t, id, "sleep", "600")
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the paused sandbox removed at its maximum lifetime", func() bool {
		_, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
		if err != nil && status.Code(err) != codes.NotFound {
			t.Fatalf("GetSandbox: %v", err)
		}
		return status.Code(err) == codes.NotFound
	})
	if rec, err := env.rt.Get(ctx, id); err == nil {
		t.Errorf("containerd still holds the sandbox past its lifetime: %+v", rec)
	}
}

// TestPauseUploadNoResume: an Upload with berth-no-resume into a paused
// sandbox fails SANDBOX_PAUSED, writes nothing and leaves the sandbox
// paused; the same Upload without it resumes the sandbox and writes.
func TestPauseUploadNoResume(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{}).GetId()
	c := dialClient(t, env.berthdAddr)
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Upload(client.NoResume(ctx), id, "/workspace", bytes.NewReader(oneFileTar("up", "paused")))
	if rpcstatus.Reason(err) != rpcstatus.ReasonSandboxPaused {
		t.Errorf("Upload with berth-no-resume into a paused sandbox: %v, want SANDBOX_PAUSED", err)
	}
	if rec, err := env.rt.Get(ctx, id); err != nil || !rec.Paused {
		t.Errorf("after the refused Upload: paused %v, %v; want still paused", rec.Paused, err)
	}
	if _, err := c.Upload(ctx, id, "/workspace", bytes.NewReader(oneFileTar("up", "resumed"))); err != nil {
		t.Fatalf("Upload without berth-no-resume: %v", err)
	}
	if got := run(t, id, "cat", "/workspace/up"); string(got.GetStdout()) != "resumed" {
		t.Errorf("/workspace/up after the Uploads: %q, want only the second's %q", got.GetStdout(), "resumed")
	}
}

// TestPauseRunMidOutput: a Run printing lines when its sandbox is paused
// waits out the pause and returns every line once, in order, exit 0; the
// pause holds it (no line while paused).
func TestPauseRunMidOutput(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{}).GetId()
	type result struct {
		resp *berthv1.RunResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{
			Argv: []string{"sh", "-c", "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i; echo $i > /tmp/at; sleep 0.05; done"}}})
		done <- result{resp, err}
	}()
	waitFor(t, 20*time.Second, "the Run under way", func() bool {
		rec, err := env.rt.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d/root/tmp/at", rec.TaskPID))
		return err == nil
	})
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("Run ended while its sandbox was paused: %v, %v", r.resp, r.err)
	case <-time.After(2 * time.Second):
	}
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var want strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if r.err != nil || string(r.resp.GetStdout()) != want.String() || r.resp.GetResult().GetExitCode() != 0 {
		t.Errorf("Run across a pause: %v, stdout %q, result %v; want lines 1 to 40 once, exit 0", r.err, r.resp.GetStdout(), r.resp.GetResult())
	}
}

// TestPauseExecAcrossRestart: an Exec attached to a paused sandbox when
// berthd is killed ends UNAVAILABLE with every line it had; after the
// restart the sandbox is still PAUSED, an attach with berth-no-resume is
// SANDBOX_PAUSED (the sandbox stays paused), and one without resumes it
// and delivers the rest: every line once, in order, exit 0.
func TestPauseExecAcrossRestart(t *testing.T) {
	need(t)
	e, p1, id := startBerthdWithSandbox(t, "pex", "paused-ex")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	var lastSeq uint64
	// follow reads stream until it ends, keeping the output in order;
	// stop, when set, ends the reading early once it holds.
	follow := func(stream berthv1.SandboxService_ExecClient, stop func() bool) (*berthv1.ExecResult, error) {
		for stop == nil || !stop() {
			msg, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			switch {
			case msg.GetOutput() != nil:
				if seq := msg.GetOutput().GetSeq(); seq != lastSeq+1 {
					t.Errorf("output seq %d after %d", seq, lastSeq)
				}
				lastSeq = msg.GetOutput().GetSeq()
				out.Write(msg.GetOutput().GetData())
			case msg.GetExited() != nil:
				return msg.GetExited().GetResult(), nil
			}
		}
		return nil, nil
	}
	stream, err := e.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: id, ExecId: "lines", Process: &berthv1.ProcessSpec{ShellCommand: "for i in $(seq 1 60); do echo line $i; sleep 0.05; done"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := follow(stream, func() bool { return lastSeq >= 5 }); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	p1.signal(t, syscall.SIGKILL)
	if res, err := follow(stream, nil); status.Code(err) != codes.Unavailable {
		t.Errorf("the attached stream when berthd was killed: %v, %v; want UNAVAILABLE", res, err)
	}
	p2 := startBerthd(t, e)
	attach := func(c context.Context) berthv1.SandboxService_ExecClient {
		t.Helper()
		s, err := e.sandboxes.Exec(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{SandboxId: id, ExecId: "lines", SinceSeq: lastSeq}}}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if res, err := follow(attach(client.NoResume(ctx)), nil); rpcstatus.Reason(err) != rpcstatus.ReasonSandboxPaused {
		t.Errorf("attach with berth-no-resume after the restart: %v, %v; want SANDBOX_PAUSED", res, err)
	}
	if rec, err := e.rt.Get(ctx, id); err != nil || !rec.Paused {
		t.Errorf("after the refused attach: paused %v, %v; want still paused", rec.Paused, err)
	}
	res, err := follow(attach(ctx), nil)
	var want strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if err != nil || res.GetExitCode() != 0 || out.String() != want.String() {
		t.Errorf("attach after the restart: %v, %v, output %q; want lines 1 to 60 once, exit 0", res, err, out.String())
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestPauseDeleteRaces: DeleteSandbox of a paused sandbox meeting a
// PauseSandbox, a ResumeSandbox and a Run (which resumes) at once always
// removes it: the delete succeeds, the others succeed or fail NOT_FOUND,
// SANDBOX_NOT_RUNNING or SANDBOX_UNREACHABLE (the Run also ABORTED, the
// sandbox deleted while it ran), and containerd holds
// nothing of it afterwards.
func TestPauseDeleteRaces(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 3 {
		id := newSandbox(t, &berthv1.CreateSandboxRequest{}).GetId()
		startDetached(t, id, "sleep", "600")
		if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		others := map[string]func() error{
			"PauseSandbox": func() error {
				_, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id})
				return err
			},
			"ResumeSandbox": func() error {
				_, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id})
				return err
			},
			"Run": func() error {
				_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
				return err
			},
		}
		for name, call := range others {
			wg.Go(func() {
				err := call()
				switch {
				case err == nil, status.Code(err) == codes.NotFound,
					rpcstatus.Reason(err) == rpcstatus.ReasonSandboxNotRunning, rpcstatus.Reason(err) == rpcstatus.ReasonUnreachable,
					name == "Run" && status.Code(err) == codes.Aborted: // deleted while it ran
				default:
					t.Errorf("round %d: %s meeting DeleteSandbox: %v", round, name, err)
				}
			})
		}
		wg.Go(func() {
			if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
				t.Errorf("round %d: DeleteSandbox of a paused sandbox meeting pause, resume and Run: %v", round, err)
			}
		})
		wg.Wait()
		if rec, err := env.rt.Get(ctx, id); err == nil {
			t.Errorf("round %d: containerd still holds the deleted sandbox: %+v", round, rec)
		}
	}
}

// TestPauseFreezer: berthd pauses and resumes a runc sandbox through its
// cgroup's freezer, and containerd's shim keeps holding the task running
// (server/runtime/freezer.go). Five pauses in a row, each right after a
// resume, freeze every process (a CPU hog's cgroup uses no CPU over 300
// ms) and read PAUSED; each resume reads RUNNING at once and the hog goes
// on; containerd's task status stays RUNNING throughout. A task paused
// through containerd itself (`ctr task pause`, or a berthd of before) is
// resumed by ResumeSandbox, after which containerd holds it running again,
// and a delete right after a resume removes the sandbox.
func TestPauseFreezer(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	startDetached(t, id, "sh", "-c", "while :; do :; done")
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(env.rt.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	task := func() containerd.Task {
		t.Helper()
		c, err := cc.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.Task(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	taskStatus := func() containerd.ProcessStatus {
		t.Helper()
		st, err := task().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Status
	}
	hogRuns := func(what string) {
		t.Helper()
		cpu := cgroupCPU(t, ctx, id)
		waitFor(t, 10*time.Second, "the hog using CPU "+what, func() bool { return cgroupCPU(t, ctx, id)-cpu > 50*time.Millisecond })
	}
	for round := range 5 {
		if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
			t.Fatalf("round %d: PauseSandbox: %v", round, err)
		}
		cpu := cgroupCPU(t, ctx, id)
		time.Sleep(300 * time.Millisecond)
		if used := cgroupCPU(t, ctx, id) - cpu; used > 20*time.Millisecond {
			t.Errorf("round %d: paused sandbox used %v of CPU in 300ms, want ~0", round, used)
		}
		if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
			t.Errorf("round %d: state while paused: %v, want PAUSED", round, got)
		}
		if st := taskStatus(); st != containerd.Running {
			t.Errorf("round %d: containerd's task status while paused: %v, want running (the freezer pauses it, not the shim)", round, st)
		}
		if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
			t.Fatalf("round %d: ResumeSandbox: %v", round, err)
		}
		if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("round %d: state right after ResumeSandbox: %v, want RUNNING", round, got)
		}
	}
	hogRuns("after the last resume")

	// Paused through containerd, as berthd paused before the freezer.
	if err := task().Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("ResumeSandbox of a task containerd paused: %v", err)
	}
	if st := taskStatus(); st != containerd.Running {
		t.Errorf("containerd's task status after ResumeSandbox of a task it paused: %v, want running", st)
	}
	hogRuns("after the resume of a task containerd paused")

	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("DeleteSandbox right after a resume: %v", err)
	}
	if rec, err := env.rt.Get(ctx, id); err == nil {
		t.Errorf("containerd still holds the deleted sandbox: %+v", rec)
	}
}
