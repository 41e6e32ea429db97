package execsvc

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// StartExec is Exec's start without a bidirectional stream: the same
// handler serves it (exec ids, admission, limits, hangup, the events
// relayed without copying), its caller sending nothing after the start.
// Stdin, signals and resizes come by WriteExecStdin, SignalExec and
// ResizeExec.
func (s *Service) StartExec(req *berthv1.StartExecRequest, stream berthv1.SandboxService_StartExecServer) error {
	start := &berthv1.ExecStart{SandboxId: req.GetSandboxId(), ExecId: req.GetExecId(), Process: req.GetProcess(),
		Background: req.GetBackground(), DetachedOutput: req.GetDetachedOutput(), HangupOnDisconnect: req.GetHangupOnDisconnect()}
	return s.exec(&splitStream{stream, &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: start}}}, false)
}

// AttachExec is Exec's attach without a bidirectional stream, served by
// the same handler.
func (s *Service) AttachExec(req *berthv1.AttachExecRequest, stream berthv1.SandboxService_AttachExecServer) error {
	attach := &berthv1.ExecAttach{SandboxId: req.GetSandboxId(), ExecId: req.GetExecId(), SinceSeq: req.GetSinceSeq()}
	return s.exec(&splitStream{stream, &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: attach}}}, false)
}

// splitStream is a server stream seen as an Exec stream whose caller sent
// first and then closed its side.
type splitStream struct {
	grpc.ServerStreamingServer[berthv1.ExecResponse]
	first *berthv1.ExecRequest
}

// Recv returns the first message, then io.EOF. exec's first call comes
// before it starts the goroutine of the later ones.
func (s *splitStream) Recv() (*berthv1.ExecRequest, error) {
	if first := s.first; first != nil {
		s.first = nil
		return first, nil
	}
	return nil, io.EOF
}

// WriteExecStdin has the agent write stdin bytes from an offset; the agent
// keeps each exec's count of bytes taken, so a chunk sent again is dropped.
func (s *Service) WriteExecStdin(ctx context.Context, req *berthv1.WriteExecStdinRequest) (*berthv1.WriteExecStdinResponse, error) {
	var resp *agentv1.WriteStdinResponse
	err := s.toExec(ctx, req.GetSandboxId(), req.GetExecId(), func(agent agentv1.AgentServiceClient) (err error) {
		resp, err = agent.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: req.GetExecId(), Offset: req.GetOffset(), Data: req.GetData(), CloseStdin: req.GetCloseStdin()})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &berthv1.WriteExecStdinResponse{NextOffset: resp.GetNextOffset()}, nil
}

// ResizeExec has the agent resize a tty exec's terminal.
func (s *Service) ResizeExec(ctx context.Context, req *berthv1.ResizeExecRequest) (*berthv1.ResizeExecResponse, error) {
	// Checked here, so that the agent's errors never name its own
	// request's size.
	for _, f := range []struct {
		name string
		v    uint32
	}{{"rows", req.GetRows()}, {"cols", req.GetCols()}} {
		if f.v < 1 || f.v > 65535 {
			return nil, apierr.InvalidArgument(f.name, fmt.Sprintf("%d is outside 1 to 65535", f.v))
		}
	}
	err := s.toExec(ctx, req.GetSandboxId(), req.GetExecId(), func(agent agentv1.AgentServiceClient) error {
		_, err := agent.ResizeExec(ctx, &agentv1.ResizeExecRequest{ExecId: req.GetExecId(), Size: &berthv1.ExecResize{Rows: req.GetRows(), Cols: req.GetCols()}})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &berthv1.ResizeExecResponse{}, nil
}

// toExec reaches the agent of sandboxID and calls it about execID. Like
// SignalExec: an exec id of an earlier runtime is STALE_HANDLE, never a
// call about whatever has that id now.
func (s *Service) toExec(ctx context.Context, sandboxID, execID string, call func(agentv1.AgentServiceClient) error) error {
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": execID}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	if err := validate.ExecID("exec_id", execID); err != nil {
		return err
	}
	agent, current, err := s.reach.Reach(ctx, sandboxID, execID)
	if err != nil {
		return apierr.WithMeta(err, meta)
	}
	if prev, known := s.ids.ExecRuntime(sandboxID, execID); known && prev.BootID != current.BootID {
		return apierr.WithMeta(&apierr.StaleHandle{SandboxID: sandboxID, ExecID: execID, Handle: prev, Current: current}, meta)
	}
	if err := call(agent); err != nil {
		return apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
	}
	return nil
}
