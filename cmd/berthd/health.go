package main

import (
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthAt is --health-listen.
var healthAt string

// serveHealth serves grpc.health.v1 on addr ("" for none), SERVING for
// the empty service and berth's, and returns a function that reports
// NOT_SERVING and stops it.
func serveHealth(addr string, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-listen: %w", err)
	}
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() {
		if err := srv.Serve(lis); err != nil {
			log.Error("health listener stopped", slog.String("listen", addr), slog.Any("error", err))
		}
	}()
	log.Info("health service serving", slog.String("listen", addr))
	return func() {
		hs.Shutdown()
		srv.Stop()
	}, nil
}
