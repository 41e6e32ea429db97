package client

import (
	"context"
	"errors"
	"fmt"
	"github.com/berth-sandbox/berth/internal/wire"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// defaultKeepalive is the client's default gRPC keepalive: a ping after 30 s
// without traffic, the connection dropped when the ping is not answered within
// 10 s, pings also while no RPC is open. berthd must permit it (its
// keepalive.EnforcementPolicy needs MinTime <= 30 s and PermitWithoutStream),
// or it closes the connection with ENHANCE_YOUR_CALM ("too_many_pings").
var defaultKeepalive = keepalive.ClientParameters{
	Time:                30 * time.Second,
	Timeout:             10 * time.Second,
	PermitWithoutStream: true,
}

// Client talks to one berthd. It is safe for concurrent use by multiple
// goroutines. Close it when done.
type Client struct {
	conn      *grpc.ClientConn
	sandboxes berthv1.SandboxServiceClient
	images    berthv1.ImageServiceClient
	// retryPolicy is nil unless WithRetry was given.
	retryPolicy *RetryPolicy
}

// Option configures Dial.
type Option func(*dialConfig)

type dialConfig struct {
	keepalive keepalive.ClientParameters
	// The transport is insecure for now; TLS and bearer tokens arrive as
	// further Options (WithTLS, WithToken) that set credentials here.
	extra []grpc.DialOption
	retry *RetryPolicy
}

// WithKeepalive replaces the client's keepalive parameters. The default pings
// after 30 s without traffic, also while no RPC is open, and drops the
// connection when a ping is not answered within 10 s.
func WithKeepalive(p keepalive.ClientParameters) Option {
	return func(c *dialConfig) { c.keepalive = p }
}

// WithDialOptions appends gRPC dial options after the client's own, so they
// take precedence: custom dialers (tests use bufconn), interceptors,
// credentials.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *dialConfig) { c.extra = append(c.extra, opts...) }
}

// Dial returns a Client for the berthd at target, which is one of
//
//	unix:///run/berth/berthd.sock   a unix socket, absolute path
//	unix:/run/berth/berthd.sock     the same
//	/run/berth/berthd.sock          the same (a bare absolute path)
//	host:port                       TCP, host resolved through DNS
//
// or any other gRPC target ("dns:///host:port", "passthrough:///name"). The
// transport is not encrypted yet.
//
// Dial does no I/O and does not wait for berthd: the connection is made in
// the background, and RPCs fail with codes.Unavailable while berthd cannot
// be reached. ctx is only checked for cancellation.
func Dial(ctx context.Context, target string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t, err := grpcTarget(target)
	if err != nil {
		return nil, err
	}
	cfg := dialConfig{keepalive: defaultKeepalive}
	for _, o := range opts {
		o(&cfg)
	}
	dialOpts := append(append(wire.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(cfg.keepalive),
	), cfg.extra...)
	conn, err := grpc.NewClient(t, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	conn.Connect()
	return &Client{
		conn:        conn,
		sandboxes:   berthv1.NewSandboxServiceClient(conn),
		images:      berthv1.NewImageServiceClient(conn),
		retryPolicy: cfg.retry,
	}, nil
}

// grpcTarget turns a Dial target into a gRPC target name.
func grpcTarget(target string) (string, error) {
	switch {
	case target == "":
		return "", errors.New("empty berthd address")
	case strings.HasPrefix(target, "unix:"):
		if strings.TrimPrefix(strings.TrimPrefix(target, "unix:"), "//") == "" {
			return "", fmt.Errorf("berthd address %q: no socket path", target)
		}
		return target, nil
	case strings.HasPrefix(target, "/"):
		return "unix://" + target, nil
	default:
		return target, nil
	}
}

// Close closes the connection. RPCs in flight, including Exec streams, fail
// with codes.Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}
