package wsgate

import (
	"context"
	"errors"
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
	conn   *grpc.ClientConn
	server net.Conn
	done   chan struct{}
}

// dialInProcess returns the connection to srv; Close ends it.
func dialInProcess(base context.Context, srv http.Handler, remote, local net.Addr) (*inProcess, error) {
	cend, send := net.Pipe()
	ip := &inProcess{server: send, done: make(chan struct{})}
	go func() {
		defer close(ip.done)
		(&http2.Server{}).ServeConn(addrConn{send, remote, local}, &http2.ServeConnOpts{
			Context: context.WithoutCancel(base),
			Handler: srv,
		})
	}()
	var once sync.Once
	dial := func(context.Context, string) (net.Conn, error) {
		var c net.Conn
		once.Do(func() { c = cend })
		if c == nil {
			// The pipe's one connection ended: gRPC's reconnection
			// has nothing to reach.
			return nil, errors.New("the in-process connection to berthd is closed")
		}
		return c, nil
	}
	conn, err := grpc.NewClient("passthrough:///berthd",
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// berthd's own limits apply on the server side; the client
		// takes what the server sends.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		cend.Close()
		send.Close()
		<-ip.done
		return nil, err
	}
	ip.conn = conn
	return ip, nil
}

// Close ends the connection and waits for its server side.
func (ip *inProcess) Close() {
	ip.conn.Close()
	ip.server.Close()
	<-ip.done
}

// addrConn is a net.Conn that reports the addresses of the connection
// the WebSocket arrived on.
type addrConn struct {
	net.Conn
	remote, local net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
func (c addrConn) LocalAddr() net.Addr  { return c.local }
