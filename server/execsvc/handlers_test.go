package execsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runout"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
	berthstatus "github.com/berth-sandbox/berth/server/status"
)

// The handlers are tested end to end without containerd: a real gRPC
// server (bufconn) serves the Service behind the error boundary of
// server/status, the caller is a real berth.v1 client, and the sandbox's
// agent is a real gRPC server (fakeAgent) reached through fakeReacher. The
// runtime registry and task events are the real engines, in memory.

const (
	testSandbox = "sb-1"
	testBoot    = "boot-current"
	oldBoot     = "boot-earlier"
	// callTimeout only keeps a broken test from hanging; no test waits it out.
	callTimeout = 20 * time.Second
)

// testRuntime's task is the test process itself: openAgentExec reads the
// task's /proc entry before it sends a start (procfs.Exited), and a pid of
// no process is a task that exited.
var testRuntime = apierr.Runtime{BootID: testBoot, TaskPID: uint32(os.Getpid()), AgentVersion: "agent-test"}

// fakeAgent is a sandbox's agent: each RPC runs the function the test set,
// and counts its calls.
type fakeAgent struct {
	agentv1.UnimplementedAgentServiceServer

	mu          sync.Mutex
	exec        func(agentv1.AgentService_ExecServer) error
	listExecs   func(*agentv1.ListExecsRequest) (*agentv1.ListExecsResponse, error)
	signalExec  func(*agentv1.SignalExecRequest) (*agentv1.SignalExecResponse, error)
	portForward func(agentv1.AgentService_PortForwardServer) error
	writeStdin  func(*agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error)
	calls       int
}

func (a *fakeAgent) WriteStdin(_ context.Context, req *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	a.call()
	a.mu.Lock()
	f := a.writeStdin
	a.mu.Unlock()
	if f == nil {
		return nil, grpcstatus.Error(codes.Unimplemented, "test agent: no stdin")
	}
	return f(req)
}

func (a *fakeAgent) call() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
}

func (a *fakeAgent) Calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func (a *fakeAgent) Exec(stream agentv1.AgentService_ExecServer) error {
	a.call()
	a.mu.Lock()
	f := a.exec
	a.mu.Unlock()
	if f == nil {
		return grpcstatus.Error(codes.Unimplemented, "test agent: no exec")
	}
	return f(stream)
}

func (a *fakeAgent) ListExecs(_ context.Context, req *agentv1.ListExecsRequest) (*agentv1.ListExecsResponse, error) {
	a.call()
	a.mu.Lock()
	f := a.listExecs
	a.mu.Unlock()
	if f == nil {
		return nil, grpcstatus.Error(codes.Unimplemented, "test agent: no list")
	}
	return f(req)
}

func (a *fakeAgent) SignalExec(_ context.Context, req *agentv1.SignalExecRequest) (*agentv1.SignalExecResponse, error) {
	a.call()
	a.mu.Lock()
	f := a.signalExec
	a.mu.Unlock()
	if f == nil {
		return nil, grpcstatus.Error(codes.Unimplemented, "test agent: no signal")
	}
	return f(req)
}

func (a *fakeAgent) PortForward(stream agentv1.AgentService_PortForwardServer) error {
	a.call()
	a.mu.Lock()
	f := a.portForward
	a.mu.Unlock()
	if f == nil {
		return grpcstatus.Error(codes.Unimplemented, "test agent: no port forward")
	}
	return f(stream)
}

// fakeReacher reaches the fake agent, or fails with err.
type fakeReacher struct {
	client agentv1.AgentServiceClient

	mu      sync.Mutex
	runtime apierr.Runtime
	err     error
	reached []string // "sandbox/exec" of each Reach and Agent

	watches  *agentreach.Reacher // nil: NewWatch returns nil
	watchPID uint32              // the process watches watch
}

func (r *fakeReacher) Reach(_ context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, apierr.Runtime, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reached = append(r.reached, sandboxID+"/"+execID)
	if r.err != nil {
		return nil, apierr.Runtime{}, r.err
	}
	return r.client, r.runtime, nil
}

func (r *fakeReacher) Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error) {
	agent, _, err := r.Reach(ctx, sandboxID, "")
	return agent, err
}

// NewWatch returns the watch of watchPID through the real engine watches,
// when set: the test's stand-in for a busy agent. Otherwise it returns nil:
// the watch is read only when the agent stays silent for the whole connect
// budget, which the tests' budget never lets happen.
func (r *fakeReacher) PauseWatch(string) (bool, <-chan struct{}) { return false, nil }

func (r *fakeReacher) NewWatch(sandboxID string, _ uint32) *agentreach.Watch {
	if r.watches == nil {
		return nil
	}
	return r.watches.NewWatch(sandboxID, r.watchPID)
}

func (r *fakeReacher) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *fakeReacher) Reached() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reached...)
}

// fakeStore is containerd's record of the sandbox; the tests never break an
// agent stream, so only the exec guard's probe would read it.
type fakeStore struct{}

func (fakeStore) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	return runtime.Sandbox{ID: id, Running: true, TaskPID: testRuntime.TaskPID}, nil
}

// SocketPath names no socket: a watch (agentreach) then sees no frames.
func (fakeStore) SocketPath(string) string { return "" }

func (fakeStore) Pause(context.Context, string) error  { return nil }
func (fakeStore) Resume(context.Context, string) error { return nil }

func (fakeStore) Hibernate(context.Context, string, runtime.KeepMemory) (runtime.Hibernation, error) {
	return runtime.Hibernation{}, nil
}

// fakeAdmitter is a real admit.Capacity without limits, or refuses with err.
type fakeAdmitter struct {
	*admit.Capacity

	mu    sync.Mutex
	err   error
	calls int
}

func (a *fakeAdmitter) AdmitExec(sandboxID string) (*admit.ExecSlot, error) {
	a.mu.Lock()
	a.calls++
	err := a.err
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return a.Capacity.AdmitExec(sandboxID)
}

func (a *fakeAdmitter) refuse(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

func (a *fakeAdmitter) Calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// fakeBackground counts the work that outlives a request, to wait for it.
type fakeBackground struct {
	ctx context.Context
	wg  sync.WaitGroup
}

func (b *fakeBackground) Context() (context.Context, func()) {
	b.wg.Add(1)
	return b.ctx, b.wg.Done
}

// fakeObserver sums the output the handlers report.
type fakeObserver struct {
	mu      sync.Mutex
	sent    map[string]int
	dropped uint64
}

func (o *fakeObserver) OutputSent(stream string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent[stream] += n
}

func (o *fakeObserver) OutputDropped(n uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped += n
}

func (o *fakeObserver) Dropped() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped
}

func (o *fakeObserver) Sent(stream string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sent[stream]
}

// sandboxServer serves the process RPCs of berth.v1.SandboxService.
type sandboxServer struct {
	berthv1.UnimplementedSandboxServiceServer
	svc *Service
}

func (s sandboxServer) Exec(stream berthv1.SandboxService_ExecServer) error {
	return s.svc.Exec(stream)
}

func (s sandboxServer) Run(ctx context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	return s.svc.Run(ctx, req)
}

func (s sandboxServer) ListExecs(ctx context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	return s.svc.ListExecs(ctx, req)
}

func (s sandboxServer) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	return s.svc.SignalExec(ctx, req)
}

func (s sandboxServer) PortForward(stream berthv1.SandboxService_PortForwardServer) error {
	return s.svc.PortForward(stream)
}

func (s sandboxServer) StartExec(req *berthv1.StartExecRequest, stream berthv1.SandboxService_StartExecServer) error {
	return s.svc.StartExec(req, stream)
}

func (s sandboxServer) WriteExecStdin(ctx context.Context, req *berthv1.WriteExecStdinRequest) (*berthv1.WriteExecStdinResponse, error) {
	return s.svc.WriteExecStdin(ctx, req)
}

func (s sandboxServer) ResizeExec(ctx context.Context, req *berthv1.ResizeExecRequest) (*berthv1.ResizeExecResponse, error) {
	return s.svc.ResizeExec(ctx, req)
}

type harness struct {
	cfg      Config
	agent    *fakeAgent
	reach    *fakeReacher
	ids      *runtimes.Registry
	events   *runtimes.TaskEvents
	capacity *fakeAdmitter
	budget   *runout.Budget
	life     *fakeBackground
	obs      *fakeObserver
	ports    portDialer // nil: the agent dials every forwarded port
	client   berthv1.SandboxServiceClient
}

// newHarness serves a Service over the fakes; runBudget is the server's
// Run buffer budget in bytes (0: none).
func newHarness(t *testing.T, runBudget uint64) *harness {
	t.Helper()
	return newHarnessWith(t, runBudget, nil)
}

// newHarnessWith is newHarness with setup applied to the harness before the
// Service is made (its config, its reacher's watches).
func newHarnessWith(t *testing.T, runBudget uint64, setup func(*harness)) *harness {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	h := &harness{
		cfg: Config{ConnectBudget: time.Minute, BusyRetryDelay: 3 * time.Second,
			RunStdoutBytes: 1 << 20, RunStderrBytes: 1 << 20, RunMaxOutputBytes: 4 << 20},
		agent:    &fakeAgent{},
		ids:      runtimes.NewRegistry("", log),
		events:   runtimes.NewTaskEvents(nil, log),
		capacity: &fakeAdmitter{Capacity: admit.New(admit.Limits{}, nil, nil)},
		budget:   runout.NewBudget(runBudget, 0, 0),
		obs:      &fakeObserver{sent: map[string]int{}},
	}

	agentSrv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(agentSrv, h.agent)
	agentConn := serveBufconn(t, agentSrv)
	h.reach = &fakeReacher{client: agentv1.NewAgentServiceClient(agentConn), runtime: testRuntime}
	if setup != nil {
		setup(h)
	}

	bgCtx, bgCancel := context.WithCancel(context.Background())
	h.life = &fakeBackground{ctx: bgCtx}
	svc := New(h.cfg, Deps{Store: fakeStore{}, Reach: h.reach, Events: h.events, Registry: h.ids, Capacity: h.capacity,
		RunBuffers: h.budget, Background: h.life, Observer: h.obs, Ports: h.ports}, log)
	boundary := &berthstatus.Boundary{Log: log, ConnectBudget: h.cfg.ConnectBudget, ServerVersion: "test"}
	srv := grpc.NewServer(append(wire.ServerOptions(),
		grpc.ChainUnaryInterceptor(boundary.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(boundary.StreamInterceptor()))...)
	berthv1.RegisterSandboxServiceServer(srv, sandboxServer{svc: svc})
	h.client = berthv1.NewSandboxServiceClient(serveBufconn(t, srv))
	// Cleanups run last first: the background work ends before the servers
	// stop.
	t.Cleanup(func() {
		bgCancel()
		h.life.wg.Wait()
	})
	return h
}

// serveBufconn serves srv on an in-memory listener and returns a
// connection to it; both end with the test.
func serveBufconn(t *testing.T, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatalf("dial bufconn: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	return conn
}

// waitBackground waits for the work that outlived its request.
func waitBackground(t *testing.T, h *harness) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		h.life.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(callTimeout):
		t.Fatal("background work did not end")
	}
}

func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// want is the status a call must end with.
type want struct {
	code   codes.Code
	reason string
	// field is the BadRequest violation's field and the ErrorInfo
	// metadata "field" of an INVALID_ARGUMENT.
	field string
	// meta are ErrorInfo metadata entries that must be present.
	meta map[string]string
}

// checkStatus checks that err is the status w describes, and returns it.
func checkStatus(t *testing.T, err error, w want) *grpcstatus.Status {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded; want %v %s", w.code, w.reason)
	}
	st, ok := grpcstatus.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	if st.Code() != w.code || rpcstatus.Reason(err) != w.reason {
		t.Fatalf("status %v %q (%q); want %v %q", st.Code(), rpcstatus.Reason(err), st.Message(), w.code, w.reason)
	}
	var info *errdetails.ErrorInfo
	var violations []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			violations = append(violations, d.GetFieldViolations()...)
		}
	}
	if info == nil || info.GetDomain() != rpcstatus.Domain {
		t.Fatalf("status %v has no berth ErrorInfo: %v", st.Code(), st.Details())
	}
	if w.code == codes.InvalidArgument {
		if len(violations) != 1 || violations[0].GetField() != w.field {
			t.Errorf("BadRequest violations %v; want one naming %q", violations, w.field)
		}
		if got := info.GetMetadata()["field"]; got != w.field {
			t.Errorf("ErrorInfo metadata field = %q; want %q", got, w.field)
		}
		if !strings.HasPrefix(st.Message(), w.field+": ") {
			t.Errorf("message %q does not start with %q", st.Message(), w.field+": ")
		}
	}
	for k, v := range w.meta {
		if got := info.GetMetadata()[k]; got != v {
			t.Errorf("ErrorInfo metadata %s = %q; want %q (metadata %v)", k, got, v, info.GetMetadata())
		}
	}
	return st
}

// detail returns st's detail of type T.
func detail[T any](t *testing.T, st *grpcstatus.Status) T {
	t.Helper()
	for _, d := range st.Details() {
		if v, ok := d.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("status %v has no %T detail: %v", st.Code(), zero, st.Details())
	return zero
}

func exitCode(c int32) *berthv1.ExecResult { return &berthv1.ExecResult{ExitCode: proto.Int32(c)} }

func startMsg(sandboxID, execID string, p *berthv1.ProcessSpec) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sandboxID, ExecId: execID, Process: p}}}
}

func attachMsg(sandboxID, execID string, since uint64) *berthv1.ExecRequest {
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{SandboxId: sandboxID, ExecId: execID, SinceSeq: since}}}
}

// echo's timeout is below the calls' deadline, which therefore leaves it
// as it is (validate.WithCallerDeadline).
var echo = &berthv1.ProcessSpec{Argv: []string{"echo", "hello"}, Timeout: durationpb.New(5 * time.Second)}

// execCall sends msgs on an Exec stream (none: the caller closes at once)
// and returns the events until the stream ended, and its error (nil for OK).
func execCall(t *testing.T, h *harness, msgs ...*berthv1.ExecRequest) ([]*berthv1.ExecResponse, error) {
	t.Helper()
	stream, err := h.client.Exec(callContext(t))
	if err != nil {
		t.Fatalf("open Exec: %v", err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("send: %v", err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("close send: %v", err)
	}
	var got []*berthv1.ExecResponse
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, ev)
	}
}

// agentSends returns an agent exec that takes the opening message (to
// opened), sends events and returns.
func agentSends(opened chan<- *agentv1.ExecRequest, events ...*agentv1.ExecResponse) func(agentv1.AgentService_ExecServer) error {
	return func(stream agentv1.AgentService_ExecServer) error {
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		opened <- first
		for _, ev := range events {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		return nil
	}
}

func started(execID string, pid int64) *agentv1.ExecResponse {
	return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &berthv1.ExecStarted{ExecId: execID, Pid: pid}}}
}

func output(seq uint64, s berthv1.Stream, data string) *agentv1.ExecResponse {
	return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: s, Data: []byte(data)}}}
}

func exited(res *berthv1.ExecResult) *agentv1.ExecResponse {
	return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}}
}

func TestExecRefused(t *testing.T) {
	notFound := fmt.Errorf("look up sandbox %s: %w", testSandbox, runtime.ErrSandboxNotFound)
	busy := &apierr.FleetBusy{SandboxID: testSandbox, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS,
		Limit: 4, InUse: 4, Requested: 1, RetryDelay: 2 * time.Second}
	unreachable := &apierr.Unreachable{SandboxID: testSandbox, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT,
		TaskRunning: true, Runtime: testRuntime, Waited: time.Second, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, What: "the agent did not answer"}
	for _, tc := range []struct {
		name  string
		setup func(*testing.T, *harness)
		msgs  []*berthv1.ExecRequest
		want  want
		// reached: the sandbox's agent was looked up.
		reached bool
		check   func(*testing.T, *harness, *grpcstatus.Status)
	}{
		{name: "stream ends before the first message", want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "event"}},
		{name: "first message stdin", msgs: []*berthv1.ExecRequest{{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte("x")}}}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "event"}},
		{name: "first message empty", msgs: []*berthv1.ExecRequest{{}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "event"}},
		{name: "start without process", msgs: []*berthv1.ExecRequest{startMsg(testSandbox, "ex-1", nil)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.process"}},
		{name: "start with bad exec id", msgs: []*berthv1.ExecRequest{startMsg(testSandbox, "ex 1/..", echo)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.exec_id"}},
		{name: "start with bad process timeout", msgs: []*berthv1.ExecRequest{startMsg(testSandbox, "ex-1", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(100 * time.Hour)})},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.process.timeout"}},
		{name: "start with bad sandbox id", msgs: []*berthv1.ExecRequest{startMsg("Not_A_Sandbox", "ex-1", echo)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "start without sandbox id", msgs: []*berthv1.ExecRequest{startMsg("", "ex-1", echo)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "attach with bad exec id", msgs: []*berthv1.ExecRequest{attachMsg(testSandbox, "", 0)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "attach.exec_id"}},
		{name: "attach with bad sandbox id", msgs: []*berthv1.ExecRequest{attachMsg("-x", "ex-1", 0)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "start in a missing sandbox", setup: func(t *testing.T, h *harness) { h.reach.fail(notFound) },
			msgs:    []*berthv1.ExecRequest{startMsg(testSandbox, "ex-1", echo)},
			want:    want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-1"}},
			reached: true},
		{name: "attach in a missing sandbox", setup: func(t *testing.T, h *harness) { h.reach.fail(notFound) },
			msgs:    []*berthv1.ExecRequest{attachMsg(testSandbox, "ex-1", 0)},
			want:    want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-1"}},
			reached: true},
		{name: "agent unreachable", setup: func(t *testing.T, h *harness) { h.reach.fail(unreachable) },
			msgs:    []*berthv1.ExecRequest{startMsg(testSandbox, "ex-1", echo)},
			want:    want{code: codes.Unavailable, reason: rpcstatus.ReasonUnreachable, meta: map[string]string{"sandbox_id": testSandbox, "cause": "UNREACHABLE_CAUSE_CONNECT_TIMEOUT"}},
			reached: true,
			check: func(t *testing.T, _ *harness, st *grpcstatus.Status) {
				d := detail[*berthv1.Unreachable](t, st)
				if d.GetRuntime().GetAgentBootId() != testBoot || d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || d.GetServerVersion() != "test" {
					t.Errorf("Unreachable detail %v", d)
				}
			}},
		{name: "start of an exec id of an earlier runtime",
			setup:   func(t *testing.T, h *harness) { mustRecord(t, h, "ex-old", oldBoot) },
			msgs:    []*berthv1.ExecRequest{startMsg(testSandbox, "ex-old", echo)},
			want:    want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonStaleHandle, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-old"}},
			reached: true,
			check:   checkStale},
		{name: "attach to an exec id of an earlier runtime",
			setup:   func(t *testing.T, h *harness) { mustRecord(t, h, "ex-old", oldBoot) },
			msgs:    []*berthv1.ExecRequest{attachMsg(testSandbox, "ex-old", 3)},
			want:    want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonStaleHandle, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-old"}},
			reached: true,
			check:   checkStale},
		{name: "no capacity", setup: func(t *testing.T, h *harness) { h.capacity.refuse(busy) },
			msgs:    []*berthv1.ExecRequest{startMsg(testSandbox, "ex-1", echo)},
			want:    want{code: codes.ResourceExhausted, reason: rpcstatus.ReasonFleetBusy, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-1", "resource": "CAPACITY_RESOURCE_SANDBOX_EXECS"}},
			reached: true,
			check: func(t *testing.T, h *harness, st *grpcstatus.Status) {
				d := detail[*berthv1.FleetBusy](t, st)
				if d.GetLimit() != 4 || d.GetInUse() != 4 || d.GetRequested() != 1 || d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED {
					t.Errorf("FleetBusy detail %v", d)
				}
				if got := detail[*errdetails.RetryInfo](t, st).GetRetryDelay().AsDuration(); got != 2*time.Second {
					t.Errorf("RetryInfo delay %v; want 2s", got)
				}
				if _, known := h.ids.ExecRuntime(testSandbox, "ex-1"); known {
					t.Error("a refused start was recorded in the runtime journal")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0) // its agent has no exec: any call is counted and fails
			if tc.setup != nil {
				tc.setup(t, h)
			}
			events, err := execCall(t, h, tc.msgs...)
			if len(events) != 0 {
				t.Errorf("events before the error: %v", events)
			}
			st := checkStatus(t, err, tc.want)
			if got := len(h.reach.Reached()) > 0; got != tc.reached {
				t.Errorf("agent looked up: %v; want %v", got, tc.reached)
			}
			if n := h.agent.Calls(); n != 0 {
				t.Errorf("agent called %d times; want none", n)
			}
			if sb, all := h.capacity.Running(testSandbox); sb != 0 || all != 0 {
				t.Errorf("exec slots held after the refusal: %d in the sandbox, %d in all", sb, all)
			}
			if tc.check != nil {
				tc.check(t, h, st)
			}
		})
	}
}

func mustRecord(t *testing.T, h *harness, execID, bootID string) {
	t.Helper()
	if _, err := h.ids.RecordExec(testSandbox, execID, bootID); err != nil {
		t.Fatalf("record exec: %v", err)
	}
}

func checkStale(t *testing.T, _ *harness, st *grpcstatus.Status) {
	t.Helper()
	d := detail[*berthv1.StaleHandle](t, st)
	if d.GetHandleRuntime().GetAgentBootId() != oldBoot || d.GetCurrentRuntime().GetAgentBootId() != testBoot || d.GetCurrentRuntime().GetTaskPid() != testRuntime.TaskPID {
		t.Errorf("StaleHandle detail %v; want handle %s, current %s", d, oldBoot, testBoot)
	}
}

func TestExecStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		execID string // "": berthd mints one
	}{
		{"caller's exec id", "ex-happy"},
		{"minted exec id", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			opened := make(chan *agentv1.ExecRequest, 1)
			h.agent.exec = func(stream agentv1.AgentService_ExecServer) error {
				first, err := stream.Recv()
				if err != nil {
					return err
				}
				opened <- first
				id := first.GetStart().GetExecId()
				for _, ev := range []*agentv1.ExecResponse{
					started(id, 77),
					output(1, berthv1.Stream_STREAM_STDOUT, "hello, world\n"),
					output(2, berthv1.Stream_STREAM_STDERR, "warn\x00\xff"),
					exited(exitCode(3)),
				} {
					if err := stream.Send(ev); err != nil {
						return err
					}
				}
				return nil
			}
			events, err := execCall(t, h, startMsg(testSandbox, tc.execID, echo))
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			start := (<-opened).GetStart()
			execID := start.GetExecId()
			switch {
			case tc.execID != "" && execID != tc.execID:
				t.Errorf("agent started exec %q; want %q", execID, tc.execID)
			case tc.execID == "" && !strings.HasPrefix(execID, "ex-"):
				t.Errorf("minted exec id %q; want ex-...", execID)
			}
			if !proto.Equal(start.GetProcess(), echo) || start.GetBackground() {
				t.Errorf("agent got process %v (background %v); want %v", start.GetProcess(), start.GetBackground(), echo)
			}
			if len(events) != 4 {
				t.Fatalf("got %d events %v; want started, 2 outputs, exited", len(events), events)
			}
			if s := events[0].GetStarted(); s.GetExecId() != execID || s.GetPid() != 77 {
				t.Errorf("started %v; want exec %s pid 77", s, execID)
			}
			if o := events[1].GetOutput(); o.GetSeq() != 1 || o.GetStream() != berthv1.Stream_STREAM_STDOUT || string(o.GetData()) != "hello, world\n" {
				t.Errorf("first output %v; want seq 1 stdout %q", o, "hello, world\n")
			}
			if o := events[2].GetOutput(); o.GetSeq() != 2 || o.GetStream() != berthv1.Stream_STREAM_STDERR || string(o.GetData()) != "warn\x00\xff" {
				t.Errorf("second output %v; want seq 2 stderr %q", o, "warn\x00\xff")
			}
			if ex := events[3].GetExited(); ex == nil || ex.GetResult().ExitCode == nil || ex.GetResult().GetExitCode() != 3 {
				t.Errorf("exited %v; want exit code 3", events[3])
			}
			if got, known := h.ids.ExecRuntime(testSandbox, execID); !known || got.BootID != testBoot {
				t.Errorf("runtime journal has exec %s in %v (%v); want boot %s", execID, got, known, testBoot)
			}
			if h.obs.Sent("stdout") != len("hello, world\n") || h.obs.Sent("stderr") != len("warn\x00\xff") {
				t.Errorf("observer counted stdout %d, stderr %d", h.obs.Sent("stdout"), h.obs.Sent("stderr"))
			}
			if h.capacity.Calls() != 1 {
				t.Errorf("admitted %d times; want 1", h.capacity.Calls())
			}
			if sb, all := h.capacity.Running(testSandbox); sb != 0 || all != 0 {
				t.Errorf("exec slots held after the exit: %d in the sandbox, %d in all", sb, all)
			}
			if got := h.reach.Reached(); len(got) != 1 || got[0] != testSandbox+"/"+execID {
				t.Errorf("reached %v; want [%s/%s]", got, testSandbox, execID)
			}
		})
	}
}

// TestExecAttach: an attach to an exec of the current runtime reaches the
// agent with its since_seq and takes no capacity; a start of an exec id
// the journal knows in this runtime attaches too, past a full server.
func TestExecAttach(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *berthv1.ExecRequest
	}{
		{"attach", attachMsg(testSandbox, "ex-run", 5)},
		{"start of a known exec id", startMsg(testSandbox, "ex-run", echo)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			mustRecord(t, h, "ex-run", testBoot)
			h.capacity.refuse(&apierr.FleetBusy{SandboxID: testSandbox, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS})
			opened := make(chan *agentv1.ExecRequest, 1)
			h.agent.exec = agentSends(opened, output(6, berthv1.Stream_STREAM_STDOUT, "tail"), exited(exitCode(0)))
			events, err := execCall(t, h, tc.msg)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			first := <-opened
			if a := tc.msg.GetAttach(); a != nil {
				if got := first.GetAttach(); got.GetExecId() != "ex-run" || got.GetSinceSeq() != 5 || got.GetExitOnly() {
					t.Errorf("agent got attach %v; want ex-run since 5", got)
				}
			} else if first.GetStart().GetExecId() != "ex-run" {
				t.Errorf("agent got %v; want the start of ex-run", first)
			}
			if len(events) != 2 || string(events[0].GetOutput().GetData()) != "tail" || events[0].GetOutput().GetSeq() != 6 ||
				events[1].GetExited().GetResult().GetExitCode() != 0 || events[1].GetExited().GetResult().ExitCode == nil {
				t.Errorf("events %v; want output 6 %q and exit 0", events, "tail")
			}
			if n := h.capacity.Calls(); n != 0 {
				t.Errorf("admission asked %d times; want none", n)
			}
		})
	}
}

// TestExecAgentRefuses: the agent's own refusal of a start reaches the
// caller with its fields renamed to the public request's, the journal
// record is retracted and the slot released; the agent's NOT_FOUND for an
// attach passes as it is.
func TestExecAgentRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		msg   *berthv1.ExecRequest
		agent error
		want  want
	}{
		{"start with a bad user", startMsg(testSandbox, "ex-1", echo), rpcstatus.InvalidArgument("process.user", "no such user"),
			want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.process.user"}},
		{"attach beyond the last event", attachMsg(testSandbox, "ex-1", 99), rpcstatus.InvalidArgument("since_seq", "beyond the last event"),
			want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "attach.since_seq"}},
		{"attach to an unknown exec", attachMsg(testSandbox, "ex-1", 0),
			rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, "exec ex-1 not found", map[string]string{"exec_id": "ex-1"}),
			want{code: codes.NotFound, reason: rpcstatus.ReasonExecNotFound, meta: map[string]string{"exec_id": "ex-1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			opened := make(chan *agentv1.ExecRequest, 1)
			h.agent.exec = func(stream agentv1.AgentService_ExecServer) error {
				first, err := stream.Recv()
				if err != nil {
					return err
				}
				opened <- first
				return tc.agent
			}
			events, err := execCall(t, h, tc.msg)
			if len(events) != 0 {
				t.Errorf("events before the error: %v", events)
			}
			checkStatus(t, err, tc.want)
			<-opened
			if _, known := h.ids.ExecRuntime(testSandbox, "ex-1"); known {
				t.Error("the runtime journal keeps an exec the agent refused")
			}
			if sb, all := h.capacity.Running(testSandbox); sb != 0 || all != 0 {
				t.Errorf("exec slots held after the refusal: %d in the sandbox, %d in all", sb, all)
			}
		})
	}
}

// TestExecSecondStart: a second start on a running exec's stream is
// INVALID_ARGUMENT "event"; the exec runs on, and a background follower
// holds its slot until the agent reports its exit.
func TestExecSecondStart(t *testing.T) {
	h := newHarness(t, 0)
	attached := make(chan *agentv1.ExecAttach, 1)
	h.agent.exec = func(stream agentv1.AgentService_ExecServer) error {
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		if a := first.GetAttach(); a != nil {
			attached <- a
			return stream.Send(exited(exitCode(0)))
		}
		if err := stream.Send(started(first.GetStart().GetExecId(), 9)); err != nil {
			return err
		}
		for { // runs until berthd ends the stream
			if _, err := stream.Recv(); err != nil {
				return nil
			}
		}
	}
	stream, err := h.client.Exec(callContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(startMsg(testSandbox, "ex-2", echo)); err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetStarted().GetPid() != 9 {
		t.Fatalf("first event %v, %v; want started pid 9", ev, err)
	}
	if err := stream.Send(startMsg(testSandbox, "ex-3", echo)); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	checkStatus(t, err, want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "event"})
	waitBackground(t, h)
	select {
	case a := <-attached:
		if a.GetExecId() != "ex-2" || !a.GetExitOnly() || a.GetSinceSeq() != 0 {
			t.Errorf("follower attached %v; want ex-2 exit_only", a)
		}
	default:
		t.Fatal("no follower attached to the exec that runs on")
	}
	if sb, all := h.capacity.Running(testSandbox); sb != 0 || all != 0 {
		t.Errorf("exec slots held after the follower saw the exit: %d in the sandbox, %d in all", sb, all)
	}
	if _, known := h.ids.ExecRuntime(testSandbox, "ex-3"); known {
		t.Error("the refused second start was recorded")
	}
}

func TestRunRefused(t *testing.T) {
	notFound := fmt.Errorf("look up: %w", runtime.ErrSandboxNotFound)
	for _, tc := range []struct {
		name   string
		budget uint64
		setup  func(*testing.T, *harness)
		req    *berthv1.RunRequest
		want   want
		check  func(*testing.T, *grpcstatus.Status)
	}{
		{name: "bad sandbox id", req: &berthv1.RunRequest{SandboxId: "UPPER", Process: echo},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "bad exec id", req: &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "a b", Process: echo},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "exec_id"}},
		{name: "process missing", req: &berthv1.RunRequest{SandboxId: testSandbox},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process"}},
		{name: "stdin", req: &berthv1.RunRequest{SandboxId: testSandbox, Process: &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process.stdin"}},
		{name: "cwd in the agent's directory", req: &berthv1.RunRequest{SandboxId: testSandbox, Process: &berthv1.ProcessSpec{Argv: []string{"ls"}, Cwd: "/x/../.berth-run"}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process.cwd"}},
		{name: "stdout cap above the maximum", req: &berthv1.RunRequest{SandboxId: testSandbox, Process: &berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: 4<<20 + 1}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process.stdout_limit_bytes"}},
		{name: "caps together above the maximum", req: &berthv1.RunRequest{SandboxId: testSandbox, Process: &berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: 3 << 20, StderrLimitBytes: 1<<20 + 1}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process.stderr_limit_bytes"}},
		{name: "default stderr cap above what the stdout cap leaves", req: &berthv1.RunRequest{SandboxId: testSandbox, Process: &berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: 4 << 20}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process.stderr_limit_bytes"}},
		{name: "run buffers smaller than the first slabs", budget: 64 << 10, req: &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo},
			want: want{code: codes.ResourceExhausted, reason: rpcstatus.ReasonFleetBusy, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "run-1", "resource": "CAPACITY_RESOURCE_RUN_OUTPUT"}},
			check: func(t *testing.T, st *grpcstatus.Status) {
				d := detail[*berthv1.FleetBusy](t, st)
				if d.GetLimit() != 64<<10 || d.GetInUse() != 0 || d.GetRequested() != 128<<10 || d.GetRetryDelay().AsDuration() != 3*time.Second {
					t.Errorf("FleetBusy detail %v; want limit 64 KiB, in use 0, requested the first slabs 128 KiB, retry 3s", d)
				}
			}},
		{name: "run buffers held by other Runs", budget: 3 << 20,
			setup: func(t *testing.T, h *harness) {
				release, _, ok := h.budget.Reserve(3<<20 - 64<<10)
				if !ok {
					t.Fatal("reserve 3 MiB - 64 KiB of 3 MiB")
				}
				t.Cleanup(release)
			},
			req:  &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: &berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: 1 << 20, StderrLimitBytes: 1}},
			want: want{code: codes.ResourceExhausted, reason: rpcstatus.ReasonFleetBusy, meta: map[string]string{"resource": "CAPACITY_RESOURCE_RUN_OUTPUT"}},
			check: func(t *testing.T, st *grpcstatus.Status) {
				d := detail[*berthv1.FleetBusy](t, st)
				if d.GetLimit() != 3<<20 || d.GetInUse() != 3<<20-64<<10 || d.GetRequested() != 64<<10+1 {
					t.Errorf("FleetBusy detail %v; want limit 3 MiB, in use 3 MiB - 64 KiB, requested 64 KiB + 1", d)
				}
			}},
		{name: "missing sandbox", setup: func(t *testing.T, h *harness) { h.reach.fail(notFound) },
			req:  &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo},
			want: want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "run-1"}}},
		{name: "stale exec id", setup: func(t *testing.T, h *harness) { mustRecord(t, h, "run-1", oldBoot) },
			req:  &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo},
			want: want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonStaleHandle, meta: map[string]string{"exec_id": "run-1"}}},
		{name: "no capacity",
			setup: func(t *testing.T, h *harness) {
				h.capacity.refuse(&apierr.FleetBusy{SandboxID: testSandbox, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS, Limit: 1, InUse: 1, Requested: 1})
			},
			req:  &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo},
			want: want{code: codes.ResourceExhausted, reason: rpcstatus.ReasonFleetBusy, meta: map[string]string{"resource": "CAPACITY_RESOURCE_SERVER_EXECS"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.budget) // its agent has no exec: any call is counted and fails
			used := uint64(0)
			if tc.setup != nil {
				tc.setup(t, h)
				used = h.budget.Used()
			}
			resp, err := h.client.Run(callContext(t), tc.req)
			if resp != nil {
				t.Errorf("response %v with the error", resp)
			}
			st := checkStatus(t, err, tc.want)
			if got := h.budget.Used(); got != used {
				t.Errorf("run buffers in use %d after the refusal; want %d", got, used)
			}
			if h.agent.Calls() != 0 {
				t.Errorf("agent called %d times", h.agent.Calls())
			}
			if tc.check != nil {
				tc.check(t, st)
			}
		})
	}
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name       string
		process    *berthv1.ProcessSpec
		events     []*agentv1.ExecResponse
		wantCaps   [2]uint64 // what the agent is asked to keep of stdout, stderr
		wantResult *berthv1.RunResponse
	}{
		{name: "collects both streams",
			process: &berthv1.ProcessSpec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}},
			events: []*agentv1.ExecResponse{started("run-1", 5), output(1, berthv1.Stream_STREAM_STDOUT, "out\n"),
				output(2, berthv1.Stream_STREAM_STDERR, "err\n"), output(3, berthv1.Stream_STREAM_STDOUT, "more"),
				exited(&berthv1.ExecResult{ExitCode: proto.Int32(7), StdoutBytes: 8, StderrBytes: 4})},
			wantCaps: [2]uint64{1 << 20, 1 << 20},
			wantResult: &berthv1.RunResponse{ExecId: "run-1", Stdout: []byte("out\nmore"), Stderr: []byte("err\n"),
				Result: &berthv1.ExecResult{ExitCode: proto.Int32(7), StdoutBytes: 8, StderrBytes: 4}}},
		{name: "keeps the head up to the caps",
			process: &berthv1.ProcessSpec{Argv: []string{"yes"}, StdoutLimitBytes: 4, StderrLimitBytes: 2},
			events: []*agentv1.ExecResponse{started("run-1", 5), output(1, berthv1.Stream_STREAM_STDOUT, "0123456789"),
				output(2, berthv1.Stream_STREAM_STDERR, "abc"),
				exited(&berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 10, StderrBytes: 3})},
			wantCaps: [2]uint64{4, 2},
			wantResult: &berthv1.RunResponse{ExecId: "run-1", Stdout: []byte("0123"), Stderr: []byte("ab"),
				Result: &berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 10, StderrBytes: 3, StdoutTruncated: true, StderrTruncated: true}}},
		{name: "signaled",
			process:    &berthv1.ProcessSpec{Argv: []string{"sleep", "9"}},
			events:     []*agentv1.ExecResponse{started("run-1", 5), exited(&berthv1.ExecResult{Signal: "KILL"})},
			wantCaps:   [2]uint64{1 << 20, 1 << 20},
			wantResult: &berthv1.RunResponse{ExecId: "run-1", Result: &berthv1.ExecResult{Signal: "KILL"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 8<<20)
			opened := make(chan *agentv1.ExecRequest, 1)
			h.agent.exec = agentSends(opened, tc.events...)
			resp, err := h.client.Run(callContext(t), &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: tc.process})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !proto.Equal(resp, tc.wantResult) {
				t.Errorf("Run = %v; want %v", resp, tc.wantResult)
			}
			start := (<-opened).GetStart()
			p := start.GetProcess()
			if start.GetExecId() != "run-1" || p.GetStdoutLimitBytes() != tc.wantCaps[0] || p.GetStderrLimitBytes() != tc.wantCaps[1] ||
				strings.Join(p.GetArgv(), " ") != strings.Join(tc.process.GetArgv(), " ") || p.GetStdin() {
				t.Errorf("agent started %v; want exec run-1, argv %q, caps %v", start, tc.process.GetArgv(), tc.wantCaps)
			}
			if got := h.budget.Used(); got != 0 {
				t.Errorf("run buffers in use %d after the Run; want 0", got)
			}
			if sb, all := h.capacity.Running(testSandbox); sb != 0 || all != 0 {
				t.Errorf("exec slots held after the Run: %d in the sandbox, %d in all", sb, all)
			}
			if got, known := h.ids.ExecRuntime(testSandbox, "run-1"); !known || got.BootID != testBoot {
				t.Errorf("runtime journal has run-1 in %v (%v); want %s", got, known, testBoot)
			}
		})
	}
}

// TestRunOutputLost: output the agent dropped within the caps fails the
// Run with DATA_LOSS OUTPUT_LOST instead of a result that looks complete.
func TestRunOutputLost(t *testing.T) {
	h := newHarness(t, 0)
	opened := make(chan *agentv1.ExecRequest, 1)
	h.agent.exec = agentSends(opened, started("run-1", 5),
		&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Dropped{Dropped: &berthv1.ExecDropped{FirstSeq: 1, LastSeq: 1, LostBytes: 5}}},
		exited(&berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 5}))
	resp, err := h.client.Run(callContext(t), &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo})
	if resp != nil {
		t.Errorf("response %v with the error", resp)
	}
	checkStatus(t, err, want{code: codes.DataLoss, reason: rpcstatus.ReasonOutputLost, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "run-1"}})
	<-opened
	if got := h.obs.Dropped(); got != 5 {
		t.Errorf("observer counted %d dropped bytes; want 5", got)
	}
}

// runBigOutput runs a Run whose agent writes 100 KiB of stdout, more than
// its first slab, on a harness with a Run buffer budget of budget bytes.
func runBigOutput(t *testing.T, budget uint64) (h *harness, big string, resp *berthv1.RunResponse, err error) {
	h = newHarness(t, budget)
	opened := make(chan *agentv1.ExecRequest, 1)
	big = strings.Repeat("x", 100<<10)
	h.agent.exec = agentSends(opened, started("run-1", 5), output(1, berthv1.Stream_STREAM_STDOUT, big),
		exited(&berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: uint64(len(big))}))
	resp, err = h.client.Run(callContext(t), &berthv1.RunRequest{SandboxId: testSandbox, ExecId: "run-1", Process: echo})
	<-opened
	return h, big, resp, err
}

// TestRunOutputBudget: a Run is admitted holding its first slabs and
// grows as its output does; output that needs budget no one can give back
// (here the Run holds all of it and waits itself) fails the Run with
// DATA_LOSS OUTPUT_LOST naming the budget, never a cut result, and gives
// the budget back (issue 23).
func TestRunOutputBudget(t *testing.T) {
	h, _, resp, err := runBigOutput(t, 128<<10)
	if resp != nil {
		t.Errorf("response of %d bytes with the error", len(resp.GetStdout()))
	}
	checkStatus(t, err, want{code: codes.DataLoss, reason: rpcstatus.ReasonOutputLost,
		meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "run-1", "resource": "CAPACITY_RESOURCE_RUN_OUTPUT"}})
	if msg := grpcstatus.Convert(err).Message(); !strings.Contains(msg, "every Run holding it was waiting") || !strings.Contains(msg, "--run-buffer-bytes") {
		t.Errorf("message %q; want it to say every Run holding the budget was waiting and name --run-buffer-bytes", msg)
	}
	if got := h.budget.Used(); got != 0 {
		t.Errorf("run buffers in use %d after the Run; want 0", got)
	}
}

// TestRunOutputGrows: with room, output past the first slab is collected
// whole, the Run's lease grown.
func TestRunOutputGrows(t *testing.T) {
	_, big, resp, err := runBigOutput(t, 4<<20)
	if err != nil || string(resp.GetStdout()) != big {
		t.Fatalf("Run with room = %d bytes, %v; want all %d", len(resp.GetStdout()), err, len(big))
	}
}

func TestListExecs(t *testing.T) {
	execs := []*berthv1.ExecInfo{
		{ExecId: "ex-a", State: berthv1.ExecState_EXEC_STATE_RUNNING, Argv: []string{"sleep", "10"}, Pid: 7, LastSeq: 3},
		{ExecId: "ex-b", State: berthv1.ExecState_EXEC_STATE_EXITED, Argv: []string{"true"}, Result: exitCode(0)},
	}
	for _, tc := range []struct {
		name    string
		id      string
		reach   error
		agent   error
		want    *want // nil: success
		reached bool
	}{
		{name: "empty sandbox id", id: "", want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "bad sandbox id", id: "sb_1", want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "missing sandbox", id: testSandbox, reach: fmt.Errorf("get: %w", runtime.ErrSandboxNotFound), reached: true,
			want: &want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox}}},
		{name: "connection to the agent lost", id: testSandbox, agent: grpcstatus.Error(codes.Unavailable, "connection reset"), reached: true,
			want: &want{code: codes.Unavailable, reason: rpcstatus.ReasonUnreachable, meta: map[string]string{"sandbox_id": testSandbox, "cause": "UNREACHABLE_CAUSE_CONNECTION_LOST"}}},
		{name: "agent's own status", id: testSandbox, reached: true,
			agent: rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSandboxNotRunning, "stopping", nil),
			want:  &want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonSandboxNotRunning}},
		{name: "agent's unclassified error", id: testSandbox, reached: true,
			agent: grpcstatus.Error(codes.Unknown, "secret agent detail"),
			want:  &want{code: codes.Internal, reason: rpcstatus.ReasonInternal, meta: map[string]string{"sandbox_id": testSandbox}}},
		{name: "list", id: testSandbox, reached: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			h.reach.fail(tc.reach)
			h.agent.listExecs = func(*agentv1.ListExecsRequest) (*agentv1.ListExecsResponse, error) {
				if tc.agent != nil {
					return nil, tc.agent
				}
				return &agentv1.ListExecsResponse{Execs: execs, Omitted: 2}, nil
			}
			resp, err := h.client.ListExecs(callContext(t), &berthv1.ListExecsRequest{SandboxId: tc.id})
			if tc.want != nil {
				st := checkStatus(t, err, *tc.want)
				if strings.Contains(st.Message(), "secret") {
					t.Errorf("message %q shows the agent's text", st.Message())
				}
			} else {
				if err != nil {
					t.Fatalf("ListExecs: %v", err)
				}
				if want := (&berthv1.ListExecsResponse{Execs: execs, Omitted: 2}); !proto.Equal(resp, want) {
					t.Errorf("ListExecs = %v; want %v", resp, want)
				}
			}
			if got := h.reach.Reached(); tc.reached != (len(got) == 1 && got[0] == testSandbox+"/") || !tc.reached && len(got) != 0 {
				t.Errorf("reached %v; want reached %v", got, tc.reached)
			}
		})
	}
}

// TestExecHangupCallerLostBeforeStarted: a start with
// hangup_on_disconnect whose caller goes away before the agent's Started
// still hangs the process up once it runs: the agent gets SignalExec HUP
// for it. The fake agent sends Started only after berthd closed its side of
// the agent stream, which berthd does when it sees the caller's stream end;
// in "slow start" it takes three connect budgets more, busy meanwhile (a
// process spinning stands in for it: agentreach's watch sees it work).
// berthd used to give up one budget after the caller left, even while the
// agent worked: the process then started with no one to hang it up or
// count it.
func TestExecHangupCallerLostBeforeStarted(t *testing.T) {
	const budget = 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		delay time.Duration // the start's time after the caller left
	}{
		{"prompt start", 0},
		{"slow start", 3 * budget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, 0, func(h *harness) {
				if tc.delay == 0 {
					return
				}
				spinner := exec.Command("sh", "-c", "while :; do :; done")
				if err := spinner.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { spinner.Process.Kill(); spinner.Wait() })
				h.cfg.ConnectBudget = budget
				h.reach.watches = agentreach.New(agentreach.Config{ConnectBudget: budget, BusyLimit: callTimeout}, fakeStore{}, h.ids, agentconn.NewPool(nil), slog.New(slog.DiscardHandler))
				h.reach.watchPID = uint32(spinner.Process.Pid)
			})
			opened, cut, hungUp := make(chan struct{}), make(chan struct{}), make(chan struct{})
			h.agent.exec = func(stream agentv1.AgentService_ExecServer) error {
				first, err := stream.Recv()
				if err != nil {
					return err
				}
				if first.GetAttach() != nil {
					// berthd follows the exec its caller left to its end,
					// to keep counting it: it ends with the hangup.
					select {
					case <-hungUp:
						return stream.Send(exited(&berthv1.ExecResult{Signal: "SIGHUP"}))
					case <-stream.Context().Done():
						return nil
					}
				}
				close(opened)
				if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
					return fmt.Errorf("test agent: after the start got %v, want berthd's close (io.EOF)", err)
				}
				// The process starts in any case; whether berthd still
				// listens is the question.
				select {
				case <-time.After(tc.delay):
				case <-stream.Context().Done():
					close(cut)
					return nil
				}
				if err := stream.Send(started(first.GetStart().GetExecId(), 77)); err != nil {
					return err
				}
				<-stream.Context().Done() // the exec runs on; berthd ends the stream
				return nil
			}
			signals := make(chan *agentv1.SignalExecRequest, 2)
			h.agent.signalExec = func(req *agentv1.SignalExecRequest) (*agentv1.SignalExecResponse, error) {
				signals <- req
				if req.GetSignal() == "HUP" {
					close(hungUp)
				}
				return &agentv1.SignalExecResponse{State: berthv1.ExecState_EXEC_STATE_RUNNING}, nil
			}
			ctx, cancel := context.WithCancel(callContext(t))
			stream, err := h.client.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			start := startMsg(testSandbox, "ex-hangup", echo)
			start.GetStart().HangupOnDisconnect = true
			if err := stream.Send(start); err != nil {
				t.Fatal(err)
			}
			// The caller goes away once the agent has the start, before
			// any answer.
			select {
			case <-opened:
			case <-time.After(callTimeout):
				t.Fatal("the start never reached the agent")
			}
			cancel()
			select {
			case req := <-signals:
				if req.GetExecId() != "ex-hangup" || req.GetSignal() != "HUP" {
					t.Errorf("agent got SignalExec %v, want HUP to ex-hangup", req)
				}
			case <-cut:
				t.Fatal("berthd ended the agent stream before Started while the agent worked: the process would run on, not hung up")
			case <-time.After(callTimeout):
				t.Fatal("no SignalExec HUP reached the agent after the exec started")
			}
		})
	}
}

func TestSignalExec(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     *berthv1.SignalExecRequest
		setup   func(*testing.T, *harness)
		agent   error
		want    *want // nil: success
		reached bool
		signals bool // the agent is asked
	}{
		{name: "empty sandbox id", req: &berthv1.SignalExecRequest{ExecId: "ex-1", Signal: "TERM"},
			want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "bad sandbox id", req: &berthv1.SignalExecRequest{SandboxId: "a/b", ExecId: "ex-1", Signal: "TERM"},
			want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "sandbox_id"}},
		{name: "empty exec id", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, Signal: "TERM"},
			want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "exec_id"}},
		{name: "bad exec id", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex 1", Signal: "TERM"},
			want: &want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "exec_id"}},
		{name: "missing sandbox", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex-1", Signal: "TERM"},
			setup:   func(t *testing.T, h *harness) { h.reach.fail(runtime.ErrSandboxNotFound) },
			want:    &want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-1"}},
			reached: true},
		{name: "exec of an earlier runtime", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex-old", Signal: "KILL"},
			setup:   func(t *testing.T, h *harness) { mustRecord(t, h, "ex-old", oldBoot) },
			want:    &want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonStaleHandle, meta: map[string]string{"sandbox_id": testSandbox, "exec_id": "ex-old"}},
			reached: true},
		{name: "exec unknown to the agent", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex-1", Signal: "TERM"},
			agent:   rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, "exec ex-1 not found", map[string]string{"exec_id": "ex-1"}),
			want:    &want{code: codes.NotFound, reason: rpcstatus.ReasonExecNotFound, meta: map[string]string{"exec_id": "ex-1"}},
			reached: true, signals: true},
		{name: "signal", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex-1", Signal: "TERM"},
			reached: true, signals: true},
		{name: "signal an exec of this runtime", req: &berthv1.SignalExecRequest{SandboxId: testSandbox, ExecId: "ex-now", Signal: "9"},
			setup:   func(t *testing.T, h *harness) { mustRecord(t, h, "ex-now", testBoot) },
			reached: true, signals: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			if tc.setup != nil {
				tc.setup(t, h)
			}
			got := make(chan *agentv1.SignalExecRequest, 1)
			h.agent.signalExec = func(req *agentv1.SignalExecRequest) (*agentv1.SignalExecResponse, error) {
				got <- req
				if tc.agent != nil {
					return nil, tc.agent
				}
				return &agentv1.SignalExecResponse{State: berthv1.ExecState_EXEC_STATE_RUNNING}, nil
			}
			resp, err := h.client.SignalExec(callContext(t), tc.req)
			if tc.want != nil {
				st := checkStatus(t, err, *tc.want)
				if tc.want.reason == rpcstatus.ReasonStaleHandle {
					checkStale(t, h, st)
				}
			} else if err != nil || resp.GetState() != berthv1.ExecState_EXEC_STATE_RUNNING {
				t.Fatalf("SignalExec = %v, %v; want state RUNNING", resp, err)
			}
			if r := h.reach.Reached(); tc.reached != (len(r) == 1 && r[0] == testSandbox+"/"+tc.req.GetExecId()) || !tc.reached && len(r) != 0 {
				t.Errorf("reached %v; want reached %v", r, tc.reached)
			}
			select {
			case req := <-got:
				if !tc.signals {
					t.Errorf("agent asked to signal %v", req)
				} else if req.GetExecId() != tc.req.GetExecId() || req.GetSignal() != tc.req.GetSignal() {
					t.Errorf("agent asked to signal %v; want exec %s signal %s", req, tc.req.GetExecId(), tc.req.GetSignal())
				}
			default:
				if tc.signals {
					t.Error("the agent was not asked")
				}
			}
		})
	}
}

func portStart(id string, port uint32) *berthv1.PortForwardRequest {
	return &berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: id, Port: port}}}
}

func portData(s string) *berthv1.PortForwardRequest {
	return &berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Data{Data: []byte(s)}}
}

func TestPortForwardRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msgs    []*berthv1.PortForwardRequest
		reach   error
		agent   error // the agent's answer to the port
		want    want
		reached bool
	}{
		{name: "stream ends before start", want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start"}},
		{name: "first message data", msgs: []*berthv1.PortForwardRequest{portData("GET /")},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start"}},
		{name: "first message empty", msgs: []*berthv1.PortForwardRequest{{}},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start"}},
		{name: "bad sandbox id", msgs: []*berthv1.PortForwardRequest{portStart("", 80)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.sandbox_id"}},
		{name: "port 0", msgs: []*berthv1.PortForwardRequest{portStart(testSandbox, 0)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.port"}},
		{name: "port 70000", msgs: []*berthv1.PortForwardRequest{portStart(testSandbox, 70000)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.port"}},
		{name: "port 65536", msgs: []*berthv1.PortForwardRequest{portStart(testSandbox, 65536)},
			want: want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "start.port"}},
		{name: "missing sandbox", msgs: []*berthv1.PortForwardRequest{portStart(testSandbox, 8080)}, reach: fmt.Errorf("x: %w", runtime.ErrSandboxNotFound),
			want:    want{code: codes.NotFound, reason: rpcstatus.ReasonSandboxNotFound, meta: map[string]string{"sandbox_id": testSandbox, "port": "8080"}},
			reached: true},
		{name: "port closed in the sandbox", msgs: []*berthv1.PortForwardRequest{portStart(testSandbox, 65535)},
			agent:   rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonPortClosed, "nothing listens on port 65535", map[string]string{"port": "65535"}),
			want:    want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonPortClosed, meta: map[string]string{"port": "65535"}},
			reached: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			h.reach.fail(tc.reach)
			asked := make(chan uint32, 1)
			h.agent.portForward = func(stream agentv1.AgentService_PortForwardServer) error {
				first, err := stream.Recv()
				if err != nil {
					return err
				}
				asked <- first.GetPort()
				if tc.agent == nil {
					return grpcstatus.Error(codes.Unimplemented, "test agent: asked to connect")
				}
				return tc.agent
			}
			stream, err := h.client.PortForward(callContext(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.msgs {
				if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if resp != nil {
				t.Errorf("message %v before the error", resp)
			}
			checkStatus(t, err, tc.want)
			if got := len(h.reach.Reached()) == 1; got != tc.reached {
				t.Errorf("reached %v; want reached %v", h.reach.Reached(), tc.reached)
			}
			if tc.agent != nil {
				if port := <-asked; port != tc.msgs[0].GetStart().GetPort() {
					t.Errorf("agent asked for port %d; want %d", port, tc.msgs[0].GetStart().GetPort())
				}
			} else if n := h.agent.Calls(); n != 0 {
				t.Errorf("agent called %d times", n)
			}
		})
	}
}

// TestPortForward relays a connection both ways: the caller's data after
// the agent's connect, the caller's half-close, the sandbox's answer and
// end of file. An event berthd does not know (from a newer agent) is
// skipped wherever it comes, before the connect too.
func TestPortForward(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before []*agentv1.PortForwardResponse // sent ahead of the connect
	}{
		{name: "connect first"},
		{name: "unknown event first", before: []*agentv1.PortForwardResponse{{}}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPortForward(t, tc.before) })
	}
}

func testPortForward(t *testing.T, before []*agentv1.PortForwardResponse) {
	h := newHarness(t, 0)
	h.agent.portForward = func(stream agentv1.AgentService_PortForwardServer) error {
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		port := first.GetPort()
		for _, m := range before {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		if err := stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Connected{Connected: &berthv1.PortForwardConnected{Port: port}}}); err != nil {
			return err
		}
		var got []byte
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if msg.GetPort() != 0 {
				return grpcstatus.Error(codes.InvalidArgument, "port again")
			}
			got = append(got, msg.GetData()...)
		}
		if err := stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Data{Data: append([]byte("echo:"), got...)}}); err != nil {
			return err
		}
		return stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Eof{Eof: &berthv1.PortForwardEOF{}}})
	}
	rest := exchange(t, h, portData("ping "), portData(""), portData("pong\x00"))
	if len(rest) != 2 || string(rest[0].GetData()) != "echo:ping pong\x00" || rest[1].GetEof() == nil {
		t.Errorf("after connected: %v; want data %q, then eof", rest, "echo:ping pong\x00")
	}
	if got := h.reach.Reached(); len(got) != 1 || got[0] != testSandbox+"/" {
		t.Errorf("reached %v; want [%s/]", got, testSandbox)
	}
}

// TestPortForwardAgentEndsEarly: an agent that ends the stream without
// connecting or refusing is an error, never an empty success.
func TestPortForwardAgentEndsEarly(t *testing.T) {
	h := newHarness(t, 0)
	h.agent.portForward = func(stream agentv1.AgentService_PortForwardServer) error {
		_, err := stream.Recv()
		return err
	}
	stream, err := h.client.PortForward(callContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(portStart(testSandbox, 8080)); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if msg != nil {
		t.Errorf("message %v; want none", msg)
	}
	checkStatus(t, err, want{code: codes.Internal, reason: rpcstatus.ReasonInternal})
}

// TestPortForwardSecondStart: only data may follow the start; a second
// start ends the stream INVALID_ARGUMENT naming "data".
func TestPortForwardSecondStart(t *testing.T) {
	h := newHarness(t, 0)
	h.agent.portForward = agentConnects
	checkSecondStart(t, h)
}

// agentConnects is an agent's PortForward that connects to the port asked
// and reads what follows until the stream ends.
func agentConnects(stream agentv1.AgentService_PortForwardServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Connected{Connected: &berthv1.PortForwardConnected{Port: first.GetPort()}}}); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// openForward opens a forward to port 8080, which must connect.
func openForward(t *testing.T, h *harness) berthv1.SandboxService_PortForwardClient {
	t.Helper()
	stream, err := h.client.PortForward(callContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(portStart(testSandbox, 8080)); err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err != nil || msg.GetConnected().GetPort() != 8080 {
		t.Fatalf("first message %v, %v; want connected to 8080", msg, err)
	}
	return stream
}

// exchange opens a forward to port 8080, which must connect, sends msgs,
// half-closes, and returns what follows the connect up to the stream's
// OK end.
func exchange(t *testing.T, h *harness, msgs ...*berthv1.PortForwardRequest) []*berthv1.PortForwardResponse {
	t.Helper()
	stream := openForward(t, h)
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var rest []*berthv1.PortForwardResponse
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return rest
		}
		if err != nil {
			t.Fatalf("PortForward: %v", err)
		}
		rest = append(rest, msg)
	}
}

// checkSecondStart opens a forward to port 22, which must connect, sends a
// second start and wants INVALID_ARGUMENT naming "data".
func checkSecondStart(t *testing.T, h *harness) {
	t.Helper()
	stream, err := h.client.PortForward(callContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(portStart(testSandbox, 22)); err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err != nil || msg.GetConnected().GetPort() != 22 {
		t.Fatalf("first message %v, %v; want connected to 22", msg, err)
	}
	if err := stream.Send(portStart(testSandbox, 23)); err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = stream.Recv()
	}
	checkStatus(t, err, want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "data"})
}
