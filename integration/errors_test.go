package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/agentbin"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// journalDir is the runtime journal directory of the tests' berthd.
func journalDir() string { return filepath.Join(env.dir, "j") }

// dialClient returns a client.Client for the berthd at addr, closed at
// cleanup.
func dialClient(t testing.TB, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), addr, opts...)
	if err != nil {
		t.Fatalf("Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startServer serves another berthd with cfg on its own unix socket, on the
// tests' containerd namespace, and returns its address. Tests give it
// TaskRestartLimit -1 unless they test restarts, so that it never competes
// with the main berthd.
func startServer(t *testing.T, cfg server.Config) string {
	t.Helper()
	return serveService(t, cfg, env.rt)
}

// serveService serves a berthd Service with cfg on rt behind a real gRPC
// server on its own unix socket, stopped at cleanup, and returns its address.
func serveService(t *testing.T, cfg server.Config, rt *runtime.Runtime) string {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("BERTH_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", t.Name())
	}
	return serveServiceLog(t, cfg, rt, log)
}

// serveServiceLog is serveService with berthd's log going to log.
func serveServiceLog(t *testing.T, cfg server.Config, rt *runtime.Runtime, log *slog.Logger) string {
	t.Helper()
	svc := server.New(cfg, rt, log)
	addr := "unix://" + filepath.Join(env.dir, shortID("s")+".sock")
	lis, err := server.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.NewGRPCServer(svc, log)
	// Connect and gRPC-Web too, as berthd serves them (TestConformanceSplit).
	go server.Serve(srv, lis, server.ServeConfig{HTTP: os.Getenv("BERTH_TEST_GRPC_ONLY") == "", Log: log})
	t.Cleanup(func() {
		srv.Stop()
		svc.Close()
	})
	return addr
}

// createSandbox creates a sandbox through c and deletes it at cleanup.
func createSandbox(t *testing.T, c *client.Client, req *berthv1.CreateSandboxRequest) *berthv1.Sandbox {
	t.Helper()
	if req == nil {
		req = &berthv1.CreateSandboxRequest{}
	}
	if req.Image == "" {
		req.Image = env.image
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DeleteSandbox(ctx, sb.GetId()); err != nil {
			t.Errorf("DeleteSandbox(%s): %v", sb.GetId(), err)
		}
	})
	return sb
}

// killTask kills every process of the sandbox's task through containerd,
// as an operator's `ctr task kill --all` would.
func killTask(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	task := sandboxTask(ctx, t, env.namespace, id)
	if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil {
		t.Fatalf("kill task %s: %v", id, err)
	}
}

// signalAgent sends sig to the agent process only, by its host pid.
func signalAgent(t *testing.T, pid uint32, sig syscall.Signal) {
	t.Helper()
	if pid == 0 {
		t.Fatal("sandbox reports no task pid")
	}
	if err := syscall.Kill(int(pid), sig); err != nil {
		t.Fatalf("kill -%d %d: %v", sig, pid, err)
	}
}

// processStopped reports whether every thread of host process pid is
// stopped (state T in /proc/<pid>/task/*/stat).
func processStopped(pid uint32) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// waitRuntime polls GetSandbox, for at most 30 s, until the sandbox runs
// with an agent boot id other than old, and returns its runtime.
func waitRuntime(t *testing.T, c *client.Client, id, old string) *berthv1.RuntimeIdentity {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := c.GetSandbox(t.Context(), id)
		if err == nil && sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING && sb.GetRuntime().GetAgentBootId() != "" && sb.GetRuntime().GetAgentBootId() != old {
			return sb.GetRuntime()
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s did not come back with a new runtime within 30 s: last %v, %v", id, sb, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitState polls GetSandbox, for at most 30 s, until the sandbox is in
// state want.
func waitState(t *testing.T, c *client.Client, id string, want berthv1.SandboxState) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := c.GetSandbox(t.Context(), id)
		if err == nil && sb.GetState() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not %v within 30 s: last %v, %v", id, want, sb, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitOutput polls, for at most 10 s, until out holds want.
func waitOutput(t *testing.T, out *agentbin.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q: no %q within 10 s", out.String(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkReplaced checks a RuntimeReplaced error of exec execID that ran in
// runtime before and started.
func checkReplaced(t *testing.T, err error, sandboxID, execID string, before *berthv1.RuntimeIdentity) *berthv1.RuntimeReplaced {
	t.Helper()
	var rr *client.RuntimeReplacedError
	if !errors.As(err, &rr) {
		t.Fatalf("Wait error = %v (%T), want a *client.RuntimeReplacedError", err, err)
	}
	d := rr.Detail
	if rr.Code != codes.Aborted || rr.Reason != client.ReasonRuntimeReplaced || rr.Message == "" {
		t.Errorf("error = code %v reason %q message %q, want ABORTED RUNTIME_REPLACED with a message", rr.Code, rr.Reason, rr.Message)
	}
	if d.GetSandboxId() != sandboxID || d.GetExecId() != execID {
		t.Errorf("detail names sandbox %q exec %q, want %q %q", d.GetSandboxId(), d.GetExecId(), sandboxID, execID)
	}
	if d.GetBefore().GetAgentBootId() != before.GetAgentBootId() || d.GetBefore().GetTaskPid() != before.GetTaskPid() || d.GetBefore().GetStartedAt() == nil {
		t.Errorf("detail before = %v, want boot %s pid %d with a start time", d.GetBefore(), before.GetAgentBootId(), before.GetTaskPid())
	}
	if d.GetAdmitted() != berthv1.Admitted_ADMITTED_STARTED {
		t.Errorf("detail admitted = %v, want ADMITTED_STARTED", d.GetAdmitted())
	}
	if d.GetElapsed().AsDuration() <= 0 || d.GetServerVersion() == "" || d.GetAgentVersion() == "" {
		t.Errorf("detail elapsed %v server %q agent %q, want all set", d.GetElapsed(), d.GetServerVersion(), d.GetAgentVersion())
	}
	if client.IsRetryable(err) {
		t.Errorf("IsRetryable(RuntimeReplaced) = true, want false")
	}
	var base *client.Error
	if !errors.As(err, &base) || base.Reason != client.ReasonRuntimeReplaced {
		t.Errorf("errors.As(*client.Error) = %v, want the embedded error", base)
	}
	return d
}

// TestRuntimeReplacedWhenTaskKilled kills the sandbox's whole task under a
// running exec: the stream must end with ABORTED RUNTIME_REPLACED within
// 2 s (containerd's exit event drives it), and berthd starts a new task
// that keeps the sandbox's files.
func TestRuntimeReplacedWhenTaskKilled(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, nil)
	id, before := sb.GetId(), sb.GetRuntime()
	run(t, id, "sh", "-c", "echo kept > /workspace/f")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out agentbin.Buffer
	e, err := c.Exec(ctx, id, &berthv1.ProcessSpec{ShellCommand: "echo running; exec sleep 60"}, client.WithStdout(&out), client.WithExecID("victim"))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	waitOutput(t, &out, "running\n")
	killed := time.Now()
	killTask(t, id)
	_, err = e.Wait()
	took := time.Since(killed)
	if took > 2*time.Second {
		t.Errorf("Wait returned %v after the kill, want within 2 s", took)
	}
	d := checkReplaced(t, err, id, "victim", before)
	if d.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED || d.GetTaskExitStatus() != 137 || d.GetTaskExitedAt() == nil || d.GetOomKilled() {
		t.Errorf("detail cause %v exit status %d exited at %v oom %v, want TASK_EXITED, 137, a time, no OOM", d.GetCause(), d.GetTaskExitStatus(), d.GetTaskExitedAt(), d.GetOomKilled())
	}
	t.Logf("RuntimeReplaced %v after the kill: %v", took, err)

	after := waitRuntime(t, c, id, before.GetAgentBootId())
	switch {
	case d.GetAfter() != nil && d.GetAfter().GetAgentBootId() != after.GetAgentBootId():
		t.Errorf("detail after = %v, the sandbox now runs %v", d.GetAfter(), after)
	case d.GetAfter() == nil && !d.GetRestarting():
		t.Errorf("detail has neither after nor restarting: %v", d)
	}
	if after.GetTaskPid() == before.GetTaskPid() {
		t.Errorf("new runtime %v has the old task pid", after)
	}
	// The new runtime started after the old task exited, and the old one
	// before: started_at is the task's own start, not a second early.
	exitedAt := d.GetTaskExitedAt().AsTime()
	for what, started := range map[string]*berthv1.RuntimeIdentity{"detail after": d.GetAfter(), "GetSandbox runtime": after} {
		if started.GetStartedAt() != nil && started.GetStartedAt().AsTime().Before(exitedAt) {
			t.Errorf("%s started_at %v is before the old task's exit at %v", what, started.GetStartedAt().AsTime(), exitedAt)
		}
	}
	if after.GetStartedAt() == nil || before.GetStartedAt() == nil || !before.GetStartedAt().AsTime().Before(exitedAt) {
		t.Errorf("runtimes started at %v then %v, old task exited at %v: want both known, the old one before the exit", before.GetStartedAt(), after.GetStartedAt(), exitedAt)
	}
	res, err := c.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/f"}})
	if err != nil || string(res.GetStdout()) != "kept\n" {
		t.Errorf("after the restart, cat /workspace/f = %q, %v; want the file kept", res.GetStdout(), err)
	}
}

// TestRuntimeReplacedWhenAgentKilled kills only the agent process. It is
// the task's PID 1, so the kernel kills the rest of the sandbox's pid
// namespace and the task exits: the same RUNTIME_REPLACED, then a new task.
// The old exec id is then STALE_HANDLE, for attach and for a start with
// that id, also for a berthd started afresh on the same journal; an unknown
// id stays EXEC_NOT_FOUND.
func TestRuntimeReplacedWhenAgentKilled(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, nil)
	id, before := sb.GetId(), sb.GetRuntime()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out agentbin.Buffer
	e, err := c.Exec(ctx, id, &berthv1.ProcessSpec{ShellCommand: "echo running; sleep 60 & wait", Stdin: true}, client.WithStdout(&out), client.WithExecID("victim"))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	waitOutput(t, &out, "running\n")
	killed := time.Now()
	signalAgent(t, before.GetTaskPid(), syscall.SIGKILL)
	_, err = e.Wait()
	took := time.Since(killed)
	if took > 2*time.Second {
		t.Errorf("Wait returned %v after the kill, want within 2 s", took)
	}
	d := checkReplaced(t, err, id, "victim", before)
	if d.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED || d.GetTaskExitStatus() != 137 {
		t.Errorf("detail cause %v exit status %d, want TASK_EXITED 137", d.GetCause(), d.GetTaskExitStatus())
	}
	if err := e.Stdin().Close(); !errors.Is(err, client.ErrStreamClosed) {
		t.Errorf("stdin close after the stream ended = %v, want ErrStreamClosed", err)
	}
	after := waitRuntime(t, c, id, before.GetAgentBootId())

	checkStale := func(t *testing.T, err error) {
		t.Helper()
		var stale *client.StaleHandleError
		if !errors.As(err, &stale) {
			t.Fatalf("error = %v (%T), want a *client.StaleHandleError", err, err)
		}
		d := stale.Detail
		if stale.Code != codes.FailedPrecondition || stale.Message == "" || d.GetExecId() != "victim" || d.GetSandboxId() != id {
			t.Errorf("stale = code %v message %q detail %v, want FAILED_PRECONDITION naming %s/victim", stale.Code, stale.Message, d, id)
		}
		if d.GetHandleRuntime().GetAgentBootId() != before.GetAgentBootId() || d.GetCurrentRuntime().GetAgentBootId() != after.GetAgentBootId() {
			t.Errorf("stale runtimes = %v -> %v, want boot %s -> %s", d.GetHandleRuntime(), d.GetCurrentRuntime(), before.GetAgentBootId(), after.GetAgentBootId())
		}
		if d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || client.IsRetryable(err) {
			t.Errorf("stale admitted %v retryable %v, want NOT_STARTED and not retryable", d.GetAdmitted(), client.IsRetryable(err))
		}
	}
	t.Run("attach", func(t *testing.T) {
		_, err := c.Attach(ctx, id, "victim", 0)
		checkStale(t, err)
	})
	t.Run("signal", func(t *testing.T) {
		_, err := c.SignalExec(ctx, id, "victim", "TERM")
		checkStale(t, err)
	})
	t.Run("start with the old id runs nothing", func(t *testing.T) {
		_, err := c.Exec(ctx, id, &berthv1.ProcessSpec{ShellCommand: "echo ran > /workspace/ran"}, client.WithExecID("victim"))
		checkStale(t, err)
		res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "test -e /workspace/ran && echo ran || echo nothing"})
		if err != nil || string(res.GetStdout()) != "nothing\n" {
			t.Errorf("after the stale start: %q, %v; want nothing to have run", res.GetStdout(), err)
		}
	})
	t.Run("unknown id is not found", func(t *testing.T) {
		_, err := c.Attach(ctx, id, "never-started", 0)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != codes.NotFound || ce.Reason != client.ReasonExecNotFound {
			t.Errorf("attach unknown = %v, want NOT_FOUND EXEC_NOT_FOUND", err)
		}
	})
	t.Run("after a berthd restart", func(t *testing.T) {
		fresh := dialClient(t, startServer(t, server.Config{JournalDir: journalDir(), TaskRestartLimit: -1}))
		_, err := fresh.Attach(ctx, id, "victim", 0)
		checkStale(t, err)
	})
}

// TestUnreachableWhenAgentStopped stops the agent with SIGSTOP: requests
// fail with UNAVAILABLE SANDBOX_UNREACHABLE once the connect budget (3 s by
// default) passes, having run nothing; after SIGCONT the sandbox works, in
// the same runtime.
func TestUnreachableWhenAgentStopped(t *testing.T) {
	need(t)
	const budget = 3 * time.Second // server.Config's default
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, nil)
	id, rt := sb.GetId(), sb.GetRuntime()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	signalAgent(t, rt.GetTaskPid(), syscall.SIGSTOP)
	// kill(2) returns before every thread has stopped: a request sent
	// meanwhile is answered, and the next one may start an exec.
	if !poll(5*time.Second, func() bool { return processStopped(rt.GetTaskPid()) }) {
		t.Fatal("the agent did not stop within 5 s of SIGSTOP")
	}
	continued := false
	t.Cleanup(func() {
		if !continued {
			syscall.Kill(int(rt.GetTaskPid()), syscall.SIGCONT)
		}
	})
	check := func(t *testing.T, call func() error) {
		t.Helper()
		began := time.Now()
		err := call()
		took := time.Since(began)
		var ue *client.UnreachableError
		if !errors.As(err, &ue) {
			t.Fatalf("error = %v (%T), want a *client.UnreachableError", err, err)
		}
		if took < budget || took > budget+time.Second {
			t.Errorf("failed after %v, want within the connect budget of %v (+1 s)", took, budget)
		}
		d := ue.Detail
		if ue.Code != codes.Unavailable || ue.Message == "" || d.GetCause() != berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT || !d.GetTaskRunning() {
			t.Errorf("error code %v message %q cause %v task running %v, want UNAVAILABLE CONNECT_TIMEOUT with the task running", ue.Code, ue.Message, d.GetCause(), d.GetTaskRunning())
		}
		if d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || !ue.NothingRan() || !client.IsRetryable(err) {
			t.Errorf("admitted %v, retryable %v; want NOT_STARTED and retryable", d.GetAdmitted(), client.IsRetryable(err))
		}
		if d.GetSandboxId() != id || d.GetRuntime().GetAgentBootId() != rt.GetAgentBootId() || d.GetConnectBudget().AsDuration() != budget || d.GetWaited().AsDuration() < budget {
			t.Errorf("detail = %v, want sandbox %s, runtime boot %s, budget %v, waited at least the budget", d, id, rt.GetAgentBootId(), budget)
		}
		t.Logf("unreachable after %v: %v", took, err)
	}
	t.Run("run", func(t *testing.T) {
		check(t, func() error {
			_, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "echo ran > /workspace/ran"})
			return err
		})
	})
	t.Run("exec", func(t *testing.T) {
		check(t, func() error {
			_, err := c.Exec(ctx, id, &berthv1.ProcessSpec{Argv: []string{"true"}})
			return err
		})
	})

	// File operations reach the agent the same way: none hangs until the
	// caller's deadline.
	t.Run("stat", func(t *testing.T) {
		check(t, func() error {
			_, err := c.Stat(ctx, id, "/workspace")
			return err
		})
	})
	t.Run("write", func(t *testing.T) {
		check(t, func() error {
			_, err := c.WriteFile(ctx, id, "/workspace/ran", strings.NewReader("ran"))
			return err
		})
	})

	signalAgent(t, rt.GetTaskPid(), syscall.SIGCONT)
	continued = true
	res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "test -e /workspace/ran && echo ran || echo nothing"})
	if err != nil || string(res.GetStdout()) != "nothing\n" {
		t.Fatalf("after SIGCONT: %q, %v; want the sandbox working and nothing run while it was stopped", res.GetStdout(), err)
	}
	got, err := c.GetSandbox(ctx, id)
	if err != nil || got.GetRuntime().GetAgentBootId() != rt.GetAgentBootId() {
		t.Errorf("after SIGCONT runtime = %v, %v; want the same runtime %v", got.GetRuntime(), err, rt)
	}
}

// TestFleetBusyExecs fills a sandbox's exec capacity: a further exec is
// RESOURCE_EXHAUSTED FLEET_BUSY with RetryInfo (also as grpcurl prints it),
// and a client with a retry policy gets through once a place frees, without
// the caller doing anything. An exec whose caller left keeps its place
// until it ends.
func TestFleetBusyExecs(t *testing.T) {
	need(t)
	const delay = 200 * time.Millisecond
	addr := startServer(t, server.Config{MaxExecsPerSandbox: 1, BusyRetryDelay: delay, TaskRestartLimit: -1})
	plain := dialClient(t, addr)
	var retries atomic.Int32
	retrying := dialClient(t, addr, client.WithRetry(client.RetryPolicy{
		MaxAttempts: 100, // bounded by ctx
		OnRetry: func(attempt int, err error, wait time.Duration) {
			retries.Add(1)
			if wait < delay {
				t.Errorf("retry %d waits %v after %v, want at least berthd's %v", attempt, wait, err, delay)
			}
		},
	}))
	id := createSandbox(t, plain, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	holder, err := plain.Exec(ctx, id, &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	checkBusy := func(t *testing.T, err error) {
		t.Helper()
		var busy *client.FleetBusyError
		if !errors.As(err, &busy) {
			t.Fatalf("error = %v (%T), want a *client.FleetBusyError", err, err)
		}
		d := busy.Detail
		if busy.Code != codes.ResourceExhausted || busy.Message == "" || busy.RetryDelay != delay || busy.Delay() != delay {
			t.Errorf("busy = code %v message %q retry delay %v, want RESOURCE_EXHAUSTED with RetryInfo %v", busy.Code, busy.Message, busy.RetryDelay, delay)
		}
		if d.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS || d.GetLimit() != 1 || d.GetInUse() != 1 || d.GetRequested() != 1 || d.GetSandboxId() != id {
			t.Errorf("detail = %v, want SANDBOX_EXECS limit 1 in use 1 requested 1 for %s", d, id)
		}
		if d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || d.GetRetryDelay().AsDuration() != delay || !client.IsRetryable(err) {
			t.Errorf("detail admitted %v retry delay %v, retryable %v; want NOT_STARTED, %v, retryable", d.GetAdmitted(), d.GetRetryDelay(), client.IsRetryable(err), delay)
		}
		var info *errdetails.RetryInfo
		for _, det := range status.Convert(err).Details() {
			if ri, ok := det.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if info.GetRetryDelay().AsDuration() != delay {
			t.Errorf("status RetryInfo = %v, want %v", info, delay)
		}
	}
	_, err = plain.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"true"}})
	checkBusy(t, err)

	t.Run("grpcurl prints the detail", func(t *testing.T) {
		bin := grpcurl(t)
		cmd := exec.Command(bin, "-plaintext", "-unix", "-d", `{"sandbox_id":"`+id+`","process":{"argv":["true"]}}`,
			strings.TrimPrefix(addr, "unix://"), "berth.v1.SandboxService/Run")
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 64+int(codes.ResourceExhausted) {
			t.Fatalf("grpcurl Run on a full sandbox: %v, want exit %d: %s", err, 64+int(codes.ResourceExhausted), out)
		}
		for _, want := range []string{"berth.v1.FleetBusy", "CAPACITY_RESOURCE_SANDBOX_EXECS", "google.rpc.RetryInfo", "FLEET_BUSY", `"inUse": "1"`} {
			if !strings.Contains(string(out), want) {
				t.Errorf("grpcurl output lacks %q:\n%s", want, out)
			}
		}
		t.Logf("grpcurl:\n%s", out)
	})

	t.Run("retry succeeds once freed", func(t *testing.T) {
		retries.Store(0)
		type result struct {
			res *berthv1.RunResponse
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := retrying.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"echo", "ran"}})
			done <- result{res, err}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for retries.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the retrying client did not retry within 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := holder.Stdin().Close(); err != nil {
			t.Fatal(err)
		}
		if res, err := holder.Wait(); err != nil || res.GetExitCode() != 0 {
			t.Fatalf("holder = %v, %v", res, err)
		}
		select {
		case r := <-done:
			if r.err != nil || string(r.res.GetStdout()) != "ran\n" {
				t.Errorf("retried Run = %v, %v; want it to have run", r.res, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("retried Run did not finish within 10 s of the place freeing")
		}
		t.Logf("retried %d times", retries.Load())
	})

	t.Run("a detached exec keeps its place", func(t *testing.T) {
		ectx, ecancel := context.WithCancel(ctx)
		e, err := plain.Exec(ectx, id, &berthv1.ProcessSpec{ShellCommand: "sleep 2"})
		if err != nil {
			t.Fatal(err)
		}
		ecancel()
		e.Wait()
		_, err = plain.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"true"}})
		checkBusy(t, err)
		began := time.Now()
		if _, err := retrying.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"true"}}); err != nil {
			t.Fatalf("retried Run: %v", err)
		}
		t.Logf("the place freed after %v", time.Since(began))
	})
}

// TestFleetBusySandboxes fills the server's sandbox and memory capacity.
func TestFleetBusySandboxes(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	existing, err := env.rt.Promised(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mem uint64
	for _, p := range existing {
		mem += p.MemoryBytes
	}
	const delay = 100 * time.Millisecond

	t.Run("count", func(t *testing.T) {
		max := len(existing) + 1
		addr := startServer(t, server.Config{MaxSandboxes: max, BusyRetryDelay: delay, TaskRestartLimit: -1})
		c := dialClient(t, addr)
		var retries atomic.Int32
		retrying := dialClient(t, addr, client.WithRetry(client.RetryPolicy{OnRetry: func(int, error, time.Duration) { retries.Add(1) }}))
		first, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
		if err != nil {
			t.Fatal(err)
		}
		secondID := shortID("second")
		_, err = c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, SandboxId: secondID})
		var busy *client.FleetBusyError
		if !errors.As(err, &busy) {
			t.Fatalf("second create = %v, want a *client.FleetBusyError", err)
		}
		if d := busy.Detail; d.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES ||
			d.GetLimit() != uint64(max) || d.GetInUse() != uint64(max) || d.GetSandboxId() != secondID || busy.RetryDelay != delay {
			t.Fatalf("second create = %v (detail %v), want FLEET_BUSY SANDBOXES limit %d in use %d", err, d, max, max)
		}
		done := make(chan error, 1)
		go func() {
			_, err := retrying.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, SandboxId: secondID})
			done <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); retries.Load() == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no retry within 10 s")
			}
		}
		if err := c.DeleteSandbox(ctx, first.GetId()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("retried create: %v", err)
		}
		if err := c.DeleteSandbox(ctx, secondID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("memory", func(t *testing.T) {
		const sbMem = 64 << 20
		budget := mem + sbMem + sbMem/2
		c := dialClient(t, startServer(t, server.Config{MemoryBudgetBytes: budget, BusyRetryDelay: delay, TaskRestartLimit: -1}))
		createSandbox(t, c, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: sbMem}})
		_, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{MemoryBytes: sbMem}})
		var busy *client.FleetBusyError
		if !errors.As(err, &busy) {
			t.Fatalf("create beyond the memory budget = %v, want a *client.FleetBusyError", err)
		}
		if d := busy.Detail; d.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY ||
			d.GetLimit() != budget || d.GetInUse() != mem+sbMem || d.GetRequested() != sbMem {
			t.Fatalf("create beyond the memory budget = %v (detail %v), want FLEET_BUSY MEMORY limit %d in use %d requested %d", err, d, budget, mem+sbMem, sbMem)
		}
		// What still fits is admitted.
		createSandbox(t, c, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: sbMem / 2}})
	})
}

// TestTaskRestartLimit lets a server restart a sandbox's task once: the
// second death leaves it stopped, and requests are UNAVAILABLE
// SANDBOX_UNREACHABLE with cause TASK_STOPPED.
func TestTaskRestartLimit(t *testing.T) {
	need(t)
	c := dialClient(t, startServer(t, server.Config{TaskRestartLimit: 1}))
	sb := createSandbox(t, c, nil)
	id := sb.GetId()
	signalAgent(t, sb.GetRuntime().GetTaskPid(), syscall.SIGKILL)
	second := waitRuntime(t, c, id, sb.GetRuntime().GetAgentBootId())
	signalAgent(t, second.GetTaskPid(), syscall.SIGKILL)
	waitState(t, c, id, berthv1.SandboxState_SANDBOX_STATE_STOPPED)
	_, err := c.Run(t.Context(), id, &berthv1.ProcessSpec{Argv: []string{"true"}})
	var ue *client.UnreachableError
	if !errors.As(err, &ue) {
		t.Fatalf("Run in the stopped sandbox = %v, want a *client.UnreachableError", err)
	}
	if d := ue.Detail; d.GetCause() != berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED || d.GetTaskRunning() ||
		d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || d.GetRuntime().GetAgentBootId() != second.GetAgentBootId() {
		t.Fatalf("Run in the stopped sandbox = %v (detail %v), want SANDBOX_UNREACHABLE TASK_STOPPED naming the last runtime %s", err, d, second.GetAgentBootId())
	}
}

// TestRuntimeReplacedWhenDeleted deletes a sandbox under a running exec.
func TestRuntimeReplacedWhenDeleted(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Exec(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.GetId()); err != nil {
		t.Fatal(err)
	}
	_, err = e.Wait()
	d := checkReplaced(t, err, sb.GetId(), e.ID(), sb.GetRuntime())
	if d.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED || d.GetAfter() != nil || d.GetRestarting() {
		t.Errorf("detail = %v, want SANDBOX_DELETED without an after", d)
	}
}

// TestErrorDetails checks the details of the plain errors through the
// client: ErrorInfo with a reason and metadata, BadRequest naming the field,
// and messages that say what failed.
func TestErrorDetails(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tests := []struct {
		name       string
		call       func() error
		wantCode   codes.Code
		wantReason string
		wantField  string // a BadRequest field violation, for INVALID_ARGUMENT
		wantMeta   map[string]string
	}{
		{"unknown sandbox", func() error { _, err := c.GetSandbox(ctx, "no-such-sandbox"); return err },
			codes.NotFound, client.ReasonSandboxNotFound, "", map[string]string{"sandbox_id": "no-such-sandbox"}},
		{"exec in unknown sandbox", func() error {
			_, err := c.Run(ctx, "no-such-sandbox", &berthv1.ProcessSpec{Argv: []string{"true"}})
			return err
		},
			codes.NotFound, client.ReasonSandboxNotFound, "", map[string]string{"sandbox_id": "no-such-sandbox"}},
		{"unknown exec", func() error { _, err := c.Attach(ctx, sb.GetId(), "no-such-exec", 0); return err },
			codes.NotFound, client.ReasonExecNotFound, "", map[string]string{"exec_id": "no-such-exec"}},
		{"malformed sandbox id", func() error {
			_, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "Bad_ID", Image: env.image})
			return err
		}, codes.InvalidArgument, client.ReasonInvalidArgument, "sandbox_id", map[string]string{"field": "sandbox_id"}},
		{"malformed process", func() error { _, err := c.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{}); return err },
			codes.InvalidArgument, client.ReasonInvalidArgument, "process.argv", map[string]string{"field": "process.argv"}},
		{"malformed exec id", func() error {
			_, err := c.Exec(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"true"}}, client.WithExecID("no spaces"))
			return err
		}, codes.InvalidArgument, client.ReasonInvalidArgument, "start.exec_id", map[string]string{"field": "start.exec_id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var ce *client.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error = %v (%T), want a *client.Error", err, err)
			}
			if ce.Code != tt.wantCode || ce.Reason != tt.wantReason || ce.Message == "" {
				t.Errorf("error = code %v reason %q message %q, want %v %s and a message", ce.Code, ce.Reason, ce.Message, tt.wantCode, tt.wantReason)
			}
			for k, v := range tt.wantMeta {
				if ce.Metadata[k] != v {
					t.Errorf("metadata = %v, want %s=%s", ce.Metadata, k, v)
				}
			}
			if tt.wantField != "" && (len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != tt.wantField || ce.FieldViolations[0].Description == "") {
				t.Errorf("field violations = %v, want one for %s", ce.FieldViolations, tt.wantField)
			}
			var info *errdetails.ErrorInfo
			for _, d := range status.Convert(err).Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info.GetDomain() != client.ErrorDomain || info.GetReason() != tt.wantReason {
				t.Errorf("ErrorInfo = %v, want domain %s reason %s", info, client.ErrorDomain, tt.wantReason)
			}
		})
	}
}
