package agent

import (
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/agent/ring"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// readBatch is how many events a stream takes from the ring per lock.
const readBatch = 64

// Exec starts or attaches to an exec and streams its events: ExecStarted,
// then output events in sequence order (ExecDropped for events the ring shed
// before this stream read them, ExecHeartbeat after Config.HeartbeatInterval
// of silence), then ExecExited. Every stream, attach included, begins with
// the exec's ExecStarted. A start with background ends the stream after
// ExecStarted; the exec runs on.
//
// The first message must be start or attach. A start whose exec_id exists
// runs nothing and replays that exec from its first event. A program that
// cannot be found or executed still makes an exec, as in a shell: pid 0,
// exit code 127 (not found) or 126 (not executable) and a
// "berth-agent: <argv0>: ..." line on stderr. After the first message the
// client may send stdin (written in order; the stream's flow control is the
// backpressure), close_stdin (EOF, or EOT typed into a terminal), signal
// (to the process group; an invalid name fails the stream, the process runs
// on) and resize (tty execs only).
//
// Errors: INVALID_ARGUMENT (with a BadRequest naming the field) for a
// malformed message, FAILED_PRECONDITION CWD_INVALID for a bad working
// directory, NOT_FOUND EXEC_NOT_FOUND for an unknown exec id,
// RESOURCE_EXHAUSTED when fork(2) fails, UNAVAILABLE while the agent stops.
// When the client goes away the process keeps running and stays attachable.
func (s *Server) Exec(stream agentv1.AgentService_ExecServer) error {
	s.activity.touch()
	req, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return rpcstatus.InvalidArgument("event", "the stream ended before a start or attach message")
	}
	if err != nil {
		return err
	}
	var (
		e *execution
		r *reader // nil for a background start and an exit_only attach
	)
	switch ev := req.GetEvent().(type) {
	case *agentv1.ExecRequest_Start:
		e, r, err = s.startExec(ev.Start)
	case *agentv1.ExecRequest_Attach:
		e, r, err = s.attachExec(ev.Attach)
	default:
		err = rpcstatus.InvalidArgument("event", fmt.Sprintf("the first message is %s; want start or attach", eventName(req)))
	}
	if err != nil {
		return err
	}
	if r != nil {
		defer r.Close()
	} else if req.GetStart() != nil {
		// A background start: the exec runs on; attach follows it later.
		return stream.Send(e.started)
	}

	inputErr := make(chan error, 1)
	s.streamWG.Add(1)
	go s.receive(stream, e, inputErr)
	return s.follow(stream, e, r, inputErr)
}

// reader is an Exec stream's position in an exec's output log.
type reader = ring.Reader[*outputEvent]

// startExec returns the exec named by start, starting it when the id is
// new, and a reader attached to its output from the first event, unless
// the start is a background one. A new exec's reader is attached before the
// process starts, so that nothing it writes can be shed before the stream
// reads it. Validation happens before anything runs. The new exec is
// published before its process starts, so that a second start of the same
// id waits for it instead of running again; the agent's lock is not held
// while the process starts, so that attaches, lists and Info go on.
func (s *Server) startExec(start *agentv1.ExecStart) (*execution, *reader, error) {
	id := start.GetExecId()
	if err := validateExecID(id); err != nil {
		return nil, nil, err
	}
	background := start.GetBackground()
	if e := s.lookup(id); e != nil {
		return s.follower(e, background)
	}
	sessionID := start.GetProcess().GetSessionId()
	if sessionID != "" {
		if err := checkSessionSpec(start.GetProcess()); err != nil {
			return nil, nil, err
		}
	}
	p, err := s.planStart(start.GetProcess(), start.GetDetachedOutput(), background)
	if err != nil {
		return nil, nil, err
	}
	for {
		s.mu.Lock()
		if !s.serving || s.closing {
			s.mu.Unlock()
			return nil, nil, errUnavailable()
		}
		if s.execs[id] != nil {
			// Another start of the id came first: follow it, or start
			// anew if it failed.
			s.mu.Unlock()
			if e := s.lookup(id); e != nil {
				return s.follower(e, background)
			}
			continue
		}
		e := newExecution(id, p, s.cfg.RingBytes, s.output)
		s.execs[id] = e
		// Before closing can be set: stop waits for launches in flight.
		s.launching.Add(1)
		s.mu.Unlock()
		var r *reader
		if sessionID != "" {
			r, err = s.launchInSession(e, p, !background, sessionID, start.GetProcess().GetShellCommand())
		} else {
			r, err = s.launch(e, p, !background)
		}
		s.launching.Done()
		if err != nil {
			s.mu.Lock()
			delete(s.execs, id)
			s.mu.Unlock()
			e.setLaunched(false)
			return nil, nil, err
		}
		e.setLaunched(true)
		return e, r, nil
	}
}

// follower returns e with a reader from its first event, or without one for
// a background start.
func (s *Server) follower(e *execution, background bool) (*execution, *reader, error) {
	if background {
		return e, nil, nil
	}
	r, err := e.log.Follow(0)
	return e, r, err
}

// attachExec returns the exec named by attach and a reader after its
// since_seq, or no reader for exit_only.
func (s *Server) attachExec(attach *agentv1.ExecAttach) (*execution, *reader, error) {
	id := attach.GetExecId()
	if id == "" {
		return nil, nil, rpcstatus.InvalidArgument("exec_id", "is empty")
	}
	e := s.lookup(id)
	if e == nil {
		return nil, nil, s.execNotFound(id)
	}
	if attach.GetExitOnly() {
		return e, nil, nil
	}
	r, err := e.log.Follow(attach.GetSinceSeq())
	if err != nil {
		return nil, nil, rpcstatus.InvalidArgument("since_seq", fmt.Sprintf("exec %q: %v", id, err))
	}
	return e, r, nil
}

// lookup returns the exec id, once its start is done, or nil when there is
// none or its start failed.
func (s *Server) lookup(id string) *execution {
	s.mu.Lock()
	e := s.execs[id]
	s.mu.Unlock()
	if e == nil || !e.awaitLaunched() {
		return nil
	}
	return e
}

// follow sends e's events after r's position until ExecExited, the client
// goes away, or the receiving side reports an invalid message. Without a
// reader it sends only heartbeats and ExecExited (exit_only).
func (s *Server) follow(stream agentv1.AgentService_ExecServer, e *execution, r *reader, inputErr <-chan error) error {
	ctx := stream.Context()
	if err := stream.Send(e.started); err != nil {
		return err
	}
	if r == nil {
		return s.followExit(stream, e, inputErr)
	}
	buf := make([]*outputEvent, 0, readBatch)
	heartbeat := time.NewTimer(s.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	for {
		select {
		case err := <-inputErr:
			return err
		default:
		}
		events, gap, done, wake := r.Read(buf[:0])
		if gap.Last != 0 {
			dropped := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Dropped{Dropped: &berthv1.ExecDropped{
				FirstSeq: gap.First, LastSeq: gap.Last, LostBytes: gap.Bytes,
			}}}
			if err := stream.Send(dropped); err != nil {
				return err
			}
		}
		for _, ev := range events {
			// Encoded once for every stream: it goes as it is.
			if err := stream.SendMsg(wire.FrameOf(ev.wire)); err != nil {
				return err
			}
		}
		clear(events) // let shed events be freed while this stream waits
		if gap.Last != 0 || len(events) > 0 {
			heartbeat.Reset(s.cfg.HeartbeatInterval)
			continue
		}
		if done {
			return stream.Send(e.exitedEvent())
		}
		select {
		case <-wake:
		case <-heartbeat.C:
			hb := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Heartbeat{Heartbeat: &berthv1.ExecHeartbeat{LastSeq: r.Seq()}}}
			if err := stream.Send(hb); err != nil {
				return err
			}
			heartbeat.Reset(s.cfg.HeartbeatInterval)
		case err := <-inputErr:
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// followExit sends heartbeats until e finishes, then ExecExited.
func (s *Server) followExit(stream agentv1.AgentService_ExecServer, e *execution, inputErr <-chan error) error {
	ctx := stream.Context()
	heartbeat := time.NewTicker(s.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	for {
		select {
		case <-e.done:
			return stream.Send(e.exitedEvent())
		case <-heartbeat.C:
			hb := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Heartbeat{Heartbeat: &berthv1.ExecHeartbeat{LastSeq: e.log.LastSeq()}}}
			if err := stream.Send(hb); err != nil {
				return err
			}
		case err := <-inputErr:
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// receive applies the client's messages after start or attach to e until
// the stream ends. An invalid message is reported on inputErr (buffered)
// and ends the loop; follow then fails the stream with it. It returns
// promptly once the stream ends, except while a stdin write is blocked on
// a full pipe, which lasts until the process reads or the exec finishes.
func (s *Server) receive(stream agentv1.AgentService_ExecServer, e *execution, inputErr chan<- error) {
	defer s.streamWG.Done()
	for {
		req, err := stream.Recv()
		if err != nil {
			// io.EOF: the client sends nothing more but still follows.
			return
		}
		if err := s.apply(e, req); err != nil {
			inputErr <- err
			return
		}
	}
}

// apply carries out one stdin, close_stdin, signal or resize message.
func (s *Server) apply(e *execution, req *agentv1.ExecRequest) error {
	switch ev := req.GetEvent().(type) {
	case *agentv1.ExecRequest_Stdin:
		if !e.hasStdin {
			return rpcstatus.InvalidArgument("stdin", fmt.Sprintf("exec %q was started without stdin (process.stdin is false)", e.id))
		}
		e.writeStdin(ev.Stdin.GetData())
	case *agentv1.ExecRequest_CloseStdin:
		// Without stdin the process reads /dev/null: already at EOF.
		e.closeStdin()
	case *agentv1.ExecRequest_Signal:
		sig, err := parseSignal(ev.Signal.GetSignal())
		if err != nil {
			return err
		}
		if err := e.signal(sig); err != nil {
			return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, err.Error(), map[string]string{"exec_id": e.id})
		}
	case *agentv1.ExecRequest_Resize:
		return e.applyResize("resize", ev.Resize)
	default:
		return rpcstatus.InvalidArgument("event", fmt.Sprintf("%s may only be the first message of the stream", eventName(req)))
	}
	return nil
}

// eventName names the oneof case of req for error messages.
func eventName(req *agentv1.ExecRequest) string {
	switch req.GetEvent().(type) {
	case *agentv1.ExecRequest_Start:
		return "start"
	case *agentv1.ExecRequest_Attach:
		return "attach"
	case *agentv1.ExecRequest_Stdin:
		return "stdin"
	case *agentv1.ExecRequest_CloseStdin:
		return "close_stdin"
	case *agentv1.ExecRequest_Signal:
		return "signal"
	case *agentv1.ExecRequest_Resize:
		return "resize"
	default:
		return "empty (no event set)"
	}
}

// applyResize carries out a resize of e's terminal; field names the
// request's size in errors.
func (e *execution) applyResize(field string, size *berthv1.ExecResize) error {
	if !e.hasTTY {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("exec %q was started without a terminal (process.tty is unset)", e.id))
	}
	rows, cols, err := ttySize(field, size.GetRows(), size.GetCols())
	if err != nil {
		return err
	}
	if err := e.resize(rows, cols); err != nil {
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, err.Error(), map[string]string{"exec_id": e.id})
	}
	return nil
}
