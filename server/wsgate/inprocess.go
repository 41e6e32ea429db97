package wsgate

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"sync"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// inProcess is a gRPC client connection to berthd's own gRPC server,
// made for one WebSocket session: HTTP/2 over an in-memory pipe, served
// by srv.ServeHTTP (the path Connect and gRPC-Web calls take), so that a
// WebSocket's calls pass the same interceptors as every other call —
// authentication, ownership, routing, limits and the error boundary.
//
// base is the context of the WebSocket's HTTP request: it carries the
// identity of the connection it arrived on (auth.HTTPConnContext: a unix
// peer's uid, a client certificate), which authentication reads when the
// call has no bearer token. remote and local name that connection in the
// calls' peer information.
type inProcess struct {
	conn *grpc.ClientConn

	mu     sync.Mutex
	dialed bool
	closed bool
	server net.Conn
	done   chan struct{} // closed when the server side returns
}

// dialInProcess returns the connection to srv; Close ends it. The server
// side starts with the first call (grpc-go dials lazily), so a session
// that fails before it calls costs nothing. errLog receives the HTTP/2
// server's errors.
func dialInProcess(base context.Context, srv http.Handler, remote, local net.Addr, errLog *log.Logger) (*inProcess, error) {
	ip := &inProcess{done: make(chan struct{})}
	dial := func(context.Context, string) (net.Conn, error) {
		ip.mu.Lock()
		defer ip.mu.Unlock()
		if ip.dialed || ip.closed {
			// The pipe's one connection ended: gRPC's reconnection
			// has nothing to reach.
			return nil, errors.New("the in-process connection to berthd is closed")
		}
		ip.dialed = true
		cend, send := net.Pipe()
		ip.server = send
		go func() {
			defer close(ip.done)
			(&http2.Server{}).ServeConn(addrConn{send, remote, local}, &http2.ServeConnOpts{
				Context:    context.WithoutCancel(base),
				Handler:    srv,
				BaseConfig: &http.Server{ErrorLog: errLog},
			})
		}()
		return cend, nil
	}
	conn, err := grpc.NewClient("passthrough:///berthd",
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// berthd's own limits apply on the server side; the client
		// takes what the server sends.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	ip.conn = conn
	return ip, nil
}

// Close ends the connection and waits for its server side.
func (ip *inProcess) Close() {
	ip.conn.Close()
	ip.mu.Lock()
	ip.closed = true
	dialed := ip.dialed
	if dialed {
		ip.server.Close()
	}
	ip.mu.Unlock()
	if dialed {
		<-ip.done
	}
}

// addrConn is a net.Conn that reports the addresses of the connection
// the WebSocket arrived on.
type addrConn struct {
	net.Conn
	remote, local net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
func (c addrConn) LocalAddr() net.Addr  { return c.local }
