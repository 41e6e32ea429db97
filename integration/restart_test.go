package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRestartReadoption kills berthd (the real binary) with SIGKILL while an
// exec runs, starts it again, re-attaches to the exec and checks that every
// output byte arrives exactly once; then stops it with SIGTERM, which leaves
// the sandbox running, and checks that a third berthd rebuilt the idle
// timeout from the sandbox's labels and removes it once idle. Version skew
// (this berthd is built as another version than the agent) is flagged and
// logged once; env values are never logged.
func TestRestartReadoption(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "rs")
	p1 := startBerthd(t, e)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const secret = "hunter2-do-not-log"
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{
		SandboxId: "readopt", Image: baseImage, IdleTimeout: durationpb.New(3 * time.Second), Env: map[string]string{"SECRET": secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.GetSandbox()

	// 80 numbered lines over about 2 s.
	const lines = 80
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d of %d\n", i, lines)
	}
	stream, err := e.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: sb.GetId(), ExecId: "long-1",
		Process: &berthv1.ProcessSpec{ShellCommand: fmt.Sprintf(`for i in $(seq 1 %d); do echo "line $i of %d"; sleep 0.025; done`, lines, lines)},
	}}}); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	var lastSeq uint64
	for got.Len() < 100 {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("Exec before the kill: %v", err)
		}
		if out := msg.GetOutput(); out != nil {
			if out.GetSeq() != lastSeq+1 {
				t.Fatalf("seq %d after %d", out.GetSeq(), lastSeq)
			}
			lastSeq = out.GetSeq()
			got.Write(out.GetData())
		}
	}
	if err := p1.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("berthd exited cleanly after SIGKILL?")
	}
	killedAt := got.Len()

	p2 := startBerthd(t, e)
	if lines := p2.logLines("sandbox re-adopted", sb.GetId()); len(lines) != 1 {
		t.Errorf("log lines re-adopting %s: %q, want one", sb.GetId(), lines)
	}
	attach, err := e.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := attach.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{SandboxId: sb.GetId(), ExecId: "long-1", SinceSeq: lastSeq}}}); err != nil {
		t.Fatal(err)
	}
	var result *berthv1.ExecResult
	for result == nil {
		msg, err := attach.Recv()
		if err != nil {
			t.Fatalf("attach after restart: %v", err)
		}
		switch {
		case msg.GetOutput() != nil:
			out := msg.GetOutput()
			if out.GetSeq() != lastSeq+1 {
				t.Fatalf("seq %d after %d across the restart", out.GetSeq(), lastSeq)
			}
			lastSeq = out.GetSeq()
			got.Write(out.GetData())
		case msg.GetDropped() != nil:
			t.Fatalf("events dropped across the restart: %v", msg.GetDropped())
		case msg.GetExited() != nil:
			result = msg.GetExited().GetResult()
		}
	}
	if got.String() != want.String() || result.GetExitCode() != 0 {
		t.Errorf("output across the restart (%d bytes before the kill) = %d bytes, exit %d; want the %d bytes of %d lines once each, exit 0", killedAt, got.Len(), result.GetExitCode(), want.Len(), lines)
	}

	for range 3 {
		g, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		s := g.GetSandbox()
		if s.GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId() || !s.GetVersionSkew() || s.GetServerVersion() != testServerVersion || s.GetIdleTimeout().AsDuration() != 3*time.Second {
			t.Errorf("GetSandbox after restart: boot %s skew %v server %q idle %v; want boot %s, skew against %s, idle 3s", s.GetRuntime().GetAgentBootId(), s.GetVersionSkew(), s.GetServerVersion(), s.GetIdleTimeout().AsDuration(), sb.GetRuntime().GetAgentBootId(), testServerVersion)
		}
	}
	if lines := p2.logLines("agent version differs", sb.GetId()); len(lines) != 1 || !strings.Contains(lines[0], `"level":"WARN"`) {
		t.Errorf("version skew warnings for %s: %q, want one at WARN", sb.GetId(), lines)
	}

	// SIGTERM: berthd stops cleanly and the sandbox runs on.
	if err := p2.signal(t, syscall.SIGTERM); err != nil {
		t.Errorf("berthd after SIGTERM: %v, want exit 0", err)
	}
	if rec, err := e.rt.Get(ctx, sb.GetId()); err != nil || !rec.Running {
		t.Fatalf("sandbox after berthd's SIGTERM: %+v, %v; want it running", rec, err)
	}

	// A new berthd rebuilds the idle timeout from the labels.
	p3 := startBerthd(t, e)
	start := time.Now()
	for {
		if _, err := e.rt.Get(ctx, sb.GetId()); err != nil {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("sandbox with a 3s idle timeout still exists %v after berthd restarted", time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("removed %v after the third start", time.Since(start))
	if lines := p3.logLines("sandbox expired", sb.GetId(), "idle-timeout"); len(lines) != 1 {
		t.Errorf("expiry log lines: %q, want one", lines)
	}
	for _, p := range []*berthdProc{p1, p2, p3} {
		if strings.Contains(p.log.String(), secret) {
			t.Errorf("berthd logged the env value %q", secret)
		}
	}
	p3.signal(t, syscall.SIGTERM)
}

// TestOrphansCleanedAtStart leaves a sandbox container without a task and
// a sandbox directory without a container, and checks that berthd removes
// both at start-up and logs each.
func TestOrphansCleanedAtStart(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "or")
	client, err := containerd.New(env.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), e.ns)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := client.NewContainer(ctx, "no-task",
		containerd.WithContainerLabels(map[string]string{"berth.dev/sandbox": "true", "berth.dev/image": baseImage}),
		containerd.WithNewSpec(oci.WithProcessArgs("/bin/true"))); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.stateDir, "s", "no-container"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.stateDir, "s", "no-task"), 0o700); err != nil {
		t.Fatal(err)
	}

	p := startBerthd(t, e)
	if _, err := client.LoadContainer(ctx, "no-task"); err == nil {
		t.Error("container without a task still exists after berthd started")
	}
	for _, dir := range []string{"no-task", "no-container"} {
		if _, err := os.Stat(filepath.Join(e.stateDir, "s", dir)); !os.IsNotExist(err) {
			t.Errorf("directory %s after berthd started: %v, want it removed", dir, err)
		}
	}
	if lines := p.logLines("removed sandbox at start-up", "no-task", "container without a running task"); len(lines) != 1 {
		t.Errorf("log lines for the container without a task: %q, want one", lines)
	}
	if lines := p.logLines("removed sandbox directory at start-up", "no-container"); len(lines) != 1 {
		t.Errorf("log lines for the directory without a container: %q, want one", lines)
	}
	p.signal(t, syscall.SIGTERM)
}

// TestWarmPool checks that a create matching the pool's spec is served from
// the pool, with the caller's labels and timeouts, that the pool refills in
// the background, and that other creates are not served from it.
func TestWarmPool(t *testing.T) {
	need(t)
	e := newInProcessEnv(t, "wp", warmPoolConfig())
	waitPool(t, e, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Pool members are not listed.
	list, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil || len(list.GetSandboxes()) != 0 {
		t.Errorf("ListSandboxes with only a pool member = %v, %v; want none", list.GetSandboxes(), err)
	}
	resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Labels: map[string]string{"team": "pool"}, IdleTimeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	sb := resp.GetSandbox()
	if !resp.GetFromWarmPool() || sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING || sb.GetLabels()["team"] != "pool" || sb.GetIdleTimeout().AsDuration() != time.Minute {
		t.Errorf("CreateSandbox = %v (from pool %v), want a running pool sandbox with label team=pool and idle 1m", sb, resp.GetFromWarmPool())
	}
	r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"hostname"}}})
	if err != nil || string(r.GetStdout()) != sb.GetId()+"\n" {
		t.Errorf("hostname in the pool sandbox = %q, %v; want %s", r.GetStdout(), err, sb.GetId())
	}
	list, err = e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{LabelSelector: map[string]string{"team": "pool"}})
	if err != nil || len(list.GetSandboxes()) != 1 || list.GetSandboxes()[0].GetId() != sb.GetId() {
		t.Errorf("ListSandboxes(team=pool) = %v, %v; want %s", list.GetSandboxes(), err, sb.GetId())
	}
	waitPool(t, e, 1) // refilled

	for name, req := range map[string]*berthv1.CreateSandboxRequest{
		"caller id": {SandboxId: shortID("nopool"), Image: baseImage},
		"env":       {Image: baseImage, Env: map[string]string{"A": "b"}},
		"user":      {Image: baseImage, User: "1000"},
	} {
		resp, err := e.sandboxes.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("CreateSandbox with %s: %v", name, err)
		}
		if resp.GetFromWarmPool() {
			t.Errorf("CreateSandbox with %s was served from the pool", name)
		}
	}
}

func warmPoolConfig() server.Config {
	return server.Config{WarmPool: map[string]int{baseImage: 1}}
}

// waitPool waits until e's pool holds n ready sandboxes of the base image.
func waitPool(t testing.TB, e *berthEnv, n int) {
	t.Helper()
	waitPoolOf(t, e, baseImage, n)
}

// waitPoolOf waits until e's pool holds n ready sandboxes of image.
func waitPoolOf(t testing.TB, e *berthEnv, image string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.svc.WarmPoolReady(image) < n {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool of %s has %d ready after 30s, want %d", image, e.svc.WarmPoolReady(image), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
