package agentconn

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/berth-sandbox/berth/internal/agentproof"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// TestResetWhenListening: a connection whose first attempt found no socket
// waits out its backoff — here an hour — before it tries again;
// ResetWhenListening sees the agent's socket appear and makes it try at
// once, so that an Info waiting for the agent answers as the agent
// listens. Without it the Info below would wait the hour (and fail at its
// 30 s deadline).
func TestResetWhenListening(t *testing.T) {
	secret, _ := agentproof.ParseSecret(agentproof.NewSecret())
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	p := NewPool(&stubVerifier{secret: secret, pid: int32(os.Getpid())}, WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: time.Hour, Multiplier: 1, MaxDelay: time.Hour}, MinConnectTimeout: time.Second,
	})))
	defer p.Close()
	agent, err := p.Get(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, err := agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		answered <- err
	}()
	go p.ResetWhenListening(ctx, sock)
	// The first attempt fails (no socket) and the connection backs off.
	for p.DialError(sock) == nil {
		select {
		case err := <-answered:
			t.Fatalf("Info answered %v before the agent listened", err)
		case <-time.After(time.Millisecond):
		}
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, &fakeAgent{secret: secret})
	go srv.Serve(l)
	defer srv.Stop()
	if err := <-answered; err != nil {
		t.Fatalf("Info once the agent listens: %v, want an answer before the connection's hour of backoff", err)
	}
}
