// Package agentconn keeps one gRPC connection per sandbox agent, dialed over
// the agent's unix socket on the host, and reused by every request to that
// sandbox.
package agentconn

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
)

// MaxRecvBytes is the largest message berthd accepts from an agent, in
// bytes: output events are at most 256 KiB, file chunks and Telemetry
// span batches 1 MiB, ListExecs answers at most 3 MiB.
const MaxRecvBytes = 4 << 20

// Pool holds agent connections keyed by socket path. The zero value is not
// usable; call NewPool.
type Pool struct {
	verifier Verifier
	refused  refusals

	mu    sync.Mutex
	conns map[string]*conn
	// received counts, per socket path, the messages, headers and
	// trailers received from the agent on its connection.
	received map[string]*atomic.Uint64
	// sockets holds, per socket path, the last connection dialed.
	sockets map[string]net.Conn
	// proven holds, per socket path, the last Info answer that proved the
	// agent on a connection (Proven).
	proven map[string]proof
	dials  map[string]uint64 // per socket path, the connections dialed
	// dialErrs holds, per socket path, the last failure to connect since
	// the last connection made: gRPC reports a failing dial only as
	// UNAVAILABLE, without its cause.
	dialErrs  map[string]error
	dialOpts  []grpc.DialOption
	onConnect func(ctx context.Context, socketPath string, agent agentv1.AgentServiceClient)
}

// conn is one agent connection and the onConnect goroutine that uses it.
type conn struct {
	cc   *grpc.ClientConn
	stop context.CancelFunc
	done chan struct{}
}

func (c *conn) close() {
	c.stop()
	<-c.done
	c.cc.Close()
}

// Option configures NewPool.
type Option func(*Pool)

// WithDialOptions adds options to every agent connection (tracing's stats
// handler).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(p *Pool) { p.dialOpts = append(p.dialOpts, opts...) }
}

// WithOnConnect runs f in a goroutine for each new connection, with a
// context that ends when the connection is forgotten or the pool closed
// (which wait for f to return): for a stream that lives as long as the
// agent, like the Telemetry relay.
func WithOnConnect(f func(ctx context.Context, socketPath string, agent agentv1.AgentServiceClient)) Option {
	return func(p *Pool) { p.onConnect = f }
}

// NewPool returns an empty pool whose connections are checked with v: the
// listener's credentials when connecting, the agent's proof of its secret
// in every Info call. A nil v checks nothing.
func NewPool(v Verifier, opts ...Option) *Pool {
	p := &Pool{verifier: v, refused: refusals{last: make(map[string]error)},
		conns: make(map[string]*conn), dialErrs: make(map[string]error), received: make(map[string]*atomic.Uint64),
		sockets: make(map[string]net.Conn), proven: make(map[string]proof), dials: make(map[string]uint64)}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Unread returns how many bytes berthd has written to the agent at
// socketPath that the agent has not read yet (SIOCOUTQ on berthd's end of
// the unix socket, unix(7)), and false when there is no connection.
func (p *Pool) Unread(socketPath string) (int, bool) {
	p.mu.Lock()
	conn, ok := p.sockets[socketPath].(syscall.Conn)
	p.mu.Unlock()
	if !ok {
		return 0, false
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) { n, ioctlErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ioctlErr != nil {
		return 0, false
	}
	return n, true
}

// Received returns how many messages, headers and trailers the agent at
// socketPath has sent berthd on its connection, on every stream: a number
// that grows while the agent works, whatever it works on.
func (p *Pool) Received(socketPath string) uint64 {
	p.mu.Lock()
	n := p.received[socketPath]
	p.mu.Unlock()
	if n == nil {
		return 0
	}
	return n.Load()
}

// counter is a gRPC stats handler that counts what arrives from the peer.
type counter struct{ n *atomic.Uint64 }

func (c counter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c counter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c counter) HandleConn(context.Context, stats.ConnStats)                       {}
func (c counter) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InPayload, *stats.InHeader, *stats.InTrailer:
		c.n.Add(1)
	}
}

// DialError returns why the last attempt to connect to the agent at
// socketPath failed, or nil when the last attempt connected (or none was
// made).
func (p *Pool) DialError(socketPath string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dialErrs[socketPath]
}

// dial connects to socketPath for gRPC, checks the listener with the
// Verifier, and records the outcome.
func (p *Pool) dial(ctx context.Context, socketPath string) (net.Conn, error) {
	conn, err := dialSocket(ctx, socketPath)
	if err == nil {
		if err = p.verifyPeer(ctx, socketPath, conn); err != nil {
			conn.Close()
			conn = nil
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.dialErrs[socketPath] = err
		return nil, err
	}
	delete(p.dialErrs, socketPath)
	live := newLiveConn(conn)
	p.sockets[socketPath] = live
	p.dials[socketPath]++
	return live, nil
}

// Get returns a client for the agent listening on socketPath, creating the
// connection on first use. Connecting is lazy: a dead agent shows up as an
// UNAVAILABLE error from the first RPC, not here.
func (p *Pool) Get(socketPath string) (agentv1.AgentServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[socketPath]; ok {
		return agentv1.NewAgentServiceClient(c.cc), nil
	}
	received := new(atomic.Uint64)
	cc, err := grpc.NewClient("unix://"+socketPath, append(append(wire.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Never through a symlink the sandbox put in place of its socket,
		// and only to the sandbox's agent.
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return p.dial(ctx, socketPath) }),
		grpc.WithChainUnaryInterceptor(p.proveInfo(socketPath), tooOldUnary),
		// An older agent answers a newer method UNIMPLEMENTED: every
		// call says so as AGENT_TOO_OLD (tooOld).
		grpc.WithChainStreamInterceptor(tooOldStream),
		// An agent comes up within a few hundred milliseconds of its task
		// starting; gRPC's default 1 s first backoff would double that.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
		// The workload can reach the agent's socket: what comes from it
		// is untrusted. No message from it may exceed MaxRecvBytes, and
		// the fixed flow-control windows (package wire) bound what berthd
		// buffers per stream while its caller reads slowly: gRPC's flow
		// control then holds the agent, and the agent holds the process.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRecvBytes)),
		grpc.WithStatsHandler(counter{received}),
	), p.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial agent %s: %w", socketPath, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &conn{cc: cc, stop: stop, done: make(chan struct{})}
	p.conns[socketPath] = c
	p.received[socketPath] = received
	client := agentv1.NewAgentServiceClient(cc)
	if p.onConnect != nil {
		go func() { defer close(c.done); p.onConnect(ctx, socketPath, client) }()
	} else {
		close(c.done)
	}
	return client, nil
}

// Forget closes and drops the connection to socketPath, if any.
func (p *Pool) Forget(socketPath string) {
	p.mu.Lock()
	c, ok := p.conns[socketPath]
	delete(p.conns, socketPath)
	delete(p.dialErrs, socketPath)
	delete(p.received, socketPath)
	delete(p.sockets, socketPath)
	delete(p.proven, socketPath)
	delete(p.dials, socketPath)
	p.mu.Unlock()
	if ok {
		c.close()
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	conns := p.conns
	p.conns = make(map[string]*conn)
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// WaitReady calls Info on the agent until it answers or ctx ends, and
// returns the agent's answer.
func WaitReady(ctx context.Context, agent agentv1.AgentServiceClient) (*agentv1.InfoResponse, error) {
	return agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
}
