package wsgate

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/coder/websocket"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// portForwardHello is a port forward session's first message.
type portForwardHello struct {
	hello
	// Port is the TCP port in the sandbox, 1-65535.
	Port uint32 `json:"port"`
}

// portForward serves PortForwardPath: one PortForward. Binary messages
// are the connection's bytes both ways. Text messages are JSON: from
// berthd "connected" once the port accepted, "eof" when the sandbox's side
// closed its writing half; from the client "eof" to close its own
// writing half. The session ends (close 1000) when the forward does.
func (h *Handler) portForward(ctx context.Context, s *session) error {
	var hi portForwardHello
	if err := s.readHello(ctx, h.cfg.HelloTimeout, &hi); err != nil {
		return err
	}
	callCtx, cancel := context.WithCancel(s.callContext(ctx, hi.Token))
	defer cancel()
	stream, err := berthv1.NewSandboxServiceClient(s.ip).PortForward(callCtx)
	if err != nil {
		return err
	}
	start := &berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: hi.SandboxID, Port: hi.Port}}}
	if err := stream.Send(start); err != nil {
		_, err = stream.Recv()
		return err
	}
	s.pump(ctx, cancel, func(typ websocket.MessageType, b []byte) error {
		if typ == websocket.MessageBinary {
			// A send error means the call ended: Recv reports why.
			stream.Send(&berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Data{Data: b}})
			return nil
		}
		c, err := readControl(b)
		if err != nil {
			return err
		}
		if c.Type != "eof" {
			return invalidArgument(fmt.Sprintf("type: a port forward's control message is \"eof\", not %q", c.Type))
		}
		stream.CloseSend()
		return nil
	})
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return s.callEnded(err)
		}
		switch ev := resp.GetEvent().(type) {
		case *berthv1.PortForwardResponse_Connected:
			err = s.sendJSON(ctx, map[string]any{"type": "connected", "port": ev.Connected.GetPort()})
		case *berthv1.PortForwardResponse_Data:
			err = s.write(ctx, websocket.MessageBinary, ev.Data)
		case *berthv1.PortForwardResponse_Eof:
			err = s.sendJSON(ctx, map[string]any{"type": "eof"})
		}
		if err != nil {
			return s.callEnded(err)
		}
	}
}
