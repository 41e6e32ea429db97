package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// splitClient is a SandboxServiceClient whose Exec and SignalExec run on
// the calls without bidi streams — StartExec, AttachExec, WriteExecStdin,
// SignalExec, ResizeExec — through connect-go over HTTP/1.1 (Connect, or
// gRPC-Web with connect.WithGRPCWeb), as a client without HTTP/2 would;
// its other calls go to the embedded gRPC client. Its Exec streams turn
// each message into a call: start and attach open the server stream,
// stdin is written at the offset the stream has sent so far, close_stdin
// and resize and signal are unary calls; a call's error fails the stream,
// as the bidi Exec's would.
type splitClient struct {
	berthv1.SandboxServiceClient
	start  *connect.Client[berthv1.StartExecRequest, berthv1.ExecResponse]
	attach *connect.Client[berthv1.AttachExecRequest, berthv1.ExecResponse]
	stdin  *connect.Client[berthv1.WriteExecStdinRequest, berthv1.WriteExecStdinResponse]
	signal *connect.Client[berthv1.SignalExecRequest, berthv1.SignalExecResponse]
	resize *connect.Client[berthv1.ResizeExecRequest, berthv1.ResizeExecResponse]
}

// newSplitClient returns a splitClient of the berthd listening on addr
// ("unix://path"), over HTTP/1.1 with opts.
// unixHTTPClient is an HTTP client of berthd's unix socket addr
// (unix:///path); its URLs' host is any ("http://berthd/...").
func unixHTTPClient(addr string) *http.Client {
	sock := strings.TrimPrefix(addr, "unix://")
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

func newSplitClient(addr string, grpcClient berthv1.SandboxServiceClient, opts ...connect.ClientOption) *splitClient {
	hc := unixHTTPClient(addr)
	url := "http://berthd/berth.v1.SandboxService/"
	return &splitClient{
		SandboxServiceClient: grpcClient,
		start:                connect.NewClient[berthv1.StartExecRequest, berthv1.ExecResponse](hc, url+"StartExec", opts...),
		attach:               connect.NewClient[berthv1.AttachExecRequest, berthv1.ExecResponse](hc, url+"AttachExec", opts...),
		stdin:                connect.NewClient[berthv1.WriteExecStdinRequest, berthv1.WriteExecStdinResponse](hc, url+"WriteExecStdin", opts...),
		signal:               connect.NewClient[berthv1.SignalExecRequest, berthv1.SignalExecResponse](hc, url+"SignalExec", opts...),
		resize:               connect.NewClient[berthv1.ResizeExecRequest, berthv1.ResizeExecResponse](hc, url+"ResizeExec", opts...),
	}
}

func (c *splitClient) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest, _ ...grpc.CallOption) (*berthv1.SignalExecResponse, error) {
	resp, err := c.signal.CallUnary(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, grpcError(err)
	}
	return resp.Msg, nil
}

func (c *splitClient) Exec(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[berthv1.ExecRequest, berthv1.ExecResponse], error) {
	ctx, cancel := context.WithCancelCause(ctx)
	return &splitExec{c: c, ctx: ctx, cancel: cancel, events: make(chan *berthv1.ExecResponse, 64), started: make(chan struct{})}, nil
}

// splitExec is one Exec stream of a splitClient.
type splitExec struct {
	c      *splitClient
	ctx    context.Context
	cancel context.CancelCauseFunc
	events chan *berthv1.ExecResponse // closed when the server stream ended

	mu        sync.Mutex
	sandboxID string
	execID    string        // known once started is closed
	started   chan struct{} // closed at ExecStarted, or the stream's end
	offset    uint64        // the stdin bytes sent
	opened    bool
	err       error // why the stream ended; nil: OK
}

// Send carries out one message: the first opens the server stream, the
// others are unary calls, each done before Send returns (in order, as on
// a stream).
func (s *splitExec) Send(req *berthv1.ExecRequest) error {
	if !s.opened {
		s.opened = true
		var stream *connect.ServerStreamForClient[berthv1.ExecResponse]
		var err error
		switch ev := req.GetEvent().(type) {
		case *berthv1.ExecRequest_Start:
			st := ev.Start
			s.sandboxID, s.execID = st.GetSandboxId(), st.GetExecId()
			stream, err = s.c.start.CallServerStream(s.ctx, connect.NewRequest(&berthv1.StartExecRequest{SandboxId: st.GetSandboxId(), ExecId: st.GetExecId(),
				Process: st.GetProcess(), Background: st.GetBackground(), DetachedOutput: st.GetDetachedOutput(), HangupOnDisconnect: st.GetHangupOnDisconnect()}))
		case *berthv1.ExecRequest_Attach:
			at := ev.Attach
			s.sandboxID, s.execID = at.GetSandboxId(), at.GetExecId()
			stream, err = s.c.attach.CallServerStream(s.ctx, connect.NewRequest(&berthv1.AttachExecRequest{SandboxId: at.GetSandboxId(), ExecId: at.GetExecId(), SinceSeq: at.GetSinceSeq()}))
		default:
			err = status.Error(codes.InvalidArgument, "the first message must be start or attach")
		}
		go s.receive(stream, err)
		return nil
	}
	// The exec id is known (minted ones too) once ExecStarted came.
	select {
	case <-s.started:
	case <-s.ctx.Done():
		return io.EOF
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.execID == "" {
		return io.EOF // the stream ended before ExecStarted; Recv says why
	}
	var err error
	switch ev := req.GetEvent().(type) {
	case *berthv1.ExecRequest_Stdin:
		err = s.writeStdin(ev.Stdin.GetData(), false)
	case *berthv1.ExecRequest_CloseStdin:
		err = s.writeStdin(nil, true)
	case *berthv1.ExecRequest_Signal:
		_, err = s.c.signal.CallUnary(s.ctx, connect.NewRequest(&berthv1.SignalExecRequest{SandboxId: s.sandboxID, ExecId: s.execID, Signal: ev.Signal.GetSignal()}))
	case *berthv1.ExecRequest_Resize:
		_, err = s.c.resize.CallUnary(s.ctx, connect.NewRequest(&berthv1.ResizeExecRequest{SandboxId: s.sandboxID, ExecId: s.execID, Rows: ev.Resize.GetRows(), Cols: ev.Resize.GetCols()}))
	default:
		err = status.Error(codes.InvalidArgument, "only stdin, close_stdin, signal and resize may follow the first message")
	}
	if err != nil {
		// As on the bidi stream: the call's error ends the stream, and
		// Recv reports it.
		s.cancel(grpcError(err))
	}
	return nil
}

// writeStdin sends data at the stream's offset; s.mu is held.
func (s *splitExec) writeStdin(data []byte, closeStdin bool) error {
	resp, err := s.c.stdin.CallUnary(s.ctx, connect.NewRequest(&berthv1.WriteExecStdinRequest{SandboxId: s.sandboxID, ExecId: s.execID, Offset: s.offset, Data: data, CloseStdin: closeStdin}))
	if err != nil {
		return err
	}
	s.offset = resp.Msg.GetNextOffset()
	return nil
}

// receive passes the server stream's events to Recv.
func (s *splitExec) receive(stream *connect.ServerStreamForClient[berthv1.ExecResponse], err error) {
	defer close(s.events)
	startedOnce := sync.OnceFunc(func() { close(s.started) })
	defer startedOnce()
	if err == nil {
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg()
			if st := ev.GetStarted(); st != nil {
				s.mu.Lock()
				s.execID = st.GetExecId()
				s.mu.Unlock()
				startedOnce()
			}
			select {
			case s.events <- ev:
			case <-s.ctx.Done():
			}
		}
		err = stream.Err()
	}
	if cause := context.Cause(s.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // a failed call's, not the stream's
	}
	s.mu.Lock()
	if err != nil {
		s.err = grpcError(err)
	}
	s.mu.Unlock()
}

func (s *splitExec) Recv() (*berthv1.ExecResponse, error) {
	select {
	case ev, ok := <-s.events:
		if ok {
			return ev, nil
		}
	case <-s.ctx.Done():
		if cause := context.Cause(s.ctx); !errors.Is(cause, context.Canceled) {
			return nil, cause
		}
		for range s.events { // the stream ends with the context
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	return nil, io.EOF
}

func (s *splitExec) CloseSend() error             { return nil }
func (s *splitExec) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (s *splitExec) Trailer() metadata.MD         { return metadata.MD{} }
func (s *splitExec) Context() context.Context     { return s.ctx }
func (s *splitExec) SendMsg(m any) error          { return s.Send(m.(*berthv1.ExecRequest)) }
func (s *splitExec) RecvMsg(m any) error {
	ev, err := s.Recv()
	if err == nil {
		out := m.(*berthv1.ExecResponse)
		proto.Reset(out)
		proto.Merge(out, ev)
	}
	return err
}

// grpcError returns a connect-go error as the gRPC status error it carries:
// code, message and details.
func grpcError(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.Unknown, err.Error())
	}
	st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return status.FromProto(st).Err()
}

// connectExec runs spec in sandbox id through StartExec of c, writing its
// stdout to w, and fails b unless it exits 0.
func connectExec(b *testing.B, c *splitClient, id string, spec *berthv1.ProcessSpec, w io.Writer) {
	stream, err := c.start.CallServerStream(context.Background(), connect.NewRequest(&berthv1.StartExecRequest{SandboxId: id, Process: spec}))
	if err != nil {
		b.Fatal(err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg()
		if out := ev.GetOutput(); out != nil {
			w.Write(out.GetData())
		}
		if ex := ev.GetExited(); ex != nil {
			if code := ex.GetResult().GetExitCode(); code != 0 {
				b.Fatalf("StartExec %v: exit code %d", spec.GetArgv(), code)
			}
			return
		}
	}
	b.Fatalf("StartExec %v: the stream ended without exited: %v", spec.GetArgv(), stream.Err())
}
