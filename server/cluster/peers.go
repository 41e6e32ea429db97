package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/wire"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// PeerCredentials is how a berthd authenticates to the other nodes: as a
// node principal (berthd --node-principal on the receiving node) by a
// client certificate in TLS (TLS.Certificates) or a bearer token, or both.
type PeerCredentials struct {
	// TLS are the transport credentials (credentials.NewTLS, or ones that
	// change what later handshakes use: berthd re-reads its files at
	// SIGHUP) that verify the nodes' server certificates and may carry
	// this node's client certificate; nil dials in plaintext (nodes
	// serving --insecure-tcp only).
	TLS credentials.TransportCredentials
	// Token returns the bearer token this node sends, asked at each call;
	// nil for none.
	Token func() string
}

// Peers holds one gRPC connection per node address, made on first use.
// Its methods are safe for concurrent use.
type Peers struct {
	creds PeerCredentials
	// budget bounds how long a call waits for a connection to a node
	// before the node counts as unreachable.
	budget time.Duration

	mu    sync.Mutex
	conns map[string]peerConn // by node id
}

// peerConn is a connection to a node at an address. A node that registered
// again at the same address (after a restart, or after etcd was away)
// keeps it, so that the calls and streams on it go on; the backoff that
// the failures of a restart built up is reset for the new registration.
// A node at a new address gets a new connection.
type peerConn struct {
	conn    *grpc.ClientConn
	address string
	lease   LeaseID // of the registration last seen
}

// NewPeers returns Peers that dial with creds and wait at most
// connectBudget (default 3 s) for a node to accept a connection.
func NewPeers(creds PeerCredentials, connectBudget time.Duration) *Peers {
	if connectBudget <= 0 {
		connectBudget = 3 * time.Second
	}
	return &Peers{creds: creds, budget: connectBudget, conns: make(map[string]peerConn)}
}

// Close closes every connection.
func (p *Peers) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range p.conns {
		c.conn.Close()
		delete(p.conns, id)
	}
}

// ready returns the connection to node once it is ready, waiting at most
// the connect budget (and ctx) while it connects; false when the node did
// not accept a connection within it or refused the last attempt, so that
// nothing was sent. A refused connection tries again at the next call
// rather than after gRPC's backoff.
func (p *Peers) ready(ctx context.Context, node NodeRecord) (*grpc.ClientConn, bool, error) {
	c, renewed, err := p.connOf(node)
	if err != nil {
		return nil, false, err
	}
	if renewed {
		// A new registration: try it at once, whatever the old one's
		// failures built up.
		c.ResetConnectBackoff()
	}
	if c.GetState() == connectivity.Ready {
		return c, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.budget)
	defer cancel()
	if c.GetState() == connectivity.TransientFailure && !renewed {
		c.ResetConnectBackoff()
		return c, false, nil
	}
	c.Connect()
	tried := false
	for {
		s := c.GetState()
		switch s {
		case connectivity.Ready:
			return c, true, nil
		case connectivity.Shutdown:
			return c, false, nil
		case connectivity.Idle:
			c.Connect()
		case connectivity.Connecting:
			tried = true
		case connectivity.TransientFailure:
			if tried {
				return c, false, nil
			}
		}
		if !c.WaitForStateChange(ctx, s) {
			return c, false, nil
		}
	}
}

// connOf returns the connection to node, and whether node registered again
// since the connection's last use (a new lease at the same address).
func (p *Peers) connOf(node NodeRecord) (*grpc.ClientConn, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[node.ID]; ok {
		if c.address == node.Address {
			renewed := c.lease != node.Lease
			c.lease = node.Lease
			p.conns[node.ID] = c
			return c.conn, renewed, nil
		}
		c.conn.Close()
		delete(p.conns, node.ID)
	}
	addr := node.Address
	tc := insecure.NewCredentials()
	if p.creds.TLS != nil {
		tc = p.creds.TLS
	}
	opts := append(wire.DialOptions(),
		grpc.WithTransportCredentials(tc),
		// As the Go client: pings find a dead node under a silent exec.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Retries would resend what may have run; routing decides itself.
		grpc.WithDisableRetry(),
	)
	if p.creds.Token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: p.creds.Token, secure: p.creds.TLS != nil}))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("cluster: connection to node at %s: %w", addr, err)
	}
	p.conns[node.ID] = peerConn{conn: c, address: addr, lease: node.Lease}
	return c, false, nil
}

// forwarded returns the outgoing context of a call made for principal p
// (auth.Principal.ForwardingMD).
func forwarded(ctx context.Context, p auth.Principal) context.Context {
	md := p.ForwardingMD()
	// The caller's choice about a paused sandbox goes with its call.
	if kv := resume.Forward(ctx); kv != nil {
		md = metadata.Join(md, metadata.Pairs(kv...))
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// bearer sends a node's bearer token, as token returns it at each call.
type bearer struct {
	token  func() string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token()}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }
