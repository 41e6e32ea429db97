package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berth-sandbox/berth/internal/agentbin"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// testVersion is linked into the agent binary under test.
const testVersion = "v0.0.0-test"

// agentBin is the berth-agent binary built by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Getenv(inProcessEnv) != "" {
		// A child running in-process tests: it needs no binary.
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "agbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if agentBin, err = agentbin.Build(dir, "-X github.com/berth-sandbox/berth/agent.Version="+testVersion); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// testAgent is a running berth-agent process and a client connected to it.
type testAgent struct {
	cmd    *exec.Cmd
	pid    int
	dir    string // holds the socket; usable as scratch space
	client agentv1.AgentServiceClient
	stderr *agentbin.Buffer
	// signalPid receives the SIGTERM that stops the agent: pid, unless a
	// wrapper runs the agent.
	signalPid int
	exited    chan struct{} // closed when cmd.Wait returned
	err       error         // cmd.Wait's error, set before exited closes
}

// startAgent starts the agent binary with flags (plus --socket) and dials
// it. At cleanup it stops the agent with SIGTERM and fails the test unless
// the agent exits 0 within 10s; its log is shown on failure.
func startAgent(t testing.TB, flags ...string) *testAgent {
	t.Helper()
	// sun_path holds 108 bytes: keep the socket path short.
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return startAgentAt(t, dir, flags...)
}

// startAgentAt is startAgent with the socket in dir.
func startAgentAt(t testing.TB, dir string, flags ...string) *testAgent {
	t.Helper()
	return startAgentCmd(t, dir, nil, flags...)
}

// startAgentCmd is startAgentAt with the agent run by the command prefix
// (e.g. unshare), when not nil.
func startAgentCmd(t testing.TB, dir string, prefix []string, flags ...string) *testAgent {
	t.Helper()
	return startAgentBinary(t, agentBin, dir, prefix, flags...)
}

// startAgentBinary is startAgentCmd running the agent binary bin.
func startAgentBinary(t testing.TB, bin, dir string, prefix []string, flags ...string) *testAgent {
	t.Helper()
	sock := filepath.Join(dir, "a.sock")
	a := &testAgent{dir: dir, stderr: &agentbin.Buffer{}, exited: make(chan struct{})}
	args := append(append(prefix, bin, "--socket", sock, "--workdir", filepath.Join(dir, "work")), flags...)
	// BERTH_TEST_AGENT_FLAGS runs every agent with more flags, e.g.
	// --reaping-launcher for the whole suite in the launcher mode gVisor
	// gets.
	args = append(args, strings.Fields(os.Getenv("BERTH_TEST_AGENT_FLAGS"))...)
	a.cmd = exec.Command(args[0], args[1:]...)
	a.cmd.Stderr = a.stderr
	a.cmd.Env = append(agentEnv(), "BERTH_TEST_BASE=from-agent")
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.pid = a.cmd.Process.Pid
	a.signalPid = a.pid
	go func() { a.err = a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() { a.stop(t) })

	// Retry fast while the agent creates its socket.
	fast := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(fast))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	a.client = agentv1.NewAgentServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The socket appears when the agent is ready; WaitForReady rides out
	// the start-up.
	if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("agent did not answer Info: %v\nagent log:\n%s", err, a.stderr)
	}
	return a
}

// stop sends SIGTERM and expects a clean exit 0.
func (a *testAgent) stop(t testing.TB) {
	select {
	case <-a.exited:
	default:
		_ = syscall.Kill(a.signalPid, syscall.SIGTERM)
	}
	select {
	case <-a.exited:
		if a.err != nil {
			t.Errorf("agent exit: %v, want exit 0\nagent log:\n%s", a.err, a.stderr)
		}
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
		t.Errorf("agent did not stop within 10s of SIGTERM\nagent log:\n%s", a.stderr)
	}
	if strings.Contains(a.stderr.String(), "DATA RACE") {
		t.Errorf("agent reported a data race:\n%s", a.stderr)
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", a.stderr)
	}
}

// execRun is everything one Exec stream delivered.
type execRun struct {
	started    *berthv1.ExecStarted
	outputs    []*berthv1.ExecOutput
	dropped    []*berthv1.ExecDropped
	heartbeats []*berthv1.ExecHeartbeat
	result     *berthv1.ExecResult
	stdout     []byte
	stderr     []byte
	lastSeq    uint64 // the last sequence number seen, output or dropped
}

// droppedBytes sums the bytes of every ExecDropped.
func (r *execRun) droppedBytes() uint64 {
	var n uint64
	for _, d := range r.dropped {
		n += d.GetLostBytes()
	}
	return n
}

// recvEvent receives one event into r and checks the stream's invariants:
// started first and only once, sequence numbers contiguous from since+1
// (dropped ranges included), nothing after exited. It returns done when
// exited arrived.
func (r *execRun) recvEvent(t testing.TB, resp *agentv1.ExecResponse) (done bool) {
	t.Helper()
	if r.started == nil && resp.GetStarted() == nil {
		t.Fatalf("first event is %v, want started", resp)
	}
	switch ev := resp.GetEvent().(type) {
	case *agentv1.ExecResponse_Started:
		if r.started != nil {
			t.Fatalf("second started event %v", ev.Started)
		}
		r.started = ev.Started
	case *agentv1.ExecResponse_Output:
		o := ev.Output
		if o.GetSeq() != r.lastSeq+1 {
			t.Fatalf("output seq %d after seq %d, want %d", o.GetSeq(), r.lastSeq, r.lastSeq+1)
		}
		r.lastSeq = o.GetSeq()
		r.outputs = append(r.outputs, o)
		switch o.GetStream() {
		case berthv1.Stream_STREAM_STDOUT:
			r.stdout = append(r.stdout, o.GetData()...)
		case berthv1.Stream_STREAM_STDERR:
			r.stderr = append(r.stderr, o.GetData()...)
		default:
			t.Fatalf("output seq %d has stream %v", o.GetSeq(), o.GetStream())
		}
	case *agentv1.ExecResponse_Dropped:
		d := ev.Dropped
		if d.GetFirstSeq() != r.lastSeq+1 || d.GetLastSeq() < d.GetFirstSeq() {
			t.Fatalf("dropped %d..%d after seq %d, want a range from %d", d.GetFirstSeq(), d.GetLastSeq(), r.lastSeq, r.lastSeq+1)
		}
		r.lastSeq = d.GetLastSeq()
		r.dropped = append(r.dropped, d)
	case *agentv1.ExecResponse_Heartbeat:
		if got := ev.Heartbeat.GetLastSeq(); got != r.lastSeq {
			t.Fatalf("heartbeat last_seq = %d, want %d", got, r.lastSeq)
		}
		r.heartbeats = append(r.heartbeats, ev.Heartbeat)
	case *agentv1.ExecResponse_Exited:
		r.result = ev.Exited.GetResult()
		return true
	default:
		t.Fatalf("unknown event %v", resp)
	}
	return false
}

// collect receives until exited and checks that the stream then ends.
func collect(t testing.TB, stream agentv1.AgentService_ExecClient, r *execRun) *execRun {
	t.Helper()
	if r == nil {
		r = &execRun{}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv before exited: %v", err)
		}
		if r.recvEvent(t, resp) {
			break
		}
	}
	if resp, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after exited = %v, %v; want io.EOF", resp, err)
	}
	return r
}

// startExec opens an Exec stream and sends a start.
func (a *testAgent) startExec(t testing.TB, ctx context.Context, id string, spec *berthv1.ProcessSpec) agentv1.AgentService_ExecClient {
	t.Helper()
	stream, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: id, Process: spec}}}); err != nil {
		t.Fatalf("send start: %v", err)
	}
	return stream
}

// attachExec opens an Exec stream and sends an attach.
func (a *testAgent) attachExec(t testing.TB, ctx context.Context, id string, since uint64) agentv1.AgentService_ExecClient {
	t.Helper()
	stream, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: id, SinceSeq: since}}}); err != nil {
		t.Fatalf("send attach: %v", err)
	}
	return stream
}

// run starts an exec and collects it to the end.
func (a *testAgent) run(t testing.TB, id string, spec *berthv1.ProcessSpec) *execRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := a.startExec(t, ctx, id, spec)
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("CloseSend: %v", err)
	}
	return collect(t, stream, nil)
}

// startErr starts an exec that must fail and returns the stream's error.
func (a *testAgent) startErr(t testing.TB, id string, spec *berthv1.ProcessSpec) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := a.startExec(t, ctx, id, spec)
	resp, err := stream.Recv()
	if err == nil {
		t.Fatalf("start %s: got event %v, want an error", id, resp)
	}
	return err
}

// argv returns a ProcessSpec running argv.
func argv(args ...string) *berthv1.ProcessSpec { return &berthv1.ProcessSpec{Argv: args} }

// shell returns a ProcessSpec running cmd with /bin/sh -c.
func shell(cmd string) *berthv1.ProcessSpec { return &berthv1.ProcessSpec{ShellCommand: cmd} }

// runBinary runs a program to completion and returns its stdout.
func runBinary(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = agentEnv()
	out, err := cmd.Output()
	return string(out), err
}

// agentEnv is the environment agents run with. A race-enabled agent would
// otherwise sleep 1s at exit (GORACE atexit_sleep_ms).
func agentEnv() []string {
	return append(os.Environ(), "GORACE=atexit_sleep_ms=0 halt_on_error=1")
}
