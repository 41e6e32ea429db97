package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestServeJoinsOnceServing: a node joins its fleet (registers, so that
// other nodes route to it) only once its server answers calls on every
// listen address (issue 22: a restarting node registered ~0.5 s before it
// served), and a refusal from the fleet stops the server and is returned.
func TestServeJoinsOnceServing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	refused := errors.New("node id in use")
	var served error
	join := func(ctx context.Context) error {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		// No WaitForReady: a server not accepting yet fails at once.
		_, served = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return refused
	}
	done := make(chan error, 1)
	go func() {
		done <- serve(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), srv, []string{"unix://" + sock}, nil, serveConfig{}, join)
	}()
	select {
	case err := <-done:
		if !errors.Is(err, refused) {
			t.Errorf("serve = %v, want the join's refusal", err)
		}
	case <-time.After(10 * time.Second):
		srv.Stop()
		t.Fatal("serve did not stop within 10s of the join's refusal")
	}
	if served != nil {
		t.Errorf("a call when join ran = %v, want the server to answer", served)
	}
}
