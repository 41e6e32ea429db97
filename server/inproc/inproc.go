// Package inproc makes gRPC client connections to berthd's own gRPC
// server in process, for the HTTP endpoints berthd serves itself
// (server/wsgate's WebSockets, server/restgate's raw bodies and JSON
// lines): their calls pass the same interceptors as every other call —
// authentication, ownership, routing, limits and the error boundary.
package inproc

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

// Conn is a gRPC client connection to berthd's own gRPC server, made for
// one HTTP request: HTTP/2 over an in-memory pipe, served by
// srv.ServeHTTP (the path Connect and gRPC-Web calls take).
type Conn struct {
	// ClientConn carries the calls.
	*grpc.ClientConn

	mu     sync.Mutex
	dialed bool
	closed bool
	server net.Conn
	done   chan struct{} // closed when the server side returns
}

// Dial returns a connection to srv; Close ends it. The server side starts
// with the first call (grpc-go dials lazily), so a request that fails
// before it calls costs nothing. errLog receives the HTTP/2 server's
// errors.
//
// base is the context of the HTTP request: it carries the identity of the
// connection it arrived on (auth.HTTPConnContext: a unix peer's uid, a
// client certificate), which authentication reads when the call has no
// bearer token. remote and local name that connection in the calls' peer
// information (RemoteAddr and LocalAddr give them for an http.Request).
func Dial(base context.Context, srv http.Handler, remote, local net.Addr, errLog *log.Logger) (*Conn, error) {
	ip := &Conn{done: make(chan struct{})}
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
	ip.ClientConn = conn
	return ip, nil
}

// Close ends the connection and waits for its server side.
func (ip *Conn) Close() {
	ip.ClientConn.Close()
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
// the HTTP request arrived on.
type addrConn struct {
	net.Conn
	remote, local net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
func (c addrConn) LocalAddr() net.Addr  { return c.local }

// stringAddr is an address known by its text only (http.Request's
// RemoteAddr).
type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }

// RemoteAddr is the address r came from, as net/http records it.
func RemoteAddr(r *http.Request) net.Addr { return stringAddr(r.RemoteAddr) }

// LocalAddr is the address r arrived on, as net/http records it.
func LocalAddr(r *http.Request) net.Addr {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a != nil {
		return a
	}
	return stringAddr("")
}
