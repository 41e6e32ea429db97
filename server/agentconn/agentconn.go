// Package agentconn keeps one gRPC connection per sandbox agent, dialed over
// the agent's unix socket on the host, and reused by every request to that
// sandbox.
package agentconn

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// Pool holds agent connections keyed by socket path. The zero value is not
// usable; call NewPool.
type Pool struct {
	mu        sync.Mutex
	conns     map[string]*conn
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

// NewPool returns an empty pool.
func NewPool(opts ...Option) *Pool {
	p := &Pool{conns: make(map[string]*conn)}
	for _, o := range opts {
		o(p)
	}
	return p
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
	cc, err := grpc.NewClient("unix://"+socketPath, append(append(wire.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Never through a symlink the sandbox put in place of its socket.
		grpc.WithContextDialer(dialer),
		// An agent comes up within a few hundred milliseconds of its task
		// starting; gRPC's default 1 s first backoff would double that.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	), p.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial agent %s: %w", socketPath, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &conn{cc: cc, stop: stop, done: make(chan struct{})}
	p.conns[socketPath] = c
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
