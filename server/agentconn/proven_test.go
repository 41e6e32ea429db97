package agentconn

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/agentproof"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// TestProven checks what lets a request skip Reach's Info (issue 23): an
// Info answer that proved the secret makes its connection Proven with the
// answer's boot id while the agent sent something within the window; not
// before any Info, not past the window, not for a listener that failed the
// proof, and not once the connection was forgotten.
func TestProven(t *testing.T) {
	secret, _ := agentproof.ParseSecret(agentproof.NewSecret())
	other, _ := agentproof.ParseSecret(agentproof.NewSecret())
	info := func(t *testing.T, p *Pool, sock string) error {
		t.Helper()
		agent, err := p.Get(sock)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		return err
	}

	sock := serveFake(t, secret)
	p := NewPool(&stubVerifier{secret: secret, pid: int32(os.Getpid())})
	defer p.Close()
	if boot, ok := p.Proven(sock, time.Minute); ok {
		t.Fatalf("Proven before any Info = %q, true; want false", boot)
	}
	// The first Info dials the connection it goes over.
	if err := info(t, p, sock); err != nil {
		t.Fatal(err)
	}
	if boot, ok := p.Proven(sock, time.Minute); !ok || boot != "b" {
		t.Errorf("Proven after an Info = %q, %v; want \"b\", true", boot, ok)
	}
	if err := info(t, p, sock); err != nil {
		t.Fatal(err)
	}
	if boot, ok := p.Proven(sock, time.Minute); !ok || boot != "b" {
		t.Errorf("Proven after a second Info = %q, %v; want \"b\", true", boot, ok)
	}
	if _, ok := p.Proven(sock, time.Nanosecond); ok {
		t.Error("Proven with a window of 1 ns = true; want false (the agent sent nothing since)")
	}
	p.Forget(sock)
	if _, ok := p.Proven(sock, time.Minute); ok {
		t.Error("Proven after Forget = true; want false")
	}

	// A listener that cannot prove the sandbox's secret proves nothing.
	impostor := serveFake(t, other)
	q := NewPool(&stubVerifier{secret: secret, pid: int32(os.Getpid())})
	defer q.Close()
	if err := info(t, q, impostor); err == nil {
		t.Fatal("Info of an impostor succeeded")
	}
	if _, ok := q.Proven(impostor, time.Minute); ok {
		t.Error("Proven of an impostor = true; want false")
	}
}

// TestProvenEndsWithConnection: a proof holds for the connection it was
// made on only. When that connection ends (the agent process went away)
// the agent is no longer proven, and a listener that then takes the
// socket's path — one without the sandbox's secret — proves nothing on the
// connection gRPC dials to it.
func TestProvenEndsWithConnection(t *testing.T) {
	secret, _ := agentproof.ParseSecret(agentproof.NewSecret())
	other, _ := agentproof.ParseSecret(agentproof.NewSecret())
	sock := filepath.Join(t.TempDir(), "agent.sock")
	serve := func(s []byte) *grpc.Server {
		t.Helper()
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		agentv1.RegisterAgentServiceServer(srv, &fakeAgent{secret: s})
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
		return srv
	}
	agentSrv := serve(secret)
	p := NewPool(&stubVerifier{secret: secret, pid: int32(os.Getpid())})
	defer p.Close()
	agent, err := p.Get(sock)
	if err != nil {
		t.Fatal(err)
	}
	info := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		return err
	}
	if err := info(); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Proven(sock, time.Minute); !ok {
		t.Fatal("Proven after the agent's Info = false; want true")
	}

	agentSrv.Stop() // closes the connection; the listener removes the socket
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := p.Proven(sock, time.Minute); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Proven 5 s after the agent's connection ended = true; want false")
		}
		time.Sleep(10 * time.Millisecond)
	}

	serve(other) // an impostor at the same path
	if err := info(); err == nil {
		t.Fatal("Info of the impostor on the same path succeeded")
	}
	if boot, ok := p.Proven(sock, time.Minute); ok {
		t.Errorf("Proven after the impostor's Info = %q, true; want false", boot)
	}
}
