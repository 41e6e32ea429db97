package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/berth-sandbox/berth/internal/fdpass"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/connlimit"
	"github.com/berth-sandbox/berth/server/rawcap"
	"github.com/berth-sandbox/berth/server/status"
)

// GRPCOption configures NewGRPCServer.
type GRPCOption func(*grpcConfig)

type grpcConfig struct {
	auth      *auth.Authenticator
	router    *cluster.Router
	nodes     berthv1.NodeServiceServer
	extra     []grpc.ServerOption
	transport TransportConfig
}

// TransportConfig bounds what a caller can make berthd hold on its HTTP/2
// transport before it is authenticated (issue 21: one caller's 8 MB
// metadata values took berthd to 1.37 GB; half-open connections were held
// forever), and on the HTTP streams berthd serves itself after (a client
// that never read a raw download held its call and ~5 MiB forever). Zero
// fields take the defaults named.
type TransportConfig struct {
	// MaxHeaderListBytes is the largest header list (metadata, uncompressed,
	// as HTTP/2 counts it: name + value + 32 a field) of a request.
	// berthd announces it in its SETTINGS; a caller that sends more gets
	// its stream reset or, for a header block far past it, its connection
	// closed, without berthd buffering it. Default 16 KiB: twice the 8 KiB
	// that gRPC's C core and Java (and grpc-go from v1.82 on) accept by
	// default, so that no caller working against them is refused, and a
	// thousandth of grpc-go's old 16 MiB.
	MaxHeaderListBytes uint32
	// MaxConcurrentStreams is the most streams (calls) one connection has
	// open at once; a gRPC client queues its calls past it. Default 1024.
	MaxConcurrentStreams uint32
	// HandshakeTimeout bounds a new connection's TLS handshake and its
	// HTTP/2 preface and first SETTINGS (grpc.ConnectionTimeout). Default
	// 10 s.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes, with a GOAWAY and 5 s of grace, a
	// connection that has had no call open for this long
	// (keepalive.MaxConnectionIdle); that includes one that sent half a
	// request's headers and no more. gRPC clients reconnect when they next
	// call. Default 2 min.
	MaxConnectionIdle time.Duration
	// MaxRawStreamsPerPrincipal is the most raw HTTP file streams (GET and
	// PUT of .../files/content and .../files/archive, server/restgate)
	// one principal has open at once; one more is refused with
	// RESOURCE_EXHAUSTED FLEET_BUSY, resource
	// CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS (server/rawcap). Default 16.
	MaxRawStreamsPerPrincipal int
	// StreamStall is the longest an HTTP stream berthd serves itself
	// (server/restgate's raw bodies and JSON lines, server/wsgate's
	// WebSockets) waits on its client: for a response write to be taken
	// (restgate writes at most 32 KiB at a time, so a client is cut only
	// when it reads less than that in StreamStall) or for the next bytes
	// of a request body. Past it the call ends and the connection is
	// closed. Default 1 min.
	StreamStall time.Duration
}

// Default TransportConfig values.
const (
	DefaultMaxHeaderListBytes   = 16 << 10
	DefaultMaxConcurrentStreams = 1024
	DefaultHandshakeTimeout     = 10 * time.Second
	DefaultMaxConnectionIdle    = 2 * time.Minute
	DefaultMaxRawStreams        = 16
	DefaultStreamStall          = time.Minute
)

func (c TransportConfig) withDefaults() TransportConfig {
	if c.MaxHeaderListBytes == 0 {
		c.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxConnectionIdle == 0 {
		c.MaxConnectionIdle = DefaultMaxConnectionIdle
	}
	if c.MaxRawStreamsPerPrincipal == 0 {
		c.MaxRawStreamsPerPrincipal = DefaultMaxRawStreams
	}
	if c.StreamStall == 0 {
		c.StreamStall = DefaultStreamStall
	}
	return c
}

// WithTransport sets the transport's bounds (without it: the defaults of
// TransportConfig).
func WithTransport(c TransportConfig) GRPCOption {
	return func(g *grpcConfig) { g.transport = c }
}

// WithServerOptions adds gRPC server options before berthd's own, so that
// their interceptors run outside berthd's (metrics see every call, panics
// and refused credentials included); a stats handler among them
// (OpenTelemetry) sees every call too.
func WithServerOptions(opts ...grpc.ServerOption) GRPCOption {
	return func(c *grpcConfig) { c.extra = append(c.extra, opts...) }
}

// WithCluster makes the server one entry point of a fleet: router sends
// each call naming a sandbox to the node that holds it (after
// authentication, before the handlers), and nodes serves
// berth.v1.NodeService. Without it NodeService answers NOT_CLUSTERED.
func WithCluster(router *cluster.Router, nodes berthv1.NodeServiceServer) GRPCOption {
	return func(c *grpcConfig) { c.router, c.nodes = router, nodes }
}

// WithAuthenticator makes the server authenticate callers with a: its
// transport credentials (unix socket peer credentials, TLS) and its
// interceptors (bearer tokens, client certificates, admins, nodes). Without
// it the server takes auth.New(auth.Config{}): unix socket peers only, TCP
// refused.
func WithAuthenticator(a *auth.Authenticator) GRPCOption {
	return func(c *grpcConfig) { c.auth = a }
}

// NewGRPCServer returns a gRPC server serving svc as SandboxService,
// ImageService and FileService, with grpc.health.v1 (reporting SERVING),
// server reflection, keepalive, the transport's bounds (TransportConfig),
// request logging to log (with the caller's principal) and panic recovery
// (a panic becomes INTERNAL and is logged, never a crash). Every request but health checks is authenticated (see
// package auth); handlers see the caller's auth.Principal and no incoming
// metadata.
//
// Every call is logged when it ends, with its code and its duration in
// seconds (grpc.duration_seconds): at DEBUG when it succeeded or the
// caller's request was at fault, at INFO for the runtime conditions
// (RESOURCE_EXHAUSTED, UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED) and refused
// credentials (UNAUTHENTICATED, PERMISSION_DENIED), at ERROR for
// berthd's own failures (INTERNAL, UNKNOWN, DATA_LOSS), so that a busy
// server's INFO log holds lifecycle events and failures, not traffic.
// RESOURCE_EXHAUSTED lines are written at most once per method per second,
// the next one counting those left out ("suppressed").
func NewGRPCServer(svc *Service, log *slog.Logger, opts ...GRPCOption) *grpc.Server {
	return newGRPCServer(svc, log, opts)
}

// NewGatewayServer returns the gRPC server of a gateway: a berthd without
// containerd that serves the whole berth.v1 API of a fleet by routing every
// call naming a sandbox to its node (WithCluster is required). It holds no
// images: ImageService calls are FAILED_PRECONDITION; import and pull on
// the nodes.
func NewGatewayServer(log *slog.Logger, opts ...GRPCOption) *grpc.Server {
	return newGRPCServer(nil, log, opts)
}

func newGRPCServer(svc *Service, log *slog.Logger, opts []GRPCOption) *grpc.Server {
	var cfg grpcConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.auth == nil {
		// The zero Config reads no file: it cannot fail.
		a, err := auth.New(auth.Config{}, log)
		if err != nil {
			panic(err)
		}
		cfg.auth = a
	}
	logger := rpcLogger(log, newRefusalSampler(time.Second))
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(rpcLogLevel),
		logging.WithDurationField(func(d time.Duration) logging.Fields {
			return logging.Fields{"grpc.duration_seconds", d.Seconds()}
		}),
	}
	recoverOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		incident := sandboxid.New("", 10)
		log.ErrorContext(ctx, "handler panic", slog.String("incident", incident), slog.Any("panic", p))
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "internal error "+incident+"; the server log has the cause", map[string]string{"incident": incident})
	})}
	unary := []grpc.UnaryServerInterceptor{logging.UnaryServerInterceptor(logger, logOpts...), recovery.UnaryServerInterceptor(recoverOpts...)}
	unary = append(unary, cfg.auth.UnaryInterceptors()...)
	unary = append(unary, logPrincipalUnary)
	if cfg.router != nil {
		unary = append(unary, cfg.router.UnaryInterceptor(), cfg.router.ImageUnaryInterceptor())
	}
	boundary := &status.Boundary{Log: log, ServerVersion: Version}
	if svc != nil {
		unary = append(unary, svc.life.ActivityUnary())
		boundary.ConnectBudget = svc.cfg.ConnectBudget
	}
	unary = append(unary, boundary.UnaryInterceptor())
	stream := []grpc.StreamServerInterceptor{logging.StreamServerInterceptor(logger, logOpts...), recovery.StreamServerInterceptor(recoverOpts...)}
	stream = append(stream, cfg.auth.StreamInterceptors()...)
	stream = append(stream, logPrincipalStream)
	retryDelay := time.Second // the gateway's, as its router's default
	if svc != nil {
		retryDelay = svc.cfg.BusyRetryDelay
	}
	stream = append(stream, rawcap.New(cfg.transport.withDefaults().MaxRawStreamsPerPrincipal, retryDelay).StreamInterceptor(boundary.Status))
	if cfg.router != nil {
		stream = append(stream, cfg.router.StreamInterceptor(), cfg.router.ImageStreamInterceptor())
	}
	if svc != nil {
		stream = append(stream, svc.life.ActivityStream())
	}
	stream = append(stream, boundary.StreamInterceptor())
	tc := cfg.transport.withDefaults()
	srv := grpc.NewServer(append(append(cfg.extra, wire.ServerOptions()...),
		grpc.Creds(cfg.auth.TransportCredentials()),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.MaxHeaderListSize(tc.MaxHeaderListBytes),
		grpc.MaxConcurrentStreams(tc.MaxConcurrentStreams),
		grpc.ConnectionTimeout(tc.HandshakeTimeout),
		// Keepalive pings find dead callers of long silent execs; callers may
		// ping every 10 s or more, also without an active stream (a caller
		// pinging faster gets a GOAWAY, too_many_pings). A connection with
		// no call open for MaxConnectionIdle is closed.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: tc.MaxConnectionIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	if svc != nil {
		berthv1.RegisterSandboxServiceServer(srv, svc)
		berthv1.RegisterImageServiceServer(srv, svc.images)
		berthv1.RegisterFileServiceServer(srv, svc.files)
	} else {
		// The router sends every call of these services to a node; what
		// reaches them has no node to go to.
		berthv1.RegisterSandboxServiceServer(srv, gatewayService{})
		berthv1.RegisterImageServiceServer(srv, gatewayImages{})
		berthv1.RegisterFileServiceServer(srv, gatewayFiles{})
	}
	if cfg.nodes == nil {
		cfg.nodes = cluster.NotClustered{}
	}
	berthv1.RegisterNodeServiceServer(srv, cfg.nodes)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.SandboxService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.ImageService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.FileService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.NodeService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return srv
}

// rpcLogLevel is the level of a finished call's log line by its code: see
// NewGRPCServer.
func rpcLogLevel(code codes.Code) logging.Level {
	switch code {
	case codes.ResourceExhausted, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.Unauthenticated, codes.PermissionDenied:
		return logging.LevelInfo
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelError
	case codes.Unimplemented:
		return logging.LevelWarn
	}
	return logging.LevelDebug
}

// rpcLogger writes the calls' log lines to log, those of refused calls
// (RESOURCE_EXHAUSTED) at most once per method per second through
// sampler, with "suppressed" counting the ones left out since (issue 23).
func rpcLogger(log *slog.Logger, sampler *refusalSampler) logging.LoggerFunc {
	return func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		var code, method string
		for i := 0; i+1 < len(fields); i += 2 {
			switch fields[i] {
			case logging.MethodFieldKey:
				method, _ = fields[i+1].(string)
			case "grpc.code":
				code, _ = fields[i+1].(string)
			}
		}
		if code == codes.ResourceExhausted.String() {
			ok, n := sampler.allow(method)
			if !ok {
				return
			}
			if n > 0 {
				fields = append(fields, "suppressed", n)
			}
		}
		log.Log(ctx, slog.Level(lvl), msg, fields...)
	}
}

// logPrincipalUnary and logPrincipalStream add the caller's principal to
// the request's log line.
func logPrincipalUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	addPrincipalField(ctx)
	return handler(ctx, req)
}

func logPrincipalStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	addPrincipalField(ss.Context())
	return handler(srv, ss)
}

func addPrincipalField(ctx context.Context) {
	if p, ok := auth.FromContext(ctx); ok {
		logging.AddFields(ctx, logging.Fields{"principal", p.String()})
	}
}

// ListenOption configures Listen's unix socket.
type ListenOption func(*listenConfig)

type listenConfig struct {
	mode os.FileMode
	gid  int
	lim  *connlimit.Limiter
}

// WithConnectionLimits counts the listener's connections in lim, with
// those of every other listener given it: past its total cap Accept waits
// for a connection to close, past its per-peer cap (a TCP caller's IP
// address, a unix socket caller's uid) a new connection is closed at once.
func WithConnectionLimits(lim *connlimit.Limiter) ListenOption {
	return func(c *listenConfig) { c.lim = lim }
}

// WithSocketMode sets the unix socket's permission bits (default 0600: root
// only). Every uid that may connect is its own principal (auth package), so
// 0660 with WithSocketGroup, or 0666, lets local users in as themselves;
// they must also be able to search the socket's directory.
func WithSocketMode(mode os.FileMode) ListenOption {
	return func(c *listenConfig) { c.mode = mode }
}

// WithSocketGroup gives the unix socket to group gid (-1: leave it).
func WithSocketGroup(gid int) ListenOption {
	return func(c *listenConfig) { c.gid = gid }
}

// Listen listens on addr: "unix:///path" or "unix:/path" for a unix socket
// (a stale socket file is removed first; the socket is made 0600 unless
// WithSocketMode says otherwise), anything else as a TCP host:port. TCP
// needs TLS or an explicit plaintext choice: see auth.Authenticator's
// CheckListen, which berthd calls first.
func Listen(addr string, opts ...ListenOption) (net.Listener, error) {
	cfg := listenConfig{mode: 0o600, gid: -1}
	for _, o := range opts {
		o(&cfg)
	}
	path, ok := UnixPath(addr)
	if !ok {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return cfg.limit(l), nil
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if cfg.gid >= 0 {
		if err := os.Chown(path, -1, cfg.gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("give socket %s to group %d: %w", path, cfg.gid, err)
		}
	}
	if err := os.Chmod(path, cfg.mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict socket %s: %w", path, err)
	}
	// Its connections receive descriptors beside their bytes, for
	// ReadFile's copy into a caller's own file (internal/fdpass).
	return cfg.limit(fdpass.Listener{UnixListener: l.(*net.UnixListener)}), nil
}

func (c listenConfig) limit(l net.Listener) net.Listener {
	if c.lim == nil {
		return l
	}
	return c.lim.Listener(l)
}

// UnixPath returns the socket path of a "unix:///path" or "unix:/path"
// address, and false for anything else (a TCP host:port).
func UnixPath(addr string) (string, bool) {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		path, ok = strings.CutPrefix(addr, "unix:")
	}
	return path, ok
}
