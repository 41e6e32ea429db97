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
	verifier Verifier
	refused  refusals

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPool returns an empty pool whose connections are checked with v: the
// listener's credentials when connecting, the agent's proof of its secret
// in every Info call. A nil v checks nothing.
func NewPool(v Verifier) *Pool {
	return &Pool{verifier: v, refused: refusals{last: make(map[string]error)}, conns: make(map[string]*grpc.ClientConn)}
}

// Get returns a client for the agent listening on socketPath, creating the
// connection on first use. Connecting is lazy: a dead agent shows up as an
// UNAVAILABLE error from the first RPC, not here.
func (p *Pool) Get(socketPath string) (agentv1.AgentServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc, ok := p.conns[socketPath]; ok {
		return agentv1.NewAgentServiceClient(cc), nil
	}
	cc, err := grpc.NewClient("unix://"+socketPath, append(wire.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Never through a symlink the sandbox put in place of its socket,
		// and only to the sandbox's agent.
		grpc.WithContextDialer(p.dial),
		grpc.WithUnaryInterceptor(p.proveInfo(socketPath)),
		// An agent comes up within a few hundred milliseconds of its task
		// starting; gRPC's default 1 s first backoff would double that.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("dial agent %s: %w", socketPath, err)
	}
	p.conns[socketPath] = cc
	return agentv1.NewAgentServiceClient(cc), nil
}

// Forget closes and drops the connection to socketPath, if any.
func (p *Pool) Forget(socketPath string) {
	p.mu.Lock()
	cc, ok := p.conns[socketPath]
	delete(p.conns, socketPath)
	p.mu.Unlock()
	if ok {
		cc.Close()
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	conns := p.conns
	p.conns = make(map[string]*grpc.ClientConn)
	p.mu.Unlock()
	for _, cc := range conns {
		cc.Close()
	}
}

// WaitReady calls Info on the agent until it answers or ctx ends, and
// returns the agent's answer.
func WaitReady(ctx context.Context, agent agentv1.AgentServiceClient) (*agentv1.InfoResponse, error) {
	return agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
}
