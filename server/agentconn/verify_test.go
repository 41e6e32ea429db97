package agentconn

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/agentproof"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// fakeAgent answers Info with the proof of its secret.
type fakeAgent struct {
	agentv1.UnimplementedAgentServiceServer
	secret []byte
}

func (a *fakeAgent) Info(_ context.Context, req *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	return &agentv1.InfoResponse{BootId: "b", Proof: agentproof.Prove(a.secret, req.GetChallenge())}, nil
}

// stubVerifier expects secret and the listener pid.
type stubVerifier struct {
	secret  []byte
	pid     int32
	refused int
}

func (v *stubVerifier) Peer(_ context.Context, _ string, cred *unix.Ucred) error {
	if cred.Pid != v.pid {
		return errors.New("wrong pid")
	}
	return nil
}
func (v *stubVerifier) Secret(context.Context, string) ([]byte, error) { return v.secret, nil }
func (v *stubVerifier) Refused(string)                                 { v.refused++ }

func serveFake(t *testing.T, secret []byte) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, &fakeAgent{secret: secret})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return sock
}

// TestPoolVerifiesAgents checks that an agent proving the expected secret
// from the expected pid is accepted, and that a listener with another
// secret, or from another pid, is refused with ErrUnverified and its
// reason kept for Refusal.
func TestPoolVerifiesAgents(t *testing.T) {
	secret, _ := agentproof.ParseSecret(agentproof.NewSecret())
	other, _ := agentproof.ParseSecret(agentproof.NewSecret())
	self := int32(os.Getpid())
	for _, tt := range []struct {
		name       string
		served     []byte
		pid        int32
		wantRefuse bool
	}{
		{"the agent", secret, self, false},
		{"another secret", other, self, true},
		{"no secret", nil, self, true},
		{"another pid", secret, self + 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := serveFake(t, tt.served)
			v := &stubVerifier{secret: secret, pid: tt.pid}
			p := NewPool(v)
			defer p.Close()
			agent, err := p.Get(sock)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, err = agent.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
			if !tt.wantRefuse {
				if err != nil || p.Refusal(sock) != nil {
					t.Errorf("Info = %v, refusal %v; want accepted", err, p.Refusal(sock))
				}
				return
			}
			if err == nil || !errors.Is(p.Refusal(sock), ErrUnverified) || v.refused == 0 {
				t.Errorf("Info = %v, refusal %v, verifier told %d times; want refused with ErrUnverified", err, p.Refusal(sock), v.refused)
			}
		})
	}
}
