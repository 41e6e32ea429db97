package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/runout"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// agentInfoTimeout bounds a status query to an agent made while answering
// GetSandbox or ListSandboxes.
const agentInfoTimeout = 2 * time.Second

// agentFor returns a client for the agent of a running sandbox once it
// answered within the connect budget. It fails with ErrSandboxNotFound or an
// *unreachableError (see reach).
func (s *Service) agentFor(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error) {
	agent, _, err := s.reach(ctx, sandboxID, "")
	return agent, err
}

// Exec proxies one exec stream between the caller and the sandbox's agent.
// The agent owns the exec: when the caller goes away the process keeps
// running and stays attachable. Events pass through without copying their
// payloads. A background start ends with OK after started.
func (s *Service) Exec(stream berthv1.SandboxService_ExecServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return rpcstatus.InvalidArgument("event", "the stream ended before a start or attach message")
		}
		return s.toStatus(ctx, err, nil)
	}
	var (
		sandboxID  string
		execID     string
		opening    *agentv1.ExecRequest
		background bool
		hangup     bool // SIGHUP to the exec when the caller goes away
	)
	switch ev := first.GetEvent().(type) {
	case *berthv1.ExecRequest_Start:
		sandboxID = ev.Start.GetSandboxId()
		execID, err = s.execID("start.exec_id", ev.Start.GetExecId())
		if err != nil {
			return err
		}
		if ev.Start.GetProcess() == nil {
			return rpcstatus.InvalidArgument("start.process", "is missing")
		}
		if err := validateProcess("start.process", ev.Start.GetProcess()); err != nil {
			return err
		}
		background = ev.Start.GetBackground()
		hangup = ev.Start.GetHangupOnDisconnect() && !background
		process := ev.Start.GetProcess()
		if !background { // a background start asked to outlive the call
			process = withCallerDeadline(ctx, process)
		}
		opening = &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: execID, Process: process,
			Background: background, DetachedOutput: ev.Start.GetDetachedOutput()}}}
	case *berthv1.ExecRequest_Attach:
		sandboxID = ev.Attach.GetSandboxId()
		execID = ev.Attach.GetExecId()
		if err := validateExecID("attach.exec_id", execID); err != nil {
			return err
		}
		opening = &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: ev.Attach.GetExecId(), SinceSeq: ev.Attach.GetSinceSeq()}}}
	default:
		return rpcstatus.InvalidArgument("event", "the first message must be start or attach")
	}
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": execID}
	if err := validateSandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	annotate(ctx, sandboxID, execID)
	_, isStart := first.GetEvent().(*berthv1.ExecRequest_Start)
	guard, err := s.guardExec(ctx, sandboxID, execID, isStart)
	if err != nil {
		return s.toStatus(ctx, err, meta)
	}
	defer guard.close()

	// agentCtx ends the agent stream when the caller breaks the protocol,
	// and when the sandbox's runtime dies (the guard); the caller going away
	// ends it through ctx.
	agentCtx := guard.streamContext(ctx)
	upstream, err := guard.agent.Exec(agentCtx, wire.CallOption())
	if err != nil {
		return s.toStatus(ctx, guard.failed(ctx, err), meta)
	}
	if err := upstream.Send(opening); err != nil && !errors.Is(err, io.EOF) {
		return s.toStatus(ctx, guard.failed(ctx, err), meta)
	}
	guard.opened()
	var protoErr protocolError
	// The forwarder ends when the caller closes its side or the stream's
	// context ends, which returning from this handler does.
	go forwardCaller(stream, upstream, &protoErr, guard.cancel)

	var (
		resp eventWrapper
		fr   wire.Frame
	)
	defer fr.Free()
	msg := &agentv1.ExecResponse{}
	started := false
	// sendFailed ends the handler when sending to the caller failed: the
	// caller went away, maybe while output flowed.
	sendFailed := func(err error) error {
		if hangup && started && ctx.Err() != nil {
			s.hangUp(ctx, guard, execID)
		}
		return s.toStatus(ctx, err, meta)
	}
	for {
		err := upstream.RecvMsg(&fr)
		if err == nil {
			// An output event goes on as it is on the wire: its field
			// numbers are the same in both APIs (TestExecEventFields),
			// and ExecOutput passes only {seq, stream, data}, nothing a
			// hostile agent could add.
			if seq, outStream, ok := fr.ExecOutput(); ok {
				guard.seenOutput(seq, outStream, fr.DataLen())
				if err := stream.SendMsg(&fr); err != nil {
					return sendFailed(err)
				}
				continue
			}
			msg.Reset()
			err = fr.Decode(msg)
			fr.Free()
		}
		if err != nil {
			if perr := protoErr.get(); perr != nil {
				return perr
			}
			if errors.Is(err, io.EOF) && background && started {
				// The agent ends a background start after started.
				return nil
			}
			if hangup && started && ctx.Err() != nil {
				s.hangUp(ctx, guard, execID)
			}
			return s.toStatus(ctx, publicExecFields(guard.failed(ctx, err), isStart), meta)
		}
		guard.seen(msg)
		if !resp.set(msg) {
			continue
		}
		started = started || msg.GetStarted() != nil
		if err := stream.Send(&resp.ExecResponse); err != nil {
			return sendFailed(err)
		}
		if ex := msg.GetExited(); ex != nil {
			trace.SpanFromContext(ctx).SetAttributes(attribute.Int("berth.exec.exit_code", int(ex.GetResult().GetExitCode())))
			return nil
		}
	}
}

// hangUp sends SIGHUP to the process group of execID, whose caller went
// away (ctx ended) before it exited: its hangup_on_disconnect asked for
// what a terminal hangup does. At best effort, within the connect budget.
func (s *Service) hangUp(ctx context.Context, guard *execGuard, execID string) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ConnectBudget)
	defer cancel()
	if _, err := guard.agent.SignalExec(hctx, &agentv1.SignalExecRequest{ExecId: execID, Signal: "HUP"}); err != nil {
		s.log.WarnContext(ctx, "hang up exec whose caller went away", slog.String("sandbox_id", guard.sandboxID), slog.String("exec_id", execID), slog.Any("error", err))
	}
}

// eventWrapper re-wraps agent events as public ones, sharing the payload.
// Its oneof wrappers are reused from event to event: Send marshals before
// it returns, so the output path allocates nothing per event in berthd.
type eventWrapper struct {
	berthv1.ExecResponse
	started   berthv1.ExecResponse_Started
	output    berthv1.ExecResponse_Output
	heartbeat berthv1.ExecResponse_Heartbeat
	dropped   berthv1.ExecResponse_Dropped
	exited    berthv1.ExecResponse_Exited
}

// set points w at msg's event; false for an event it does not know.
func (w *eventWrapper) set(msg *agentv1.ExecResponse) bool {
	switch ev := msg.GetEvent().(type) {
	case *agentv1.ExecResponse_Started:
		w.started.Started, w.Event = ev.Started, &w.started
	case *agentv1.ExecResponse_Output:
		w.output.Output, w.Event = ev.Output, &w.output
	case *agentv1.ExecResponse_Heartbeat:
		w.heartbeat.Heartbeat, w.Event = ev.Heartbeat, &w.heartbeat
	case *agentv1.ExecResponse_Dropped:
		w.dropped.Dropped, w.Event = ev.Dropped, &w.dropped
	case *agentv1.ExecResponse_Exited:
		w.exited.Exited, w.Event = ev.Exited, &w.exited
	default:
		return false
	}
	return true
}

// protocolError records the first protocol violation of a caller.
type protocolError struct {
	mu  sync.Mutex
	err error
}

func (p *protocolError) set(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

func (p *protocolError) get() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// forwardCaller forwards the caller's stdin, close_stdin, signal and resize
// messages to the agent in order. The agent's stream flow control is the
// back-pressure for stdin. A second start or attach is a protocol error:
// it is recorded and the agent stream is canceled.
func forwardCaller(stream berthv1.SandboxService_ExecServer, upstream agentv1.AgentService_ExecClient, protoErr *protocolError, cancel context.CancelFunc) {
	out := &agentv1.ExecRequest{}
	for {
		msg, err := stream.Recv()
		if err != nil {
			// io.EOF: the caller closed its side; anything else: the stream
			// ended. Either way nothing more will come.
			upstream.CloseSend()
			return
		}
		switch ev := msg.GetEvent().(type) {
		case *berthv1.ExecRequest_Stdin:
			out.Event = &agentv1.ExecRequest_Stdin{Stdin: ev.Stdin}
		case *berthv1.ExecRequest_CloseStdin:
			out.Event = &agentv1.ExecRequest_CloseStdin{CloseStdin: ev.CloseStdin}
		case *berthv1.ExecRequest_Signal:
			out.Event = &agentv1.ExecRequest_Signal{Signal: ev.Signal}
		case *berthv1.ExecRequest_Resize:
			out.Event = &agentv1.ExecRequest_Resize{Resize: ev.Resize}
		default:
			protoErr.set(rpcstatus.InvalidArgument("event", "only stdin, close_stdin, signal and resize may follow the first message"))
			cancel()
			return
		}
		if err := upstream.Send(out); err != nil {
			// The agent side ended; its Recv reports why.
			return
		}
	}
}

// agentError classifies an error from an agent RPC made outside an exec
// (see execGuard.failed for those). Statuses the agent built (with a berth
// ErrorInfo) pass unchanged; transport failures mean the agent is
// unreachable.
func agentError(sandboxID string, err error) error {
	if rpcstatus.Reason(err) != "" {
		return err
	}
	if errors.Is(err, agentconn.ErrUnverified) {
		return &unreachableError{sandboxID: sandboxID, cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_UNVERIFIED,
			taskRunning: true, admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, what: err.Error() + "; nothing was sent to it"}
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return &unreachableError{sandboxID: sandboxID, cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECTION_LOST,
			taskRunning: true, admitted: berthv1.Admitted_ADMITTED_UNKNOWN, what: "the connection to the agent broke: " + grpcMessage(err)}
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return fmt.Errorf("agent of sandbox %s: %w", sandboxID, err)
}

// execID validates a caller's exec id or mints one.
func (s *Service) execID(field, id string) (string, error) {
	if id == "" {
		return newID("ex-", 12), nil
	}
	if err := validateExecID(field, id); err != nil {
		return "", err
	}
	return id, nil
}

// Run runs a process to completion through the agent and returns its
// collected output: the head of each stream up to its cap (defaults
// Config.RunStdoutBytes and RunStderrBytes), which berthd applies itself
// whatever the agent sends. The agent stream is read from before the
// process starts and flow control holds the process while berthd collects,
// so no byte within the caps is lost; should any be missing (an agent that
// drops output), Run fails with DATA_LOSS OUTPUT_LOST rather than answer
// with a result that looks complete. Caps that together exceed
// Config.RunMaxOutputBytes are INVALID_ARGUMENT naming the field; a Run
// whose caps do not fit the server's Run buffer budget is FLEET_BUSY;
// neither starts anything.
func (s *Service) Run(ctx context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	sandboxID := req.GetSandboxId()
	if err := validateSandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	execID, err := s.execID("exec_id", req.GetExecId())
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": execID}
	annotate(ctx, sandboxID, execID)
	if req.GetProcess() == nil {
		return nil, rpcstatus.InvalidArgument("process", "is missing")
	}
	if req.GetProcess().GetStdin() {
		return nil, rpcstatus.InvalidArgument("process.stdin", "Run has no stdin; use Exec")
	}
	if err := validateProcess("process", req.GetProcess()); err != nil {
		return nil, err
	}
	spec, err := s.runSpec(req.GetProcess())
	if err != nil {
		return nil, err
	}
	spec = withCallerDeadline(ctx, spec)
	reserved := spec.GetStdoutLimitBytes() + spec.GetStderrLimitBytes()
	release, used, ok := s.runBuffers.Reserve(reserved)
	if !ok {
		return nil, s.toStatus(ctx, &fleetBusyError{sandboxID: sandboxID, resource: berthv1.CapacityResource_CAPACITY_RESOURCE_RUN_OUTPUT,
			limit: s.runBuffers.Limit(), inUse: used, requested: reserved, retryDelay: s.cfg.BusyRetryDelay}, meta)
	}
	defer release()
	guard, err := s.guardExec(ctx, sandboxID, execID, true)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	defer guard.close()
	upstream, err := guard.agent.Exec(guard.streamContext(ctx))
	if err != nil {
		return nil, s.toStatus(ctx, guard.failed(ctx, err), meta)
	}
	start := &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: execID, Process: spec}}}
	if err := upstream.Send(start); err != nil && !errors.Is(err, io.EOF) {
		return nil, s.toStatus(ctx, guard.failed(ctx, err), meta)
	}
	guard.opened()
	if err := upstream.CloseSend(); err != nil {
		return nil, s.toStatus(ctx, guard.failed(ctx, err), meta)
	}
	out := runout.NewCollector(spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes())
	for {
		msg, err := upstream.Recv()
		if err != nil {
			return nil, s.toStatus(ctx, guard.failed(ctx, err), meta)
		}
		guard.seen(msg)
		switch ev := msg.GetEvent().(type) {
		case *agentv1.ExecResponse_Output:
			out.Output(ev.Output)
		case *agentv1.ExecResponse_Dropped:
			out.Dropped(ev.Dropped)
		case *agentv1.ExecResponse_Exited:
			resp, err := out.Response(execID, ev.Exited.GetResult())
			if err != nil {
				return nil, outputLost(sandboxID, execID, err)
			}
			return resp, nil
		}
	}
}

// runSpec returns a copy of a Run's process spec with its output caps
// resolved: Config.RunStdoutBytes and RunStderrBytes when unset, and
// INVALID_ARGUMENT naming the cap when they exceed Config.RunMaxOutputBytes
// together.
func (s *Service) runSpec(spec *berthv1.ProcessSpec) (*berthv1.ProcessSpec, error) {
	out, errOut := spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes()
	if out == 0 {
		out = s.cfg.RunStdoutBytes
	}
	if errOut == 0 {
		errOut = s.cfg.RunStderrBytes
	}
	maxBytes := s.cfg.RunMaxOutputBytes
	// The sum is checked: caps near 2^64 would wrap it below the maximum.
	switch sum, ok := bounds.Add(out, errOut); {
	case out > maxBytes:
		return nil, rpcstatus.InvalidArgument("process.stdout_limit_bytes", fmt.Sprintf(
			"%d bytes exceeds the server's Run maximum of %d bytes for both caps together; stream more with Exec", out, maxBytes))
	case !ok || sum > maxBytes:
		return nil, rpcstatus.InvalidArgument("process.stderr_limit_bytes", fmt.Sprintf(
			"%d bytes with process.stdout_limit_bytes %d exceeds the server's Run maximum of %d bytes for both caps together; stream more with Exec", errOut, out, maxBytes))
	}
	spec = proto.CloneOf(spec)
	spec.StdoutLimitBytes, spec.StderrLimitBytes = out, errOut
	return spec, nil
}

// outputLost is DATA_LOSS OUTPUT_LOST for a Run whose output arrived
// incomplete: the command ran, but the Run cannot return all of its output
// within the caps.
func outputLost(sandboxID, execID string, err error) error {
	return rpcstatus.Error(codes.DataLoss, rpcstatus.ReasonOutputLost,
		fmt.Sprintf("exec %s in sandbox %s ran, but its output did not arrive complete: %v; attach to the exec for what is retained", execID, sandboxID, err),
		map[string]string{"sandbox_id": sandboxID, "exec_id": execID})
}
