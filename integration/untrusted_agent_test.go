package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/agentconn"
)

// fakeAgent is what a sandbox's root can put in place of its agent's
// socket (the directory is bind-mounted into the sandbox): an AgentService
// that answers Info and, for every exec, streams output of 1 MiB messages.
// What it does is chosen by the exec id's prefix:
//
//	endless-   never ends
//	gib-       1 GiB, then exited claiming 1 GiB of stdout
//	short-     512 KiB, then exited claiming 1 MiB, not truncated
//	huge-      one 8 MiB message
type fakeAgent struct {
	agentv1.UnimplementedAgentServiceServer
	secret []byte        // proven in Info, as a sandbox's agent proves its own
	sent   atomic.Uint64 // output bytes sent, over all streams
}

func (f *fakeAgent) Info(_ context.Context, req *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	return &agentv1.InfoResponse{BootId: "f00dfeedf00dfeedf00dfeedf00dfeed", Version: "fake", Pid: 1,
		Proof: agentproof.Prove(f.secret, req.GetChallenge())}, nil
}

// Verifier stands the fake in for a verified agent (server.Config's
// AgentVerifier): the listener must be this process and prove the fake's
// secret. The fake plays an agent that passed berthd's checks and turned
// hostile; berthd's caps must hold against it all the same.
func (f *fakeAgent) Verifier() agentconn.Verifier { return fakeVerifier{f} }

type fakeVerifier struct{ f *fakeAgent }

func (v fakeVerifier) Peer(_ context.Context, path string, cred *unix.Ucred) error {
	if int(cred.Pid) != os.Getpid() {
		return fmt.Errorf("the listener on %s is pid %d, not the test's fake agent (pid %d)", path, cred.Pid, os.Getpid())
	}
	return nil
}
func (v fakeVerifier) Secret(context.Context, string) ([]byte, error) { return v.f.secret, nil }
func (v fakeVerifier) Refused(string)                                 {}

func (f *fakeAgent) Exec(stream agentv1.AgentService_ExecServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	id := req.GetStart().GetExecId() + req.GetAttach().GetExecId()
	if err := stream.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &berthv1.ExecStarted{ExecId: id, Pid: 42}}}); err != nil {
		return err
	}
	if req.GetAttach().GetExitOnly() {
		<-stream.Context().Done() // berthd's follower of a left exec
		return nil
	}
	size, total, claim := uint64(1<<20), uint64(0), uint64(0)
	switch {
	case strings.HasPrefix(id, "gib-"):
		total, claim = 1<<30, 1<<30
	case strings.HasPrefix(id, "short-"):
		size, total, claim = 512<<10, 512<<10, 1<<20
	case strings.HasPrefix(id, "huge-"):
		size, total = 8<<20, 8<<20
	}
	data := make([]byte, size)
	var sent uint64
	for seq := uint64(1); total == 0 || sent < total; seq++ {
		out := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: berthv1.Stream_STREAM_STDOUT, Data: data}}}
		if err := stream.Send(out); err != nil {
			return err
		}
		sent += size
		f.sent.Add(size)
	}
	return stream.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{StdoutBytes: claim}}}})
}

// serveFakeAgent replaces the sandbox's agent socket with a fakeAgent.
func serveFakeAgent(t *testing.T, sandboxID string) *fakeAgent {
	t.Helper()
	path := env.rt.SocketPath(sandboxID)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{secret: []byte(strings.Repeat("s", agentproof.SecretBytes))}
	gs := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(gs, f)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return f
}

// liveHeap samples the test process's live heap (after a GC), which holds
// berthd's, every 50 ms until stop is closed, and returns the largest.
func liveHeap(stop <-chan struct{}) <-chan uint64 {
	peak := make(chan uint64, 1)
	go func() {
		var most uint64
		var ms runtime.MemStats
		for {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			most = max(most, ms.HeapAlloc)
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return peak
}

func baseHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestUntrustedAgent puts a fake agent at a sandbox's socket and checks
// that berthd applies its own caps and bounds: a Run keeps at most its caps
// while the fake sends a gigabyte, a result claiming more than arrived is
// an error, a message over berthd's limit fails the request, and an Exec
// whose caller does not read holds only flow-control windows' worth.
func TestUntrustedAgent(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	fake := serveFakeAgent(t, sb)
	conn, err := grpc.NewClient(startServer(t, server.Config{TaskRestartLimit: -1, AgentVerifier: fake.Verifier()}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	svc := berthv1.NewSandboxServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	capped := func() *berthv1.ProcessSpec {
		return &berthv1.ProcessSpec{Argv: []string{"x"}, StdoutLimitBytes: 1 << 20, StderrLimitBytes: 1 << 20}
	}

	t.Run("a gigabyte into a Run", func(t *testing.T) {
		base := baseHeap()
		stop := make(chan struct{})
		peak := liveHeap(stop)
		resp, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "gib-" + xid(t), Process: capped()})
		close(stop)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(resp.GetStdout()); got != 1<<20 || resp.GetResult().GetStdoutBytes() != 1<<30 || !resp.GetResult().GetStdoutTruncated() {
			t.Errorf("stdout %d bytes, result %v; want the 1 MiB cap of 1 GiB, truncated", got, resp.GetResult())
		}
		growth := int64(<-peak) - int64(base)
		t.Logf("live heap grew by at most %d KiB while 1 GiB went through", growth>>10)
		if growth > 64<<20 {
			t.Errorf("berthd's live heap grew by %d MiB; want it bounded by the caps and windows, far below 64 MiB", growth>>20)
		}
	})
	t.Run("a result claiming more than arrived", func(t *testing.T) {
		_, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "short-" + xid(t), Process: capped()})
		if status.Code(err) != codes.DataLoss || rpcstatus.Reason(err) != rpcstatus.ReasonOutputLost {
			t.Errorf("Run = %v, want DATA_LOSS OUTPUT_LOST", err)
		}
	})
	t.Run("a message over berthd's limit", func(t *testing.T) {
		resp, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "huge-" + xid(t), Process: capped()})
		// berthd drops the stream of a message over its limit: the
		// connection is lost, not the fake refused.
		if cause := unreachableCause(err); cause != berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECTION_LOST {
			t.Errorf("Run = %v, %v (cause %v); want SANDBOX_UNREACHABLE CONNECTION_LOST: berthd accepts at most 4 MiB per agent message", resp, err, cause)
		}
	})
	t.Run("an Exec whose caller does not read", func(t *testing.T) {
		before := fake.sent.Load()
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		stream, err := svc.Exec(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(startReq(sb, "endless-"+xid(t), capped())); err != nil {
			t.Fatal(err)
		}
		// The fake stops when flow control stops it: its count settles.
		var last uint64
		if !poll(30*time.Second, func() bool {
			n := fake.sent.Load()
			settled := n == last && n > before
			last = n
			return settled
		}) {
			t.Fatalf("the fake agent never stopped sending (%d bytes)", last-before)
		}
		t.Logf("a caller that reads nothing held the fake agent at %d KiB", (last-before)>>10)
		if last-before > 32<<20 {
			t.Errorf("%d MiB went out before flow control held the fake agent; want windows' worth, below 32 MiB", (last-before)>>20)
		}
	})
}

// unreachableCause returns the cause in err's Unreachable detail, or
// UNREACHABLE_CAUSE_UNSPECIFIED when it has none.
func unreachableCause(err error) berthv1.UnreachableCause {
	for _, d := range status.Convert(err).Details() {
		if u, ok := d.(*berthv1.Unreachable); ok {
			return u.GetCause()
		}
	}
	return berthv1.UnreachableCause_UNREACHABLE_CAUSE_UNSPECIFIED
}
