package client

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// Ports forwards ports of one sandbox (Sandbox.Ports): the Python SDK's
// sb.ports.
type Ports struct {
	c  *Client
	id string
}

// Forward listens on 127.0.0.1:0 and relays each connection it accepts
// to 127.0.0.1:port inside the sandbox through its own PortForward stream,
// until Close or ctx's end. A port nothing listens on in the sandbox
// closes the local connection; LastError then holds the *Error
// (ReasonPortClosed).
func (p *Ports) Forward(ctx context.Context, port uint16) (*PortForwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	fw := &PortForwarder{Address: ln.Addr().String(), ln: ln, cancel: cancel}
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	go fw.serve(ctx, p, port)
	return fw, nil
}

// PortForwarder is a local listener forwarding to a sandbox's port.
type PortForwarder struct {
	// Address is the local "127.0.0.1:PORT" to connect to.
	Address string
	ln      net.Listener
	cancel  context.CancelFunc
	mu      sync.Mutex
	lastErr error
}

func (fw *PortForwarder) serve(ctx context.Context, p *Ports, port uint16) {
	for {
		conn, err := fw.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			remote, err := p.c.PortForward(ctx, p.id, port)
			if err != nil {
				fw.mu.Lock()
				fw.lastErr = err
				fw.mu.Unlock()
				return
			}
			defer remote.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(conn, remote)
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				close(done)
			}()
			_, _ = io.Copy(remote, conn)
			_ = remote.CloseWrite()
			<-done
		}()
	}
}

// LastError is the last connection's failure to reach the port (nil
// when none failed).
func (fw *PortForwarder) LastError() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.lastErr
}

// Close stops listening and ends the connections it relays.
func (fw *PortForwarder) Close() error {
	fw.cancel()
	if err := fw.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
