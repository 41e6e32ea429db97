package wsgate

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// terminalHello is a terminal session's first message.
type terminalHello struct {
	hello
	// ExecID is the exec's id (optional; berthd makes one). Start is
	// idempotent on it, as Exec's is.
	ExecID string `json:"execId"`
	// Process is the ProcessSpec in protobuf's JSON (default: argv
	// ["/bin/sh"]). Its tty and stdin are always on; Rows and Cols give
	// the terminal's size (default 24 x 80).
	Process json.RawMessage `json:"process"`
	Rows    uint32          `json:"rows"`
	Cols    uint32          `json:"cols"`
	// Detach keeps the exec running when the session ends before it
	// exits, to be attached again (Attach, ExecAttach); by default the
	// process group gets SIGHUP, as a terminal hangup does.
	Detach bool `json:"detach"`
	// Attach, instead of a start, attaches to the exec with this id from
	// SinceSeq (replaying what the sandbox retained).
	Attach *struct {
		ExecID   string `json:"execId"`
		SinceSeq uint64 `json:"sinceSeq"`
	} `json:"attach"`
}

// request returns the Exec stream's first message.
func (h terminalHello) request() (*berthv1.ExecRequest, error) {
	if h.Attach != nil {
		return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{
			SandboxId: h.SandboxID, ExecId: h.Attach.ExecID, SinceSeq: h.Attach.SinceSeq}}}, nil
	}
	spec := &berthv1.ProcessSpec{Argv: []string{"/bin/sh"}}
	if len(h.Process) > 0 {
		spec = &berthv1.ProcessSpec{}
		if err := protojson.Unmarshal(h.Process, spec); err != nil {
			return nil, invalidArgument(fmt.Sprintf("process: not a berth.v1.ProcessSpec in protobuf JSON: %v", err))
		}
	}
	rows, cols := h.Rows, h.Cols
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	spec.Tty = &berthv1.TtySize{Rows: rows, Cols: cols}
	spec.Stdin = true
	return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: h.SandboxID, ExecId: h.ExecID, Process: spec, HangupOnDisconnect: !h.Detach}}}, nil
}

// terminal serves TerminalPath: one Exec with a tty. Binary messages are
// the terminal's bytes both ways (stdin in, output out); text messages are
// JSON: from the client control (resize, signal, closeStdin), from berthd
// "started", "dropped" and, at the end, "exited" with the ExecResult.
func (h *Handler) terminal(ctx context.Context, s *session) error {
	var hi terminalHello
	if err := s.readHello(ctx, h.cfg.HelloTimeout, &hi); err != nil {
		return err
	}
	first, err := hi.request()
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithCancel(s.callContext(ctx, hi.Token))
	defer cancel()
	stream, err := berthv1.NewSandboxServiceClient(s.ip).Exec(callCtx)
	if err != nil {
		return err
	}
	if err := stream.Send(first); err != nil {
		_, err = stream.Recv() // the call's status says why
		return err
	}
	s.pump(ctx, cancel, func(typ websocket.MessageType, b []byte) error {
		req, err := terminalInput(typ, b)
		if err != nil {
			return err
		}
		// A send error means the call ended: Recv reports why.
		stream.Send(req)
		return nil
	})
	for {
		resp, err := stream.Recv()
		if err != nil {
			return s.callEnded(err)
		}
		switch ev := resp.GetEvent().(type) {
		case *berthv1.ExecResponse_Started:
			err = s.sendJSON(ctx, map[string]any{"type": "started", "execId": ev.Started.GetExecId(), "pid": ev.Started.GetPid()})
		case *berthv1.ExecResponse_Output:
			err = s.write(ctx, websocket.MessageBinary, ev.Output.GetData())
		case *berthv1.ExecResponse_Dropped:
			err = s.sendJSON(ctx, map[string]any{"type": "dropped", "firstSeq": ev.Dropped.GetFirstSeq(),
				"lastSeq": ev.Dropped.GetLastSeq(), "lostBytes": ev.Dropped.GetLostBytes()})
		case *berthv1.ExecResponse_Exited:
			result, merr := protojson.Marshal(ev.Exited.GetResult())
			if merr != nil {
				return merr
			}
			return s.sendJSON(ctx, map[string]any{"type": "exited", "result": json.RawMessage(result)})
		}
		if err != nil {
			return s.callEnded(err)
		}
	}
}

// terminalInput turns a client's message after the first into an
// ExecRequest: binary is stdin, text a control message.
func terminalInput(typ websocket.MessageType, b []byte) (*berthv1.ExecRequest, error) {
	if typ == websocket.MessageBinary {
		return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: b}}}, nil
	}
	c, err := readControl(b)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "resize":
		return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Resize{Resize: &berthv1.ExecResize{Rows: c.Rows, Cols: c.Cols}}}, nil
	case "signal":
		return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: c.Signal}}}, nil
	case "closeStdin":
		return &berthv1.ExecRequest{Event: &berthv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}, nil
	}
	return nil, invalidArgument(fmt.Sprintf("type: a terminal's control message is \"resize\", \"signal\" or \"closeStdin\", not %q", c.Type))
}
