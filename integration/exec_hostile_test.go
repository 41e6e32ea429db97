package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// TestCanceledStartKeepsItsPlace starts execs on a berthd that allows one
// exec per sandbox and cancels each stream right after the start went out,
// at varying moments: before, while and after the agent starts the
// process. However the cancel falls, berthd must never let a second exec
// run beside one it admitted: a start whose outcome berthd did not see
// keeps its place until berthd knows the exec is not running.
func TestCanceledStartKeepsItsPlace(t *testing.T) {
	need(t)
	capped := sandboxClient(t, startServer(t, server.Config{MaxExecsPerSandbox: 1, TaskRestartLimit: -1}))
	id := newSandbox(t, nil).GetId()
	running := func() int {
		out := string(run(t, id, "ps", "-o", "args").GetStdout())
		return strings.Count(out, "sleep 3600")
	}
	for i := range 12 {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := capped.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := &berthv1.ExecStart{SandboxId: id, ExecId: fmt.Sprintf("c%d", i), Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "3600"}}}
		if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: start}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i) * 700 * time.Microsecond) // where the cancel falls, not a wait
		cancel()
		settle(t, capped, id, fmt.Sprintf("c%d", i))
		if n := running(); n > 1 {
			t.Fatalf("after %d canceled starts %d execs run in the sandbox, at most 1 allowed", i+1, n)
		}
	}
	if running() == 0 {
		t.Fatalf("no canceled start ran at all: the test did not exercise a start the agent carried out")
	}
}

// TestCanceledStartWhileLaunching holds a start where its outcome is
// unknown to berthd: the agent has it, but its launcher (which forks every
// workload process) is stopped, so no answer comes. The caller then cancels.
// The start may still run — it does, once the launcher goes on — so berthd
// must keep the exec's place on a berthd that allows one exec per sandbox.
// TestCanceledStartKeepsItsPlace's cancels, at whatever moment, rarely
// fall in this window.
func TestCanceledStartWhileLaunching(t *testing.T) {
	need(t)
	var logs agentbin.Buffer
	// A canceled call is the caller's doing: its line is at DEBUG.
	debug := &slog.HandlerOptions{Level: slog.LevelDebug}
	// berthd waits for the answer to a start whose caller left as long as
	// the agent works on it, up to AgentBusyLimit: at the connect budget
	// here, so that it gives up (the window this test is about) in 3 s.
	capped := sandboxClient(t, serveServiceLog(t, server.Config{MaxExecsPerSandbox: 1, TaskRestartLimit: -1, ConnectBudget: 3 * time.Second, AgentBusyLimit: 3 * time.Second},
		env.rt, slog.New(slog.NewTextHandler(&logs, debug))))
	id := newSandbox(t, nil).GetId()
	run(t, id, "true") // the agent starts its launcher with the first exec
	agent := agentPID(t, id)
	launcher := agentbin.LauncherPID(agent)
	if launcher == 0 {
		t.Fatalf("no launcher among the children of agent %d", agent)
	}
	pipes := agentPipes(t, agent)

	if err := syscall.Kill(launcher, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	defer func() {
		if !continued {
			syscall.Kill(launcher, syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := capped.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := &berthv1.ExecStart{SandboxId: id, ExecId: "stalled", Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "3600"}}}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: start}}); err != nil {
		t.Fatal(err)
	}
	// The agent makes the process's pipes, then hands them to the stopped
	// launcher: a new pipe means the start reached the agent.
	if !poll(10*time.Second, func() bool { return len(newPipes(agentPipes(t, agent), pipes)) > 0 }) {
		t.Fatal("the agent made no pipes for the start within 10 s")
	}
	cancel()
	// Until berthd's Exec handler has returned, having decided about the
	// exec's place: a started event sent meanwhile would decide for it.
	if !poll(10*time.Second, func() bool {
		return strings.Contains(logs.String(), "grpc.method=Exec") && strings.Contains(logs.String(), "grpc.code=Canceled")
	}) {
		t.Fatalf("berthd logged no canceled Exec within 10 s:\n%s", logs.String())
	}
	if err := syscall.Kill(launcher, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued = true
	settle(t, capped, id, "stalled")
	out := string(run(t, id, "ps", "-o", "args").GetStdout())
	if n := strings.Count(out, "sleep 3600"); n != 1 {
		t.Errorf("%d execs of the canceled start run, want the one that was launched:\n%s", n, out)
	}
	// Its place is taken: another start is FLEET_BUSY, nothing runs beside.
	_, err = capped.Run(context.Background(), &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "3600"}}})
	if reason := rpcstatus.Reason(err); reason != rpcstatus.ReasonFleetBusy {
		t.Errorf("a second start beside the canceled one: %v, want FLEET_BUSY", err)
	}
}

// sandboxClient dials berthd at addr and returns its SandboxService; the
// connection closes at cleanup.
func sandboxClient(t *testing.T, addr string) berthv1.SandboxServiceClient {
	t.Helper()
	return berthv1.NewSandboxServiceClient(plainConn(t, addr))
}

// plainConn is a plaintext gRPC connection to berthd at addr, closed at
// cleanup.
func plainConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// agentPipes returns the pipes host process pid holds open, by inode.
func agentPipes(t *testing.T, pid int) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pipes := make(map[string]bool)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(target, "pipe:") {
			pipes[target] = true
		}
	}
	return pipes
}

// newPipes returns the pipes in now that were not in before.
func newPipes(now, before map[string]bool) []string {
	var added []string
	for p := range now {
		if !before[p] {
			added = append(added, p)
		}
	}
	return added
}

// settle waits until the capped berthd (one exec per sandbox) has decided
// what a canceled start of execID left: either the exec runs in the agent
// and holds the sandbox's one place (a probe start is FLEET_BUSY), or the
// place is free (the probe runs) and nothing runs. Until then the start may
// still be on its way, and counting processes would prove nothing.
func settle(t *testing.T, capped berthv1.SandboxServiceClient, sandboxID, execID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last string
	if !poll(30*time.Second, func() bool {
		execs := listExecs(t, env.sandboxes, sandboxID)
		runs := 0
		for _, x := range execs {
			if x.GetState() == berthv1.ExecState_EXEC_STATE_RUNNING {
				runs++
			}
		}
		_, err := capped.Run(ctx, &berthv1.RunRequest{SandboxId: sandboxID, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
		switch reason := rpcstatus.Reason(err); {
		case reason == rpcstatus.ReasonFleetBusy:
			last = fmt.Sprintf("the place is taken, %d execs run (%s listed: %v)", runs, execID, execs[execID] != nil)
			return runs > 0
		case err == nil:
			last = fmt.Sprintf("the place is free, %d execs run", runs)
			return runs == 0
		default:
			t.Fatalf("probe Run on the capped berthd: %v", err)
			return false
		}
	}) {
		t.Fatalf("the canceled start of %s did not settle within 30 s: %s", execID, last)
	}
}

// TestExecFieldNames sends invalid starts on the public Exec stream: the
// BadRequest names the field where the caller put it (start.process...),
// not where the agent's own API has it, and Run names it in RunRequest.
func TestExecFieldNames(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	tests := []struct {
		process *berthv1.ProcessSpec
		want    string
	}{
		{&berthv1.ProcessSpec{}, "process.argv"},
		{&berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}}, "process.env"},
		{&berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "relative"}, "process.cwd"},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stream, err := env.sandboxes.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: id, Process: tt.process}}})
		_, err = stream.Recv()
		if got := badRequestField(err); got != "start."+tt.want {
			t.Errorf("Exec start %v: %v blames %q, want %q", tt.process, err, got, "start."+tt.want)
		}
		_, err = env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: tt.process})
		if got := badRequestField(err); got != tt.want {
			t.Errorf("Run %v: %v blames %q, want %q", tt.process, err, got, tt.want)
		}
		cancel()
	}
}

// badRequestField returns the field the BadRequest of err blames, or "".
func badRequestField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}
