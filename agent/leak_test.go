package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/agent"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// inProcessEnv marks a child test process that runs the agent in-process.
const inProcessEnv = "BERTH_AGENT_IN_PROCESS"

// TestNoGoroutineLeak runs the agent library in-process through a mixed
// workload and checks that every goroutine it started ends: after the
// execs finish, and after Serve returns. The agent reaps every child of
// its process, so this runs in a child test process of its own.
func TestNoGoroutineLeak(t *testing.T) {
	if os.Getenv(inProcessEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNoGoroutineLeak$", "-test.v")
		cmd.Env = append(agentEnv(), inProcessEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestNoGoroutineLeak")) {
			t.Fatalf("in-process child: %v\n%s", err, out)
		}
		return
	}

	// Start the os/signal watcher now, so it is part of the baseline.
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR2)
	signal.Stop(c)
	before := runtime.NumGoroutine()

	dir := t.TempDir()
	srv, err := agent.New(agent.Config{
		WorkDir: dir, MinTimeout: 100 * time.Millisecond, KillGrace: 100 * time.Millisecond,
		DrainGrace: 100 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	conn, err := grpc.NewClient("unix://"+l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	a := &testAgent{client: agentv1.NewAgentServiceClient(conn), dir: dir}
	a.run(t, "warm-up", argv("true"))
	serving := runtime.NumGoroutine()

	workload(t, a)

	waitGoroutines(t, "after the execs", serving)
	conn.Close()
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	waitGoroutines(t, "after Serve returned", before)
}

// workload exercises every goroutine the agent starts: output pumps,
// timeouts with a surviving grandchild, a background child holding the
// pipes, stdin writes blocked on a full pipe when the client goes away,
// failed streams, heartbeats and attaches.
func workload(t *testing.T, a *testAgent) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.run(t, "output", shell("seq 100000; echo err >&2"))
	a.run(t, "missing", argv("berth-no-such-command"))
	timeout := shell(`sh -c 'trap "" TERM; exec sleep 100' & wait`)
	timeout.Timeout = durationpb.New(100 * time.Millisecond)
	a.run(t, "timeout", timeout)
	bg := a.run(t, "background", shell(`sleep 2 & echo $!`))
	defer func() {
		var pid int
		if _, err := fmt.Sscan(string(bg.stdout), &pid); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}()

	// A client that goes away while its stdin write is blocked: the
	// process never reads, and the write ends when the exec does.
	blocked := argv("sleep", "0.3")
	blocked.Stdin = true
	sctx, scancel := context.WithCancel(ctx)
	stream := a.startExec(t, sctx, "blocked-stdin", blocked)
	// Once it runs: canceled before the agent read the start, nothing
	// would run, and the attach below would find nothing.
	if resp, err := stream.Recv(); err != nil || resp.GetStarted() == nil {
		t.Fatalf("blocked-stdin: %v, %v; want started", resp, err)
	}
	for range 8 {
		_ = stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: make([]byte, 64<<10)}}})
	}
	scancel()
	collect(t, a.attachExec(t, ctx, "blocked-stdin", 0), nil)

	// A failed stream and a heartbeat-only stream.
	sleeper := a.startExec(t, ctx, "sleeper", argv("sleep", "0.2"))
	_ = sleeper.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: "NOPE"}}})
	wantInvalid(t, recvErr(t, sleeper), "signal.signal")
	r := collect(t, a.attachExec(t, ctx, "sleeper", 0), nil)
	if len(r.heartbeats) == 0 {
		t.Errorf("no heartbeat in 0.2s at a 10ms interval")
	}
}

// waitGoroutines waits until at most want goroutines run, or fails with
// their stacks after 10s.
func waitGoroutines(t *testing.T, when string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			var buf bytes.Buffer
			pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Fatalf("%s: %d goroutines, want at most %d:\n%s", when, runtime.NumGoroutine(), want, buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
