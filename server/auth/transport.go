package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berth-sandbox/berth/internal/fdpass"
)

// PeerCred is the AuthInfo of a connection on a unix socket: the
// credentials of the process that connected, as the kernel recorded them at
// connect(2) (SO_PEERCRED, unix(7)). A process cannot forge them, and
// changing its uid after connecting does not change them.
type PeerCred struct {
	credentials.CommonAuthInfo
	PID      int32
	UID, GID uint32
	// Received holds the descriptors the caller sent on the connection
	// (SCM_RIGHTS, internal/fdpass), for ReadFile's destination; nil on a
	// connection that carries none (a call through net/http).
	Received *fdpass.Queue
}

// Descriptors returns the descriptors the connection received, nil when
// it carries none.
func (p PeerCred) Descriptors() *fdpass.Queue { return p.Received }

// AuthType implements credentials.AuthInfo.
func (PeerCred) AuthType() string { return "unix-peercred" }

// errPlaintextTCP refuses a TCP connection when berthd has no TLS and was
// not told to serve plaintext.
var errPlaintextTCP = errors.New("plaintext TCP refused: berthd serves TCP only with TLS (or --insecure-tcp)")

// transport is berthd's server-side transport credentials: a connection on
// a unix socket yields its PeerCred with no handshake on the wire; a TCP
// connection gets a TLS handshake, or with insecureTCP and no TLS
// configured, none.
type transport struct {
	tls         credentials.TransportCredentials // nil without TLS
	insecureTCP bool
}

// TLSConn is a connection whose TLS handshake the server already made
// (server.Serve, which sorts a TLS listener's connections by their first
// request): the transport credentials take its state as it is.
type TLSConn interface {
	TLSConnectionState() (tls.ConnectionState, bool)
}

// tlsInfo is the AuthInfo of a connection that conn's TLSConn says is
// TLS, and false for any other.
func tlsInfo(conn net.Conn) (credentials.AuthInfo, bool) {
	tc, ok := conn.(TLSConn)
	if !ok {
		return nil, false
	}
	cs, ok := tc.TLSConnectionState()
	if !ok {
		return nil, false
	}
	return credentials.TLSInfo{State: cs, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, true
}

func (t *transport) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if info, ok := tlsInfo(conn); ok {
		return conn, info, nil
	}
	if conn.LocalAddr().Network() == "unix" {
		cred, err := peerCred(conn)
		if err != nil {
			return nil, nil, err
		}
		if h, ok := conn.(fdpass.Holder); ok {
			cred.Received = h.Descriptors()
		}
		return conn, cred, nil
	}
	switch {
	case t.tls != nil:
		return t.tls.ServerHandshake(conn)
	case t.insecureTCP:
		return insecure.NewCredentials().ServerHandshake(conn)
	}
	return nil, nil, errPlaintextTCP
}

// peerCred reads the SO_PEERCRED of a unix socket connection.
func peerCred(conn net.Conn) (PeerCred, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return PeerCred{}, fmt.Errorf("unix socket connection %T exposes no file descriptor for SO_PEERCRED", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return PeerCred{}, fmt.Errorf("unix socket peer credentials: %w", err)
	}
	var (
		ucred *unix.Ucred
		uerr  error
	)
	if err := raw.Control(func(fd uintptr) { ucred, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return PeerCred{}, fmt.Errorf("unix socket peer credentials: %w", err)
	}
	if uerr != nil {
		return PeerCred{}, fmt.Errorf("unix socket peer credentials (SO_PEERCRED): %w", uerr)
	}
	return PeerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		PID: ucred.Pid, UID: ucred.Uid, GID: ucred.Gid}, nil
}

func (t *transport) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("berthd's transport credentials are for serving only")
}

func (t *transport) Info() credentials.ProtocolInfo {
	if t.tls != nil {
		return t.tls.Info()
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (t *transport) Clone() credentials.TransportCredentials {
	c := *t
	if t.tls != nil {
		c.tls = t.tls.Clone()
	}
	return &c
}

// OverrideServerName is deprecated in grpc-go and unused by servers.
func (t *transport) OverrideServerName(string) error { return nil }

// serverTLS returns the TLS credentials that serve the certificate and the
// client CAs current holds at each handshake, so that Reload swaps them for
// new connections.
func serverTLS(current func() *tls.Config) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return current(), nil
		},
	})
}

// connInfoKey keys the AuthInfo of the connection of a call that arrived
// through net/http (Connect, gRPC-Web, HTTP/1.1): grpc-go's ServeHTTP
// transport builds the call's peer from the request alone, with TLS
// information at most, so a unix socket caller's SO_PEERCRED travels in
// the context instead (HTTPConnContext) and identify reads it there.
type connInfoKey struct{}

// HTTPConnContext returns ctx carrying the identity of conn, a connection
// that net/http serves (http.Server.ConnContext): on a unix socket its
// SO_PEERCRED, so that calls on it authenticate as they do over gRPC (the
// uid's principal); on a TLSConn its TLS state (a client certificate's
// principal); on plaintext TCP nothing (the caller gives a bearer token). conn may wrap the socket: its SyscallConn reaches the socket's
// descriptor. A unix connection whose credentials cannot be read is
// served without them (its calls need a bearer token), and that is
// logged by the caller through the returned error.
func HTTPConnContext(ctx context.Context, conn net.Conn) (context.Context, error) {
	if info, ok := tlsInfo(conn); ok {
		return context.WithValue(ctx, connInfoKey{}, info), nil
	}
	if conn.LocalAddr().Network() != "unix" {
		return ctx, nil
	}
	cred, err := peerCred(conn)
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, connInfoKey{}, credentials.AuthInfo(cred)), nil
}

// connAuthInfo returns the AuthInfo HTTPConnContext put in ctx, if any.
func connAuthInfo(ctx context.Context) (credentials.AuthInfo, bool) {
	info, ok := ctx.Value(connInfoKey{}).(credentials.AuthInfo)
	return info, ok
}
