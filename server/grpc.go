package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// NewGRPCServer returns a gRPC server serving svc as SandboxService and
// ImageService, with grpc.health.v1 (reporting SERVING), server reflection,
// keepalive, request logging to log and panic recovery (a panic becomes
// INTERNAL and is logged, never a crash). opts come before berthd's own
// options, so their interceptors run outside berthd's (metrics see every
// call, panics included); a stats handler among them (OpenTelemetry) sees
// every call too.
//
// Every call is logged when it ends, with its code and its duration in
// seconds (grpc.duration_seconds): at DEBUG when it succeeded or the
// caller's request was at fault, at INFO for the runtime conditions
// (RESOURCE_EXHAUSTED, UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED), at ERROR for
// berthd's own failures (INTERNAL, UNKNOWN, DATA_LOSS), so that a busy
// server's INFO log holds lifecycle events and failures, not traffic.
func NewGRPCServer(svc *Service, log *slog.Logger, opts ...grpc.ServerOption) *grpc.Server {
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		log.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(rpcLogLevel),
		logging.WithDurationField(func(d time.Duration) logging.Fields {
			return logging.Fields{"grpc.duration_seconds", d.Seconds()}
		}),
	}
	recoverOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		incident := newID("", 10)
		log.ErrorContext(ctx, "handler panic", slog.String("incident", incident), slog.Any("panic", p))
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "internal error "+incident+"; the server log has the cause", map[string]string{"incident": incident})
	})}
	srv := grpc.NewServer(append(opts,
		grpc.ChainUnaryInterceptor(logging.UnaryServerInterceptor(logger, logOpts...), recovery.UnaryServerInterceptor(recoverOpts...), svc.activityUnary()),
		grpc.ChainStreamInterceptor(logging.StreamServerInterceptor(logger, logOpts...), recovery.StreamServerInterceptor(recoverOpts...), svc.activityStream()),
		// Keepalive pings find dead callers of long silent execs; callers may
		// ping every 10 s or more, also without an active stream.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	berthv1.RegisterSandboxServiceServer(srv, svc)
	berthv1.RegisterImageServiceServer(srv, svc)
	berthv1.RegisterFileServiceServer(srv, svc.FileService())
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.SandboxService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(berthv1.ImageService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return srv
}

// Listen listens on addr: "unix:///path" or "unix:/path" for a unix socket
// (a stale socket file is removed first; the socket is made 0600), anything
// else as a TCP host:port.
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		path, ok = strings.CutPrefix(addr, "unix:")
	}
	if !ok {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return l, nil
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict socket %s: %w", path, err)
	}
	return l, nil
}

// rpcLogLevel is the level of a finished call's log line by its code: see
// NewGRPCServer.
func rpcLogLevel(code codes.Code) logging.Level {
	switch code {
	case codes.ResourceExhausted, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
		return logging.LevelInfo
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelError
	case codes.Unimplemented:
		return logging.LevelWarn
	}
	return logging.LevelDebug
}
