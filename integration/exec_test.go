package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// execResult is everything one Exec stream delivered.
type execResult struct {
	started        *berthv1.ExecStarted
	stdout, stderr bytes.Buffer
	seqs           []uint64
	result         *berthv1.ExecResult
}

// execStream runs spec through the Exec stream, sending stdin (then
// close_stdin) when it is not nil, and collects every event.
func execStream(t *testing.T, sandboxID string, spec *berthv1.ProcessSpec, stdin []byte) *execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := env.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	spec.Stdin = stdin != nil
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sandboxID, Process: spec}}}); err != nil {
		t.Fatalf("send start: %v", err)
	}
	if stdin != nil {
		for len(stdin) > 0 {
			n := min(len(stdin), 64<<10)
			if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: stdin[:n]}}}); err != nil {
				t.Fatalf("send stdin: %v", err)
			}
			stdin = stdin[n:]
		}
		if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}); err != nil {
			t.Fatalf("send close_stdin: %v", err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("close send: %v", err)
	}
	var r execResult
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Exec recv: %v", err)
		}
		switch ev := msg.GetEvent().(type) {
		case *berthv1.ExecResponse_Started:
			r.started = ev.Started
		case *berthv1.ExecResponse_Output:
			r.seqs = append(r.seqs, ev.Output.GetSeq())
			if ev.Output.GetStream() == berthv1.Stream_STREAM_STDERR {
				r.stderr.Write(ev.Output.GetData())
			} else {
				r.stdout.Write(ev.Output.GetData())
			}
		case *berthv1.ExecResponse_Exited:
			r.result = ev.Exited.GetResult()
		}
	}
	if r.started == nil || r.result == nil {
		t.Fatalf("Exec stream: started %v, result %v; want both", r.started, r.result)
	}
	for i, s := range r.seqs {
		if s != uint64(i+1) {
			t.Fatalf("output sequence numbers %v are not 1, 2, 3, ...", r.seqs)
		}
	}
	return &r
}

// TestExec covers the skeleton's exec contract through the public stream:
// exit codes, signals, stdin with EOF, env passing, and exact bytes.
func TestExec(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0xe2, 0x82, 0xac, 0} // NUL, 0xFF, € and a last line without newline
	tests := []struct {
		name       string
		spec       *berthv1.ProcessSpec
		stdin      []byte
		wantStdout string
		wantStderr string
		wantExit   int32
		wantSignal string
	}{
		{name: "exit 0", spec: &berthv1.ProcessSpec{Argv: []string{"true"}}},
		{name: "exit 5", spec: &berthv1.ProcessSpec{ShellCommand: "exit 5"}, wantExit: 5},
		{name: "bash", spec: &berthv1.ProcessSpec{ShellCommand: "echo ${BASH_VERSION:0:1}", Shell: berthv1.Shell_SHELL_BASH}, wantStdout: "5\n"},
		{name: "missing command", spec: &berthv1.ProcessSpec{Argv: []string{"no-such-command"}}, wantExit: 127, wantStderr: "berth-agent: no-such-command: command not found\n"},
		{name: "killed by signal", spec: &berthv1.ProcessSpec{ShellCommand: "kill -KILL $$"}, wantExit: 137, wantSignal: "SIGKILL"},
		{name: "stdin and EOF", spec: &berthv1.ProcessSpec{ShellCommand: "cat; echo EOF"}, stdin: []byte("line1\nline2"), wantStdout: "line1\nline2EOF\n"},
		{name: "env on the process", spec: &berthv1.ProcessSpec{Argv: []string{"printenv", "K"}, Env: map[string]string{"K": "a=b\nc"}}, wantStdout: "a=b\nc\n"},
		{name: "cwd", spec: &berthv1.ProcessSpec{Argv: []string{"pwd"}, Cwd: "/tmp"}, wantStdout: "/tmp\n"},
		{name: "binary bytes", spec: &berthv1.ProcessSpec{Argv: []string{"cat"}}, stdin: binary, wantStdout: string(binary)},
		{name: "large stdin", spec: &berthv1.ProcessSpec{ShellCommand: "wc -c | tr -d ' '"}, stdin: bytes.Repeat([]byte("x"), 3<<20), wantStdout: "3145728\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := execStream(t, sb.GetId(), tt.spec, tt.stdin)
			if got.stdout.String() != tt.wantStdout || got.stderr.String() != tt.wantStderr {
				t.Errorf("output = stdout %q stderr %q, want %q, %q", got.stdout.String(), got.stderr.String(), tt.wantStdout, tt.wantStderr)
			}
			if got.result.GetExitCode() != tt.wantExit || got.result.GetSignal() != tt.wantSignal || got.result.GetTimedOut() {
				t.Errorf("result = %v, want exit %d signal %q", got.result, tt.wantExit, tt.wantSignal)
			}
			if got.started.GetExecId() == "" {
				t.Errorf("started = %v, want an exec id", got.started)
			}
			if got.result.GetStdoutBytes() != uint64(len(tt.wantStdout)) {
				t.Errorf("result stdout_bytes = %d, want %d", got.result.GetStdoutBytes(), len(tt.wantStdout))
			}
		})
	}
}

// TestExecTimeout checks that a timeout kills the whole process group,
// including a grandchild that ignores SIGTERM, and is reported as such.
func TestExecTimeout(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	got := execStream(t, sb.GetId(), &berthv1.ProcessSpec{
		ShellCommand: `sh -c 'trap "" TERM; echo $$; sleep 100' & wait`,
		Timeout:      durationpb.New(time.Second),
	}, nil)
	if !got.result.GetTimedOut() || got.result.GetExitCode() < 128 {
		t.Fatalf("result = %v, want timed_out and a signal exit", got.result)
	}
	pid := bytes.TrimSpace(got.stdout.Bytes())
	if len(pid) == 0 {
		t.Fatalf("grandchild printed no pid")
	}
	// The grandchild must be gone: its pid has no /proc entry, or a new one.
	check := run(t, sb.GetId(), "sh", "-c", "test -e /proc/"+string(pid)+" && cat /proc/"+string(pid)+"/cmdline || echo gone")
	if string(check.GetStdout()) != "gone\n" {
		t.Errorf("grandchild %s after timeout: %q, want gone", pid, check.GetStdout())
	}
}
