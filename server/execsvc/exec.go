package execsvc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Exec proxies one exec stream between the caller and the sandbox's agent.
// The agent owns the exec: when the caller goes away the process keeps
// running and stays attachable. Events pass through without copying their
// payloads. A background start ends with OK after started.
func (s *Service) Exec(stream berthv1.SandboxService_ExecServer) error {
	return s.exec(stream, true)
}

// exec serves one exec stream: Exec's, or a split call's (split.go). nested
// says that the first message's fields sit under start. or attach., as in
// Exec's ExecRequest; the split calls' requests have them at their top,
// where errors name them so.
func (s *Service) exec(stream berthv1.SandboxService_ExecServer, nested bool) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return apierr.InvalidArgument("event", "the stream ended before a start or attach message")
		}
		return err
	}
	var (
		sandboxID  string
		execID     string
		opening    *agentv1.ExecRequest
		background bool
		hangup     bool // SIGHUP to the exec when the caller goes away
	)
	_, isStart := first.GetEvent().(*berthv1.ExecRequest_Start)
	// The opening's fields as the caller's request spells them: under
	// Exec's start or attach (execFieldPrefix), at the top of StartExec's
	// and AttachExec's. Constants: no concatenation on every start.
	execIDField, processField := "exec_id", "process"
	switch {
	case nested && isStart:
		execIDField, processField = "start.exec_id", "start.process"
	case nested:
		execIDField = "attach.exec_id"
	}
	switch ev := first.GetEvent().(type) {
	case *berthv1.ExecRequest_Start:
		sandboxID = ev.Start.GetSandboxId()
		execID, err = s.execID(execIDField, ev.Start.GetExecId())
		if err != nil {
			return err
		}
		if ev.Start.GetProcess() == nil {
			return apierr.InvalidArgument(processField, "is missing")
		}
		if err := validate.Process(processField, ev.Start.GetProcess()); err != nil {
			return err
		}
		background = ev.Start.GetBackground()
		hangup = ev.Start.GetHangupOnDisconnect() && !background
		process := ev.Start.GetProcess()
		if !background { // a background start asked to outlive the call
			process = validate.WithCallerDeadline(ctx, process)
		}
		opening = &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: execID, Process: process,
			Background: background, DetachedOutput: ev.Start.GetDetachedOutput()}}}
	case *berthv1.ExecRequest_Attach:
		sandboxID = ev.Attach.GetSandboxId()
		execID = ev.Attach.GetExecId()
		if err := validate.ExecID(execIDField, execID); err != nil {
			return err
		}
		opening = &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: ev.Attach.GetExecId(), SinceSeq: ev.Attach.GetSinceSeq()}}}
	default:
		return apierr.InvalidArgument("event", "the first message must be start or attach")
	}
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": execID}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	telemetry.Annotate(ctx, sandboxID, execID)
	guard, upstream, err := s.openAgentExec(ctx, sandboxID, execID, isStart, opening)
	if err != nil {
		return apierr.WithMeta(err, meta)
	}
	defer guard.close()
	var protoErr validate.ProtocolError
	// The forwarder ends when the caller closes its side or the stream's
	// context ends, which returning from this handler does.
	go forwardCaller(stream, upstream, &protoErr, guard.cancel)
	// sendMu orders this loop's sends with the paused heartbeats'; sentSeq
	// is the last sequence number the caller was sent, which they carry.
	var (
		sendMu  sync.Mutex
		sentSeq uint64
	)
	stopBeats := s.pausedHeartbeats(ctx, sandboxID, func(paused bool) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Heartbeat{Heartbeat: &berthv1.ExecHeartbeat{LastSeq: sentSeq, SandboxPaused: paused}}})
	})
	defer stopBeats()

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
		return apierr.WithMeta(err, meta)
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
				sendMu.Lock()
				err := stream.SendMsg(&fr)
				sentSeq = max(sentSeq, seq)
				sendMu.Unlock()
				if err != nil {
					return sendFailed(err)
				}
				continue
			}
			msg.Reset()
			err = fr.Decode(msg)
			fr.Free()
		}
		if err != nil {
			if perr := protoErr.Get(); perr != nil {
				return perr
			}
			if errors.Is(err, io.EOF) && background && started {
				// The agent ends a background start after started.
				return nil
			}
			if hangup && started && ctx.Err() != nil {
				s.hangUp(ctx, guard, execID)
			}
			err = guard.failed(ctx, err)
			if nested {
				err = publicExecFields(err, isStart)
			}
			return apierr.WithMeta(err, meta)
		}
		guard.seen(msg)
		if !resp.set(msg) {
			continue
		}
		started = started || msg.GetStarted() != nil
		sendMu.Lock()
		err = stream.Send(&resp.ExecResponse)
		sentSeq = max(sentSeq, msg.GetDropped().GetLastSeq(), msg.GetHeartbeat().GetLastSeq())
		sendMu.Unlock()
		if err != nil {
			return sendFailed(err)
		}
		if ex := msg.GetExited(); ex != nil {
			trace.SpanFromContext(ctx).SetAttributes(attribute.Int("berth.exec.exit_code", int(ex.GetResult().GetExitCode())))
			return nil
		}
	}
}

// pausedBeat is how often an attached Exec stream says its sandbox is
// paused while it is, as the agent's heartbeats do while a process is
// silent.
const pausedBeat = 15 * time.Second

// pausedHeartbeats sends, through send, the heartbeats of a paused sandbox
// (ExecHeartbeat.sandbox_paused, with the last sequence number sent): its agent is frozen and sends nothing,
// so berthd tells the caller why the stream is quiet, and when the sandbox
// runs again. It stops when ctx ends or the returned function is called.
func (s *Service) pausedHeartbeats(ctx context.Context, sandboxID string, send func(paused bool) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		told := false // what the caller was last told
		for {
			// Woken by a pause or resume (PauseWatch), not by polling: a
			// stream of a running sandbox costs nothing here.
			paused, changed := s.reach.PauseWatch(sandboxID)
			if paused != told {
				if send(paused) != nil {
					return
				}
				told = paused
			}
			var beat *time.Timer
			var beats <-chan time.Time
			if paused {
				beat = time.NewTimer(pausedBeat)
				beats = beat.C
			}
			var err error
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-changed:
			case <-beats:
				err = send(true)
			}
			if beat != nil {
				beat.Stop()
			}
			if err != nil {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
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

// forwardCaller forwards the caller's stdin, close_stdin, signal and resize
// messages to the agent in order. The agent's stream flow control is the
// back-pressure for stdin. A second start or attach is a protocol error:
// it is recorded and the agent stream is canceled.
func forwardCaller(stream berthv1.SandboxService_ExecServer, upstream agentv1.AgentService_ExecClient, protoErr *validate.ProtocolError, cancel context.CancelFunc) {
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
			protoErr.Set(apierr.InvalidArgument("event", "only stdin, close_stdin, signal and resize may follow the first message"))
			cancel()
			return
		}
		if err := upstream.Send(out); err != nil {
			// The agent side ended; its Recv reports why.
			return
		}
	}
}

// execID validates a caller's exec id or mints one.
func (s *Service) execID(field, id string) (string, error) {
	if id == "" {
		return sandboxid.New("ex-", 12), nil
	}
	if err := validate.ExecID(field, id); err != nil {
		return "", err
	}
	return id, nil
}
