package client_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestExecTTYAndResize(t *testing.T) {
	env := newTestEnv(t)
	spec := &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true}
	var out, errOut bytes.Buffer
	e, err := env.c.Exec(t.Context(), "sb-1", spec, client.WithTTY(24, 80), client.WithStdout(&out), client.WithStderr(&errOut))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if spec.GetTty() != nil {
		t.Errorf("WithTTY changed the caller's spec: tty = %v", spec.GetTty())
	}
	if err := e.Resize(t.Context(), 40, 120); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if err := e.Stdin().Close(); err != nil {
		t.Fatalf("Close stdin: %v", err)
	}
	if _, err := e.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if out.String() != "tty=24x80\n" || errOut.String() != "stdin-sizes= signals=0 resizes=40x120\n" {
		t.Errorf("stdout, stderr = %q, %q; want the terminal size at start and one resize", out.String(), errOut.String())
	}
	if err := e.Resize(t.Context(), 10, 10); !errors.Is(err, client.ErrStreamClosed) {
		t.Errorf("Resize after exit = %v, want ErrStreamClosed", err)
	}
}

func TestExecBackground(t *testing.T) {
	env := newTestEnv(t)
	started, err := env.c.ExecBackground(t.Context(), "sb-1", argv("sleep"), client.WithExecID("bg-1"))
	if err != nil {
		t.Fatalf("ExecBackground: %v", err)
	}
	if started.GetExecId() != "bg-1" || started.GetPid() != 42 {
		t.Errorf("started = %v, want exec bg-1 with pid 42", started)
	}
	_, err = env.c.ExecBackground(t.Context(), "sb-missing", argv("sleep"))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != codes.NotFound || ce.Reason != client.ReasonSandboxNotFound {
		t.Errorf("ExecBackground(missing sandbox) = %v, want NOT_FOUND %s", err, client.ReasonSandboxNotFound)
	}
}

func TestListExecs(t *testing.T) {
	env := newTestEnv(t)
	resp, err := env.c.ListExecs(t.Context(), "sb-1")
	if err != nil {
		t.Fatalf("ListExecs: %v", err)
	}
	if resp.GetOmitted() != 3 {
		t.Errorf("ListExecs omitted = %d, want 3", resp.GetOmitted())
	}
	got := resp.GetExecs()
	want := []*berthv1.ExecInfo{
		{ExecId: "running-exec", State: berthv1.ExecState_EXEC_STATE_RUNNING, Argv: []string{"sleep", "30"}, Pid: 7, StartedAt: testCreated},
		{ExecId: "done-exec", State: berthv1.ExecState_EXEC_STATE_EXITED, Argv: []string{"/bin/sh", "-c", "echo"}, Pid: 8, StartedAt: testCreated,
			LastSeq: 5, Result: &berthv1.ExecResult{StdoutBytes: 18, StderrBytes: 5}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("ListExecs (-want +got):\n%s", diff)
	}
	if _, err := env.c.ListExecs(t.Context(), "sb-missing"); !isReason(err, codes.NotFound, client.ReasonSandboxNotFound) {
		t.Errorf("ListExecs(missing) = %v, want NOT_FOUND %s", err, client.ReasonSandboxNotFound)
	}
}

func TestSignalExec(t *testing.T) {
	env := newTestEnv(t)
	tests := []struct {
		exec, signal string
		want         berthv1.ExecState
		wantCode     codes.Code
		wantReason   string
	}{
		{"running-exec", "TERM", berthv1.ExecState_EXEC_STATE_RUNNING, codes.OK, ""},
		{"done-exec", "SIGINT", berthv1.ExecState_EXEC_STATE_EXITED, codes.OK, ""},
		{"no-exec", "TERM", 0, codes.NotFound, client.ReasonExecNotFound},
		{"running-exec", "NOPE", 0, codes.InvalidArgument, client.ReasonInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.exec+" "+tt.signal, func(t *testing.T) {
			got, err := env.c.SignalExec(t.Context(), "sb-1", tt.exec, tt.signal)
			if tt.wantCode == codes.OK {
				if err != nil || got != tt.want {
					t.Errorf("SignalExec = %v, %v; want %v", got, err, tt.want)
				}
				return
			}
			if !isReason(err, tt.wantCode, tt.wantReason) {
				t.Errorf("SignalExec = %v, %v; want %v %s", got, err, tt.wantCode, tt.wantReason)
			}
		})
	}
}

func isReason(err error, code codes.Code, reason string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == code && ce.Reason == reason
}
