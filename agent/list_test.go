package agent_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// listExecs returns the agent's execs by id.
func (a *testAgent) listExecs(t testing.TB) map[string]*berthv1.ExecInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := a.client.ListExecs(ctx, &agentv1.ListExecsRequest{})
	if err != nil {
		t.Fatalf("ListExecs: %v", err)
	}
	out := make(map[string]*berthv1.ExecInfo)
	for i, e := range resp.GetExecs() {
		if i > 0 && e.GetStartedAt().AsTime().Before(resp.GetExecs()[i-1].GetStartedAt().AsTime()) {
			t.Errorf("ListExecs: %s started before its predecessor; want start order", e.GetExecId())
		}
		out[e.GetExecId()] = e
	}
	return out
}

// startBackground starts spec in the background and checks that the stream
// ends with OK right after started.
func (a *testAgent) startBackground(t testing.TB, id string, spec *berthv1.ProcessSpec) *berthv1.ExecStarted {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	send(t, stream, &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: id, Process: spec, Background: true}}})
	resp, err := stream.Recv()
	if err != nil || resp.GetStarted() == nil {
		t.Fatalf("background start: first event %v, %v; want started", resp, err)
	}
	if resp, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("background start: after started got %v, %v; want the stream to end OK", resp, err)
	}
	return resp.GetStarted()
}

func (a *testAgent) signalExec(t testing.TB, id, sig string) (*agentv1.SignalExecResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.client.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: id, Signal: sig})
}

// TestBackgroundListSignal starts execs in the background, lists them while
// they run and after they ended, follows one with attach and stops another
// with SignalExec.
func TestBackgroundListSignal(t *testing.T) {
	a := startAgent(t)
	long := strings.Repeat("é", 200) // 400 bytes: cut at a character boundary
	spec := shell(`echo one; read x; echo "two $x"`)
	spec.Stdin = true
	started := a.startBackground(t, "bg-read", spec)
	if started.GetExecId() != "bg-read" || started.GetPid() <= 0 {
		t.Errorf("started = %v, want exec id bg-read and a pid", started)
	}
	a.startBackground(t, "bg-sleep", argv("sh", "-c", "exec sleep 30", long))
	manyArgs := argv("true")
	for range 20 {
		manyArgs.Argv = append(manyArgs.Argv, "x")
	}
	a.run(t, "done", manyArgs)

	list := a.listExecs(t)
	if len(list) != 3 {
		t.Fatalf("ListExecs = %v, want bg-read, bg-sleep and done", list)
	}
	read := list["bg-read"]
	if read.GetState() != berthv1.ExecState_EXEC_STATE_RUNNING || read.GetPid() != started.GetPid() || !read.GetStdin() || read.GetTty() ||
		read.GetResult() != nil || strings.Join(read.GetArgv(), " ") != `sh -c echo one; read x; echo "two $x"` || read.GetArgvTruncated() {
		t.Errorf("bg-read = %v, want running with pid %d, stdin, the shell's argv and no result", read, started.GetPid())
	}
	// A background exec without a timeout has none (it served for 30
	// minutes and died); one asked for keeps it; a foreground exec gets
	// the default.
	if started.GetTimeout() != nil || read.GetTimeout() != nil {
		t.Errorf("bg-read timeout: started %v, listed %v; want none", started.GetTimeout(), read.GetTimeout())
	}
	if got := list["done"].GetTimeout().AsDuration(); got != 30*time.Minute {
		t.Errorf("a foreground exec's timeout = %v, want the default 30m", got)
	}
	timed := shell("exec sleep 30")
	timed.Timeout = durationpb.New(time.Hour)
	if got := a.startBackground(t, "bg-timed", timed).GetTimeout().AsDuration(); got != time.Hour {
		t.Errorf("a background exec that asked for 1h has timeout %v", got)
	}
	a.signalExec(t, "bg-timed", "KILL")
	if age := time.Since(read.GetStartedAt().AsTime()); age < 0 || age > time.Minute {
		t.Errorf("bg-read started_at = %v, want just now", read.GetStartedAt().AsTime())
	}
	sleep := list["bg-sleep"]
	if got := sleep.GetArgv(); len(got) != 4 || len(got[3]) != 256 || got[3] != long[:256] || !sleep.GetArgvTruncated() {
		t.Errorf("bg-sleep argv = %q truncated %v, want the last argument cut to 256 bytes", got, sleep.GetArgvTruncated())
	}
	done := list["done"]
	if done.GetState() != berthv1.ExecState_EXEC_STATE_EXITED || done.GetResult().GetExitCode() != 0 ||
		len(done.GetArgv()) != 16 || !done.GetArgvTruncated() {
		t.Errorf("done = %v, want exited with exit 0 and 16 of 21 argv elements", done)
	}

	// The background exec's output waited for an attach; its stdin too.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := a.attachExec(t, ctx, "bg-read", 0)
	send(t, stream, stdinReq("x\n"))
	r := collect(t, stream, nil)
	if string(r.stdout) != "one\ntwo x\n" || r.result.GetExitCode() != 0 {
		t.Errorf("attach to bg-read: stdout %q exit %d, want %q and 0", r.stdout, r.result.GetExitCode(), "one\ntwo x\n")
	}
	if got := a.listExecs(t)["bg-read"]; got.GetState() != berthv1.ExecState_EXEC_STATE_EXITED || got.GetLastSeq() != 2 || got.GetResult().GetStdoutBytes() != 10 {
		t.Errorf("bg-read after exit = %v, want exited with last_seq 2 and 10 stdout bytes", got)
	}

	// SignalExec reaches a background exec by number; the result says so.
	resp, err := a.signalExec(t, "bg-sleep", "15")
	if err != nil || resp.GetState() != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Fatalf("SignalExec(bg-sleep, 15) = %v, %v; want RUNNING", resp, err)
	}
	r = collect(t, a.attachExec(t, ctx, "bg-sleep", 0), nil)
	if r.result.GetExitCode() != 143 || r.result.GetSignal() != "SIGTERM" {
		t.Errorf("bg-sleep result = %v, want exit 143 by SIGTERM", r.result)
	}
	if resp, err := a.signalExec(t, "bg-sleep", "KILL"); err != nil || resp.GetState() != berthv1.ExecState_EXEC_STATE_EXITED {
		t.Errorf("SignalExec(ended exec) = %v, %v; want EXITED", resp, err)
	}

	_, err = a.signalExec(t, "no-such-exec", "TERM")
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonExecNotFound || !strings.Contains(err.Error(), `"no-such-exec"`) {
		t.Errorf("SignalExec(unknown) = %v, want NOT_FOUND naming the exec", err)
	}
	_, err = a.signalExec(t, "bg-sleep", "NOPE")
	wantInvalid(t, err, "signal")
	_, err = a.signalExec(t, "", "TERM")
	wantInvalid(t, err, "exec_id")
}

// TestChildOOMScore checks that children are born with the highest OOM
// score and that the agent keeps its own.
func TestChildOOMScore(t *testing.T) {
	a := startAgent(t)
	before := readOOMScore(t, a.pid)
	r := a.run(t, execID(t), shell(`cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'`))
	if got := string(r.stdout); got != "1000\n1000\n" {
		t.Errorf("children's oom_score_adj = %q, want 1000 for the child and its child", got)
	}
	if after := readOOMScore(t, a.pid); after != before {
		t.Errorf("agent's oom_score_adj after a start = %q, want %q as before", after, before)
	}
}
