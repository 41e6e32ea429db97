package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/credentials/local"
	"google.golang.org/grpc/keepalive"

	"github.com/berth-sandbox/berth/internal/wire"
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
	nodes     berthv1.NodeServiceClient
	// retryPolicy is nil unless WithRetry was given.
	retryPolicy *RetryPolicy
	// fds sends ReadFile's destinations; nil unless connected over a
	// unix socket.
	fds *fdConns
}

// Option configures Dial.
type Option func(*dialConfig)

type dialConfig struct {
	keepalive keepalive.ClientParameters
	token     string      // WithToken
	tls       *tls.Config // WithTLS; nil: defaults
	insecure  bool        // WithInsecure
	extra     []grpc.DialOption
	retry     *RetryPolicy
}

// WithKeepalive replaces the client's keepalive parameters. The default pings
// after 30 s without traffic, also while no RPC is open, and drops the
// connection when a ping is not answered within 10 s.
func WithKeepalive(p keepalive.ClientParameters) Option {
	return func(c *dialConfig) { c.keepalive = p }
}

// WithToken sends token with every request as a bearer token
// ("authorization: Bearer <token>" metadata); berthd maps it to a principal
// through its token file, and it decides over the connection's identity.
// The token travels only over a unix socket or TLS; with WithInsecure also
// over plaintext TCP.
func WithToken(token string) Option {
	return func(c *dialConfig) { c.token = token }
}

// WithTLS sets the TLS configuration for TCP targets, which use TLS unless
// WithInsecure: RootCAs to trust berthd's certificate (nil: the system's
// roots), Certificates for a client certificate (mTLS: its common name is
// the principal), ServerName when the address is not a name in berthd's
// certificate. Unix sockets ignore it.
func WithTLS(cfg *tls.Config) Option {
	return func(c *dialConfig) { c.tls = cfg.Clone() }
}

// TLSConfigFromFiles returns a TLS configuration for WithTLS from PEM
// files: caFile holds the CAs to trust berthd's certificate with ("": the
// system's roots); certFile and keyFile a client certificate and its key
// ("": none). It fails naming the file that does not load.
func TLSConfigFromFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a TLS client certificate needs both its certificate and its key file")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// WithInsecure dials TCP targets without TLS, for a berthd started with
// --insecure-tcp: everything, a token included, crosses the network in
// plaintext.
func WithInsecure() Option {
	return func(c *dialConfig) { c.insecure = true }
}

// WithDialOptions appends gRPC dial options after the client's own, so they
// take precedence: custom dialers (tests use bufconn), interceptors,
// credentials. File transfers hand their data chunks to gRPC already
// encoded: a stream interceptor sees those messages as an internal type,
// not as proto messages.
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
// or any other gRPC target ("dns:///host:port", "passthrough:///name").
// A unix socket needs no credentials: berthd knows the caller's uid. Any
// other target uses TLS (WithTLS; the system's roots by
// default) unless WithInsecure. WithToken adds a bearer token.
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
	var creds credentials.TransportCredentials
	var fds *fdConns
	switch {
	case strings.HasPrefix(t, "unix:"):
		// Local credentials: a unix socket counts as private, so a
		// token may go over it. Its connections also carry ReadFile's
		// destinations (fdCreds).
		fds = &fdConns{}
		creds = fdCreds{TransportCredentials: local.NewCredentials(), conns: fds}
	case cfg.insecure:
		creds = insecure.NewCredentials()
	default:
		tc := cfg.tls
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(tc)
	}
	dialOpts := append(wire.DialOptions(), grpc.WithTransportCredentials(creds), grpc.WithKeepaliveParams(cfg.keepalive))
	if cfg.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearerToken{token: cfg.token, secure: !cfg.insecure}))
	}
	dialOpts = append(dialOpts, cfg.extra...)
	conn, err := grpc.NewClient(t, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	conn.Connect()
	return &Client{
		conn:        conn,
		sandboxes:   berthv1.NewSandboxServiceClient(conn),
		images:      berthv1.NewImageServiceClient(conn),
		nodes:       berthv1.NewNodeServiceClient(conn),
		retryPolicy: cfg.retry,
		fds:         fds,
	}, nil
}

// bearerToken is the per-request credential of WithToken.
type bearerToken struct {
	token  string
	secure bool // refuse transports without privacy
}

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearerToken) RequireTransportSecurity() bool { return b.secure }

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
