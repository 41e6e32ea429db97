package execsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/portconn"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// PortForward carries one connection to 127.0.0.1:port in the sandbox. It
// is a plain bidirectional stream through the normal handler path:
// authenticated, counted as activity in the sandbox while it lasts, and
// another principal's sandbox is NOT_FOUND exactly as a missing one
// (reach), whose agent has answered before anything is dialed.
//
// For a runc sandbox berthd dials the port itself in the sandbox's network
// namespace (Deps.Ports, runtime.DialPort) and relays between the socket
// and the stream as the agent would (portconn): one process less on the
// path. Otherwise (gVisor, whose network is its own stack; a task berthd
// cannot prove is the sandbox's; a dial that fails for want of a resource
// of berthd's own) the agent dials, and berthd relays between the two
// streams: data messages pass through as they are on the wire, in gRPC's
// buffers (wire.Frame), not decoded, not encoded, not copied; each
// direction holds one message at a time, so gRPC's flow control on both
// streams is the back-pressure end to end. Either way a closed port is
// FAILED_PRECONDITION PORT_CLOSED and a connection that fails later
// ABORTED CONNECTION_RESET, both naming the port.
func (s *Service) PortForward(stream berthv1.SandboxService_PortForwardServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return apierr.InvalidArgument("start", "the stream ended before the start message")
		}
		return err
	}
	start := first.GetStart()
	if start == nil {
		return apierr.InvalidArgument("start", "the first message must be start")
	}
	id, port := start.GetSandboxId(), start.GetPort()
	if err := validate.SandboxID("start.sandbox_id", id); err != nil {
		return err
	}
	if port == 0 || port > 65535 {
		return apierr.InvalidArgument("start.port", fmt.Sprintf("%d is outside 1 to 65535", port))
	}
	meta := map[string]string{"sandbox_id": id, "port": strconv.FormatUint(uint64(port), 10)}
	// Watch before reaching: an exit between the two must not go unseen.
	w := s.events.Watch(id)
	defer s.events.Unwatch(w)
	agent, task, err := s.reach.Reach(ctx, id, "")
	if err != nil {
		return apierr.WithMeta(err, meta)
	}
	s.events.Expect(w, task.TaskPID, task.StartedAt)
	var release func()
	direct := false
	if s.ports != nil {
		release, direct = s.direct.take(id)
	}
	if direct {
		conn, err := s.ports.DialPort(ctx, id, task.TaskPID, port)
		if err != nil {
			release()
		}
		switch {
		case err == nil:
			defer release()
			return apierr.WithMeta(forwardDirect(stream, conn, port, s.events.Fired(w)), meta)
		case ctx.Err() != nil:
			return ctx.Err()
		case portconn.Refused(err):
			return apierr.WithMeta(portconn.ClosedError(port, err, portconn.Meta(port)), meta)
		}
		// The agent dials instead (as past the bounds of directSlots).
		s.log.Debug("port forward through the agent", slog.String("sandbox_id", id), slog.Any("why", err))
	}
	agentCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	upstream, err := agent.PortForward(agentCtx, wire.CallOption())
	if err != nil {
		return apierr.WithMeta(agentreach.AgentError(id, err), meta)
	}
	if err := upstream.Send(&agentv1.PortForwardRequest{Event: &agentv1.PortForwardRequest_Port{Port: port}}); err != nil && !errors.Is(err, io.EOF) {
		return apierr.WithMeta(agentreach.AgentError(id, err), meta)
	}
	var protoErr validate.ProtocolError
	var resp portWrapper
	var fr wire.Frame
	defer fr.Free()
	connected := false
	for {
		err := upstream.RecvMsg(&fr)
		if errors.Is(err, io.EOF) {
			if !connected {
				return apierr.WithMeta(fmt.Errorf("agent of sandbox %s ended the port forward without connecting or refusing", id), meta)
			}
			return nil
		}
		if err != nil {
			if perr := protoErr.Get(); perr != nil {
				return perr
			}
			return apierr.WithMeta(agentreach.AgentError(id, err), meta)
		}
		// A data message goes on as it came (the field is data in both
		// packages, TestPortDataFields); the agent's frames are untrusted
		// input, so only exactly that one field of the length the frame
		// holds is relayed undecoded. Anything else is decoded and
		// re-wrapped.
		if _, ok := fr.Chunk(portDataField); ok {
			err = stream.SendMsg(&fr)
		} else {
			var msg agentv1.PortForwardResponse
			if err := fr.Decode(&msg); err != nil {
				return apierr.WithMeta(fmt.Errorf("agent of sandbox %s sent a port-forward message that does not decode: %w", id, err), meta)
			}
			if !resp.set(&msg) {
				continue
			}
			err = stream.Send(&resp.PortForwardResponse)
		}
		if err != nil {
			return apierr.WithMeta(err, meta)
		}
		if !connected {
			// The caller's bytes follow the agent's connect: a refused
			// port ends the stream before anything is forwarded.
			connected = true
			go forwardPortData(stream, upstream, &protoErr, cancel)
		}
	}
}

// DefaultDirectForwardsPerSandbox is Config.DirectForwardsPerSandbox when
// unset: the connections of one sandbox berthd dials itself at once.
const DefaultDirectForwardsPerSandbox = 256

// directSlots counts the PortForward connections berthd dialed itself,
// in all and by sandbox. Each holds a descriptor of berthd's, where
// through the agent it held one of the sandbox's (under the sandbox's
// RLIMIT_NOFILE): past the bounds the agent dials, so a tenant cannot
// spend berthd's descriptors, which every other call needs.
type directSlots struct {
	mu         sync.Mutex
	total      int
	perSandbox int
	n          int
	bySandbox  map[string]int
}

// newDirectSlots bounds direct connections to total (0: a quarter of
// berthd's RLIMIT_NOFILE, at least 64) and perSandbox of one sandbox (0:
// DefaultDirectForwardsPerSandbox).
func newDirectSlots(total, perSandbox int) *directSlots {
	if total <= 0 {
		total = 64
		var lim unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur/4 > uint64(total) {
			total = int(min(lim.Cur/4, 1<<30))
		}
	}
	if perSandbox <= 0 {
		perSandbox = DefaultDirectForwardsPerSandbox
	}
	return &directSlots{total: total, perSandbox: perSandbox, bySandbox: make(map[string]int)}
}

// take reserves a direct connection of sandbox id: false when berthd
// holds as many as it may (the agent dials then); call release when the
// connection is closed or was never made.
func (d *directSlots) take(id string) (release func(), ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n >= d.total || d.bySandbox[id] >= d.perSandbox {
		return nil, false
	}
	d.n++
	d.bySandbox[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.n--
			if d.bySandbox[id]--; d.bySandbox[id] == 0 {
				delete(d.bySandbox, id)
			}
		})
	}, true
}

// portDataField is the number of the data field of the port-forward messages:
// the same in berth.v1 and berth.agent.v1, requests and responses.
var portDataField = portconn.DataField

// forwardDirect carries the caller's connection on conn, which berthd
// dialed in the sandbox, and closes it: connected, then the bytes both
// ways (portconn.Relay). Each plain data message is written from gRPC's
// buffer; one encoded another way is decoded; anything else after the
// start ends the stream INVALID_ARGUMENT naming "data". When exited is
// closed (the sandbox's task exited or was deleted) the connection ends
// ABORTED CONNECTION_RESET, as one through the agent ends with the agent,
// whatever the caller's side does: berthd's socket would otherwise keep
// the task's network namespace alive as long as the caller kept its
// stream open.
func forwardDirect(stream berthv1.SandboxService_PortForwardServer, conn *net.TCPConn, port uint32, exited <-chan struct{}) error {
	defer conn.Close()
	if err := stream.Send(&berthv1.PortForwardResponse{Event: &berthv1.PortForwardResponse_Connected{Connected: &berthv1.PortForwardConnected{Port: port}}}); err != nil {
		return err
	}
	data := func(fr *wire.Frame) ([]byte, error) {
		var msg berthv1.PortForwardRequest
		if err := fr.Decode(&msg); err != nil {
			return nil, apierr.InvalidArgument("data", "is not a valid message: "+err.Error())
		}
		ev, ok := msg.GetEvent().(*berthv1.PortForwardRequest_Data)
		if !ok {
			return nil, apierr.InvalidArgument("data", "only data may follow the start message")
		}
		return ev.Data, nil
	}
	relayed := make(chan error, 1)
	go func() {
		relayed <- portconn.Relay(conn, portconn.Stream{RecvMsg: stream.RecvMsg, Data: data, SendMsg: stream.SendMsg,
			EOF: &berthv1.PortForwardResponse{Event: &berthv1.PortForwardResponse_Eof{Eof: &berthv1.PortForwardEOF{}}}}, portconn.Meta(port))
	}()
	select {
	case err := <-relayed:
		return err
	case <-exited:
		// Closing conn ends the copy from it; the end of the handler ends
		// the caller's Recv in the copy to it.
		conn.Close()
		return apierr.New(codes.Aborted, rpcstatus.ReasonConnectionReset,
			fmt.Sprintf("the connection to port %d in the sandbox failed: the sandbox's task exited", port), portconn.Meta(port))
	}
}

// portWrapper re-wraps agent events as public ones, sharing the payload;
// its oneof wrappers are reused from message to message.
type portWrapper struct {
	berthv1.PortForwardResponse
	connected berthv1.PortForwardResponse_Connected
	data      berthv1.PortForwardResponse_Data
	eof       berthv1.PortForwardResponse_Eof
}

// set points w at msg's event; false for an event it does not know.
func (w *portWrapper) set(msg *agentv1.PortForwardResponse) bool {
	switch ev := msg.GetEvent().(type) {
	case *agentv1.PortForwardResponse_Connected:
		w.connected.Connected, w.Event = ev.Connected, &w.connected
	case *agentv1.PortForwardResponse_Data:
		w.data.Data, w.Event = ev.Data, &w.data
	case *agentv1.PortForwardResponse_Eof:
		w.eof.Eof, w.Event = ev.Eof, &w.eof
	default:
		return false
	}
	return true
}

// forwardPortData forwards the caller's data to the agent in order until
// the caller closes its side, which becomes a half-close towards the
// agent; each data message goes on as it came, in gRPC's buffers. It ends
// when the handler returns (the stream's end ends Recv). A broken caller
// stream or a second start cancels the agent stream, which closes the
// connection in the sandbox.
func forwardPortData(stream berthv1.SandboxService_PortForwardServer, upstream agentv1.AgentService_PortForwardClient, protoErr *validate.ProtocolError, cancel context.CancelFunc) {
	var fr wire.Frame
	defer fr.Free()
	for {
		err := stream.RecvMsg(&fr)
		if errors.Is(err, io.EOF) {
			upstream.CloseSend()
			return
		}
		if err != nil {
			cancel()
			return
		}
		n, ok := fr.Chunk(portDataField)
		if !ok {
			// Not a plain data message: a start, or data encoded
			// another way (protobuf allows it), sent on re-encoded.
			var msg berthv1.PortForwardRequest
			if err := fr.Decode(&msg); err != nil {
				protoErr.Set(apierr.InvalidArgument("data", "is not a valid message: "+err.Error()))
				cancel()
				return
			}
			ev, ok := msg.GetEvent().(*berthv1.PortForwardRequest_Data)
			if !ok {
				protoErr.Set(apierr.InvalidArgument("data", "only data may follow the start message"))
				cancel()
				return
			}
			n, _ = fr.Fill(portDataField, len(ev.Data), func(p []byte) (int, error) { return copy(p, ev.Data), nil })
		}
		if n == 0 {
			continue
		}
		if err := upstream.SendMsg(&fr); err != nil {
			// The agent side ended; its Recv reports why.
			return
		}
	}
}
