package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// portChunkBytes is the most one PortForwardRequest carries.
const portChunkBytes = 256 << 10

// portDataField is the number of the data field of PortForwardRequest and
// PortForwardResponse.
var portDataField = wire.BytesField(&berthv1.PortForwardResponse{}, "data")

// PortConn is one TCP connection to a port inside a sandbox, carried by a
// PortForward stream on the Client's connection. Read and Write may be
// called from different goroutines; CloseWrite half-closes (the server in
// the sandbox reads end of file) and Close abandons the connection. Every
// error is an *Error (or io.EOF once the server closed its writing side).
type PortConn struct {
	stream grpc.BidiStreamingClient[berthv1.PortForwardRequest, berthv1.PortForwardResponse]
	cancel context.CancelFunc
	port   uint32

	readMu  sync.Mutex
	in      wire.Receiver // holds the last data message in gRPC's buffers
	views   [][]byte      // the last data message's bytes, one view per gRPC buffer
	pending net.Buffers   // the unread rest of views
	readErr error         // sticky: io.EOF or the stream's error

	writeMu     sync.Mutex
	writeClosed bool
}

// PortForward connects to 127.0.0.1:port inside the sandbox through its
// agent and returns once the connection is open, in any network mode. A
// port nothing listens on is an *Error with Reason ReasonPortClosed; a
// missing sandbox (or another principal's) ReasonSandboxNotFound. The
// connection lives until Close, ctx's end, or both sides closing their
// writing sides.
func (c *Client) PortForward(ctx context.Context, sandboxID string, port uint16) (*PortConn, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.sandboxes.PortForward(ctx, wire.CallOption())
	if err != nil {
		cancel()
		return nil, convertError(err)
	}
	p := &PortConn{stream: stream, cancel: cancel, port: uint32(port), in: wire.Receiver{Field: portDataField}}
	start := &berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: sandboxID, Port: uint32(port)}}}
	if err := stream.Send(start); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, convertError(err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the port-forward stream ended before connected", ErrProtocol)
		}
		return nil, convertError(err)
	}
	if first.GetConnected() == nil {
		cancel()
		return nil, fmt.Errorf("%w: the port-forward stream began without connected", ErrProtocol)
	}
	return p, nil
}

// Port returns the port in the sandbox.
func (p *PortConn) Port() uint16 { return uint16(p.port) }

// Read reads what the server in the sandbox wrote; io.EOF once it closed
// its writing side.
func (p *PortConn) Read(b []byte) (int, error) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	for len(p.pending) == 0 {
		if p.readErr != nil {
			return 0, p.readErr
		}
		p.receive()
	}
	// As much as b holds, across the message's buffers.
	n := 0
	for len(p.pending) > 0 && n < len(b) {
		k := copy(b[n:], p.pending[0])
		n += k
		if p.pending[0] = p.pending[0][k:]; len(p.pending[0]) == 0 {
			p.pending = p.pending[1:]
		}
	}
	return n, nil
}

// WriteTo writes what the server in the sandbox sends to w until it closes
// its writing side, each message as it comes, straight from gRPC's
// buffers: one writev(2) per message when w is a socket (io.Copy uses it:
// no intermediate buffer, no copy).
func (p *PortConn) WriteTo(w io.Writer) (int64, error) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	var n int64
	for {
		if len(p.pending) > 0 {
			// WriteTo consumes p.pending as it writes, partial writes
			// included.
			k, err := p.pending.WriteTo(w)
			n += k
			if err != nil {
				return n, err
			}
			continue
		}
		if p.readErr != nil {
			if p.readErr == io.EOF {
				return n, nil
			}
			return n, p.readErr
		}
		p.receive()
	}
}

// receive takes the next message into p.pending or p.readErr; the caller
// holds p.readMu. A data message's bytes stay in gRPC's buffers (no
// decoding, no copy) until the next receive.
func (p *PortConn) receive() {
	var resp berthv1.PortForwardResponse
	views, chunk, err := p.in.RecvBuffers(p.stream.RecvMsg, &resp, p.views)
	switch {
	case errors.Is(err, io.EOF):
		p.readErr = io.EOF
	case err != nil:
		p.readErr = convertError(err)
	case chunk:
		p.views = views
		p.pending = views
	default:
		switch ev := resp.GetEvent().(type) {
		case *berthv1.PortForwardResponse_Data:
			p.pending = append(p.views[:0], ev.Data)
		case *berthv1.PortForwardResponse_Eof:
			p.readErr = io.EOF
		}
	}
	if p.readErr != nil {
		p.in.Free()
	}
}

// ReadFrom sends what r reads to the server in the sandbox until r's end
// of file, in messages of up to 256 KiB, each read straight into the
// buffer gRPC sends it from (io.Copy uses it). It does not close the
// writing side.
func (p *PortConn) ReadFrom(r io.Reader) (int64, error) {
	var fr wire.Frame
	defer fr.Free()
	var n int64
	for {
		k, rerr := fr.Fill(portDataField, portChunkBytes, r.Read)
		if k > 0 {
			if err := p.send(&fr); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// Write sends b to the server in the sandbox, waiting while the stream's
// flow control holds it back. Once the stream has ended it fails with
// io.ErrClosedPipe; Read then returns the stream's error.
func (p *PortConn) Write(b []byte) (int, error) {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	if p.writeClosed {
		return 0, io.ErrClosedPipe
	}
	var fr wire.Frame
	defer fr.Free()
	n := 0
	for len(b) > 0 {
		// A copy in a pooled buffer: gRPC may hold a sent frame after
		// SendMsg returns, and the caller may reuse b.
		k, _ := fr.Fill(portDataField, min(len(b), portChunkBytes), func(q []byte) (int, error) { return copy(q, b), nil })
		if err := p.sendLocked(&fr); err != nil {
			return n, err
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

// send sends one data frame, as Write does.
func (p *PortConn) send(fr *wire.Frame) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	if p.writeClosed {
		return io.ErrClosedPipe
	}
	return p.sendLocked(fr)
}

// sendLocked sends fr (handing its buffers to gRPC); the caller holds
// p.writeMu. Once the stream has ended it fails with io.ErrClosedPipe.
func (p *PortConn) sendLocked(fr *wire.Frame) error {
	if err := p.stream.SendMsg(fr); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream ended: Read reports why.
			return io.ErrClosedPipe
		}
		return convertError(err)
	}
	return nil
}

// CloseWrite shuts down the writing side: the server in the sandbox reads
// end of file, and may still write.
func (p *PortConn) CloseWrite() error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	if p.writeClosed {
		return nil
	}
	p.writeClosed = true
	return convertError(p.stream.CloseSend())
}

// Close ends the stream; the connection in the sandbox is closed.
func (p *PortConn) Close() error {
	p.cancel()
	return nil
}
