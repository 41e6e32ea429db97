package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// events is everything one Exec stream delivered, checked as it arrives:
// started first and once, output and dropped sequence numbers contiguous
// from the attach point, heartbeats carrying the last sequence number,
// nothing after exited.
type events struct {
	started    *berthv1.ExecStarted
	outputs    []*berthv1.ExecOutput
	dropped    []*berthv1.ExecDropped
	heartbeats []*berthv1.ExecHeartbeat
	stdout     []byte
	stderr     []byte
	lastSeq    uint64
	result     *berthv1.ExecResult
}

// add records resp; it reports whether the exec ended.
func (ev *events) add(t testing.TB, resp *berthv1.ExecResponse) bool {
	t.Helper()
	if ev.result != nil {
		t.Fatalf("event %v after exited", resp)
	}
	if ev.started == nil && resp.GetStarted() == nil {
		t.Fatalf("first event is %v, want started", resp)
	}
	switch e := resp.GetEvent().(type) {
	case *berthv1.ExecResponse_Started:
		if ev.started != nil {
			t.Fatalf("second started event %v", e.Started)
		}
		ev.started = e.Started
	case *berthv1.ExecResponse_Output:
		o := e.Output
		if o.GetSeq() != ev.lastSeq+1 {
			t.Fatalf("output seq %d after seq %d, want %d", o.GetSeq(), ev.lastSeq, ev.lastSeq+1)
		}
		ev.lastSeq = o.GetSeq()
		ev.outputs = append(ev.outputs, o)
		switch o.GetStream() {
		case berthv1.Stream_STREAM_STDOUT:
			ev.stdout = append(ev.stdout, o.GetData()...)
		case berthv1.Stream_STREAM_STDERR:
			ev.stderr = append(ev.stderr, o.GetData()...)
		default:
			t.Fatalf("output seq %d on stream %v", o.GetSeq(), o.GetStream())
		}
	case *berthv1.ExecResponse_Dropped:
		d := e.Dropped
		if d.GetFirstSeq() != ev.lastSeq+1 || d.GetLastSeq() < d.GetFirstSeq() {
			t.Fatalf("dropped %d..%d after seq %d", d.GetFirstSeq(), d.GetLastSeq(), ev.lastSeq)
		}
		ev.lastSeq = d.GetLastSeq()
		ev.dropped = append(ev.dropped, d)
	case *berthv1.ExecResponse_Heartbeat:
		if got := e.Heartbeat.GetLastSeq(); got != ev.lastSeq {
			t.Fatalf("heartbeat last_seq %d, want %d", got, ev.lastSeq)
		}
		ev.heartbeats = append(ev.heartbeats, e.Heartbeat)
	case *berthv1.ExecResponse_Exited:
		if e.Exited.GetResult() == nil {
			t.Fatalf("exited without a result")
		}
		ev.result = e.Exited.GetResult()
		return true
	default:
		t.Fatalf("unknown event %v", resp)
	}
	return false
}

// execConn is one Exec stream of a test.
type execConn struct {
	t      testing.TB
	stream berthv1.SandboxService_ExecClient
	cancel context.CancelFunc
	ev     events
}

// openExec opens an Exec stream on svc and sends first. since is the
// sequence number the stream's events continue from (an attach's
// since_seq).
func openExec(t testing.TB, svc berthv1.SandboxServiceClient, first *berthv1.ExecRequest, since uint64) *execConn {
	t.Helper()
	// A guard against a hang that cancels (a lost caller), not a gRPC
	// deadline: a deadline would become the command's timeout.
	ctx, cancel := context.WithCancel(context.Background())
	guard := time.AfterFunc(3*time.Minute, cancel)
	t.Cleanup(func() { guard.Stop(); cancel() })
	stream, err := svc.Exec(ctx)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	c := &execConn{t: t, stream: stream, cancel: cancel, ev: events{lastSeq: since}}
	c.send(first)
	return c
}

func (c *execConn) send(req *berthv1.ExecRequest) {
	c.t.Helper()
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("send %v: %v", req, err)
	}
}

// until receives until cond holds; the exec must not end first.
func (c *execConn) until(what string, cond func(*events) bool) {
	c.t.Helper()
	for !cond(&c.ev) {
		resp, err := c.stream.Recv()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v (stdout so far %q)", what, err, c.ev.stdout)
		}
		if c.ev.add(c.t, resp) {
			c.t.Fatalf("exec ended (%v) before %s (stdout %q)", c.ev.result, what, c.ev.stdout)
		}
	}
}

// stdoutHas is an until condition.
func stdoutHas(s string) func(*events) bool {
	return func(ev *events) bool { return strings.Contains(string(ev.stdout), s) }
}

// wait receives until exited and checks that the stream then ends OK.
func (c *execConn) wait() *events {
	c.t.Helper()
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.t.Fatalf("Recv before exited: %v (stdout %q, stderr %q)", err, c.ev.stdout, c.ev.stderr)
		}
		if c.ev.add(c.t, resp) {
			break
		}
	}
	if resp, err := c.stream.Recv(); !errors.Is(err, io.EOF) {
		c.t.Fatalf("after exited: %v, %v; want the stream to end OK", resp, err)
	}
	return &c.ev
}

// failure receives until the stream fails and returns its error.
func (c *execConn) failure() error {
	c.t.Helper()
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.t.Fatalf("stream ended OK, want an error")
			}
			return err
		}
		if c.ev.add(c.t, resp) {
			c.t.Fatalf("exec ended with %v, want the stream to fail", c.ev.result)
		}
	}
}

func startReq(sandboxID, execID string, spec *berthv1.ProcessSpec) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sandboxID, ExecId: execID, Process: spec}}}
}

func attachReq(sandboxID, execID string, since uint64) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{SandboxId: sandboxID, ExecId: execID, SinceSeq: since}}}
}

func stdinMsg(b []byte) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: b}}}
}

var closeStdinMsg = &berthv1.ExecRequest{Event: &berthv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}

func signalMsg(sig string) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: sig}}}
}

func resizeMsg(rows, cols uint32) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Resize{Resize: &berthv1.ExecResize{Rows: rows, Cols: cols}}}
}

// runExec starts spec on a new stream and collects it to the end.
func runExec(t testing.TB, svc berthv1.SandboxServiceClient, sandboxID, execID string, spec *berthv1.ProcessSpec) *events {
	t.Helper()
	return openExec(t, svc, startReq(sandboxID, execID, spec), 0).wait()
}

// xid returns a fresh exec id for the test.
func xid(t testing.TB) string {
	b := make([]byte, 3)
	rand.Read(b)
	name := regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(t.Name(), "_")
	return fmt.Sprintf("%.100s-%s", name, hex.EncodeToString(b))
}

func sh(cmd string) *berthv1.ProcessSpec { return &berthv1.ProcessSpec{ShellCommand: cmd} }

func bash(cmd string) *berthv1.ProcessSpec {
	return &berthv1.ProcessSpec{ShellCommand: cmd, Shell: berthv1.Shell_SHELL_BASH}
}

// listExecs returns the sandbox's execs by id.
func listExecs(t testing.TB, svc berthv1.SandboxServiceClient, sandboxID string) map[string]*berthv1.ExecInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := svc.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: sandboxID})
	if err != nil {
		t.Fatalf("ListExecs(%s): %v", sandboxID, err)
	}
	out := make(map[string]*berthv1.ExecInfo)
	for _, x := range resp.GetExecs() {
		out[x.GetExecId()] = x
	}
	return out
}

// poll calls cond every 20 ms until it holds or d passes, and reports
// whether it held.
func poll(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// wantStatus checks err's code and ErrorInfo reason, that its message
// contains every one of contains, and, when field is not empty, that its
// BadRequest names exactly that field.
func wantStatus(t testing.TB, err error, code codes.Code, reason, field string, contains ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != code || rpcstatus.Reason(err) != reason {
		t.Fatalf("error = %v (reason %q), want %v with reason %s", err, rpcstatus.Reason(err), code, reason)
	}
	for _, s := range contains {
		if !strings.Contains(st.Message(), s) {
			t.Errorf("message %q does not contain %q", st.Message(), s)
		}
	}
	if field == "" {
		return
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if len(fields) != 1 || fields[0] != field {
		t.Errorf("BadRequest fields = %q, want [%q] (message %q)", fields, field, st.Message())
	}
}

// startTunedServer serves a second berthd on the test's containerd
// namespace whose sandboxes get the agent settings in cfg (ExecHeartbeat,
// ExecRetention, ExecRingBytes), and returns a client for it.
func startTunedServer(t *testing.T, cfg runtime.Config) (addr string, svc berthv1.SandboxServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Address, cfg.Namespace, cfg.AgentBinary, cfg.Snapshotter = env.containerd, env.namespace, env.agentBinary, env.snapshotter
	cfg.StateDir = filepath.Join(env.dir, "st")
	rt, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	addr = serveService(t, server.Config{}, rt)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return addr, berthv1.NewSandboxServiceClient(conn)
}

// newSandboxOn creates a sandbox through svc and deletes it at cleanup.
func newSandboxOn(t *testing.T, svc berthv1.SandboxServiceClient, req *berthv1.CreateSandboxRequest) string {
	t.Helper()
	if req == nil {
		req = &berthv1.CreateSandboxRequest{}
	}
	req.Image = env.image
	return createSandboxOn(t, svc, req).GetId()
}

// createSandboxOn creates the sandbox req asks for through svc, of the
// base image unless req names one, deletes it at cleanup, and returns it.
func createSandboxOn(t *testing.T, svc berthv1.SandboxServiceClient, req *berthv1.CreateSandboxRequest) *berthv1.Sandbox {
	t.Helper()
	if req.Image == "" {
		req.Image = env.image
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := svc.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("CreateSandbox(%s): %v", req.Image, err)
	}
	id := resp.GetSandbox().GetId()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Errorf("DeleteSandbox(%s): %v", id, err)
		}
	})
	return resp.GetSandbox()
}
