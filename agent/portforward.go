package agent

import (
	"errors"
	"fmt"
	"io"

	"github.com/berth-sandbox/berth/internal/portconn"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Port forwarding: the agent dials 127.0.0.1:port in the sandbox's network
// namespace (its own: the agent is PID 1 there) and copies bytes both ways
// between the connection and the stream (package portconn, which berthd
// uses too where it dials in the sandbox's namespace itself).

// PortForward carries one TCP connection to 127.0.0.1:port: the first
// message names the port, the others are bytes to write; a half-close of
// the stream shuts down the connection's writing side. The response is
// connected, then the bytes read, then eof when the server closed its
// writing side. The stream ends OK once both sides closed their writing
// sides, FAILED_PRECONDITION PORT_CLOSED when the dial fails, and ABORTED
// CONNECTION_RESET when the connection fails later.
func (s *Server) PortForward(stream agentv1.AgentService_PortForwardServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return rpcstatus.InvalidArgument("port", "the stream ended before the port")
	}
	if err != nil {
		return err
	}
	p, ok := first.GetEvent().(*agentv1.PortForwardRequest_Port)
	if !ok {
		return rpcstatus.InvalidArgument("port", "the first message must name the port")
	}
	port := p.Port
	if port == 0 || port > 65535 {
		return rpcstatus.InvalidArgument("port", fmt.Sprintf("%d is outside 1 to 65535", port))
	}
	meta := portconn.Meta(port)
	conn, err := portconn.Dial(ctx, port)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if limit := rpcstatus.SandboxLimit(fmt.Sprintf("connect to port %d", port), err, meta); limit != nil {
			return limit
		}
		return portconn.ClosedError(port, err, meta)
	}
	defer conn.Close()
	if err := stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Connected{Connected: &berthv1.PortForwardConnected{Port: port}}}); err != nil {
		return err
	}
	// berthd sends the caller's data as plain chunks: anything else after
	// the port is refused.
	data := func(*wire.Frame) ([]byte, error) {
		return nil, rpcstatus.InvalidArgument("data", "only data may follow the port")
	}
	return portconn.Relay(conn, portconn.Stream{RecvMsg: stream.RecvMsg, Data: data, SendMsg: stream.SendMsg,
		EOF: &agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Eof{Eof: &berthv1.PortForwardEOF{}}}}, meta)
}
