package integration

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestCallerDeadlineEndsTheCommand: a caller that gives Run, or an Exec
// stream, a deadline gets the command ended when the deadline passes, as
// the command's own timeout ends it (SIGTERM; result timed_out), instead of
// a process that outlives the call. A background start, which asked to
// outlive it, runs on.
func TestCallerDeadlineEndsTheCommand(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	cmd := &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "run-deadline", Process: cmd})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Run past its deadline: %v, want DEADLINE_EXCEEDED", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	stream, err := env.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sb, ExecId: "exec-deadline", Process: cmd}}}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	cancel()

	bg, cancelBg := context.WithTimeout(context.Background(), 2*time.Second)
	stream, err = env.sandboxes.Exec(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sb, ExecId: "background", Process: cmd, Background: true}}}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	cancelBg()

	var execs map[string]*berthv1.ExecInfo
	ended := poll(20*time.Second, func() bool {
		execs = listExecs(t, env.sandboxes, sb)
		return execs["run-deadline"].GetState() == berthv1.ExecState_EXEC_STATE_EXITED &&
			execs["exec-deadline"].GetState() == berthv1.ExecState_EXEC_STATE_EXITED
	})
	if !ended {
		t.Fatalf("the commands of calls past their deadline still run: %v", execs)
	}
	for _, id := range []string{"run-deadline", "exec-deadline"} {
		if r := execs[id].GetResult(); !r.GetTimedOut() || r.GetSignal() != "SIGTERM" {
			t.Errorf("%s: result %v, want ended by its timeout (SIGTERM)", id, r)
		}
	}
	if got := execs["background"]; got.GetState() != berthv1.ExecState_EXEC_STATE_RUNNING || got.GetTimeout() != nil {
		t.Errorf("background exec after its opening call's deadline: %v, want running with no timeout", got)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	env.sandboxes.SignalExec(ctx, &berthv1.SignalExecRequest{SandboxId: sb, ExecId: "background", Signal: "KILL"})
}
