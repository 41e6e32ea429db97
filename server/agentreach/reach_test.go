package agentreach

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
)

// countingAgent answers Info with its boot id and counts the calls.
type countingAgent struct {
	agentv1.UnimplementedAgentServiceServer
	infos atomic.Int32
}

func (a *countingAgent) Info(context.Context, *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	a.infos.Add(1)
	return &agentv1.InfoResponse{BootId: "boot-1"}, nil
}

// oneSandbox is the store of one running sandbox whose task is pid.
type oneSandbox struct {
	sock string
	pid  uint32
	fakeFreezer
}

func (s *oneSandbox) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	return runtime.Sandbox{ID: id, Running: true, TaskPID: s.pid, SocketPath: s.sock, Owner: "alice"}, nil
}
func (s *oneSandbox) SocketPath(string) string { return s.sock }

// TestReachSkipsInfoOnProvenConnection (issue 23): once the agent answered
// an Info with the runtime's boot id on berthd's open connection, the next
// Reach sends no Info; a stopped agent process, or a connection dialed
// anew, gets one again.
func TestReachSkipsInfoOnProvenConnection(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	agent := &countingAgent{}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, agent)
	go srv.Serve(l)
	defer srv.Stop()
	// The sandbox's task: a process this test can stop.
	task := exec.Command("sleep", "60")
	if err := task.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { task.Process.Kill(); task.Wait() }()

	pool := agentconn.NewPool(nil)
	defer pool.Close()
	store := &oneSandbox{sock: sock, pid: uint32(task.Process.Pid)}
	r := New(Config{ConnectBudget: 2 * time.Second, BusyLimit: 4 * time.Second}, store, runtimes.NewRegistry(t.TempDir(), slog.New(slog.DiscardHandler)), pool, slog.New(slog.DiscardHandler))
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	reach := func(wantInfos int32) {
		t.Helper()
		_, id, err := r.Reach(ctx, "sb", "")
		if err != nil || id.BootID != "boot-1" {
			t.Fatalf("Reach = %+v, %v; want boot-1", id, err)
		}
		if got := agent.infos.Load(); got != wantInfos {
			t.Errorf("Info calls after Reach = %d, want %d", got, wantInfos)
		}
	}
	reach(1) // unknown runtime: asked
	reach(1) // proven on the open connection: not asked
	reach(1)

	task.Process.Signal(syscall.SIGSTOP)
	deadline := time.Now().Add(5 * time.Second)
	for !procfs.Stopped(store.pid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	reach(2) // stopped: asked (within the budget, or the caller learns nothing ran)
	task.Process.Signal(syscall.SIGCONT)
	deadline = time.Now().Add(5 * time.Second)
	for procfs.Stopped(store.pid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	reach(2)

	pool.Forget(sock)
	reach(3) // a new connection proves nothing yet
	reach(3)
}
