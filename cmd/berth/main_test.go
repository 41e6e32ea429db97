package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestParseKV(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{in: nil, want: nil},
		{in: []string{"a=b"}, want: map[string]string{"a": "b"}},
		{in: []string{"a="}, want: map[string]string{"a": ""}},
		{in: []string{"url=http://x/?q=1&r=2"}, want: map[string]string{"url": "http://x/?q=1&r=2"}},
		{in: []string{"multi=line\nvalue", "b=c,d"}, want: map[string]string{"multi": "line\nvalue", "b": "c,d"}},
		{in: []string{"a=1", "a=2"}, want: map[string]string{"a": "2"}},
		{in: []string{"noequals"}, wantErr: true},
		{in: []string{"=value"}, wantErr: true},
		{in: []string{"ok=1", ""}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseKV("label", tt.in)
		if (err != nil) != tt.wantErr || !maps.Equal(got, tt.want) {
			t.Errorf("parseKV(%q) = %v, %v, want %v (error %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "--label") {
			t.Errorf("parseKV(%q) error %q does not name the flag", tt.in, err)
		}
	}
}

func TestSplitExecArgs(t *testing.T) {
	tests := []struct {
		args        []string
		dashAt      int
		wantID      string
		wantCommand []string
	}{
		{args: []string{"sb"}, dashAt: -1, wantID: "sb"},
		{args: []string{"sb", "ls", "-l"}, dashAt: -1, wantID: "sb", wantCommand: []string{"ls", "-l"}},
		{args: []string{"sb", "--", "ls", "-l"}, dashAt: -1, wantID: "sb", wantCommand: []string{"ls", "-l"}},
		{args: []string{"sb", "--", "--", "x"}, dashAt: -1, wantID: "sb", wantCommand: []string{"--", "x"}},
		// "berth exec -- sb ls": the parser ate the "--".
		{args: []string{"sb", "ls"}, dashAt: 0, wantID: "sb", wantCommand: []string{"ls"}},
		{args: []string{"sb", "--", "x"}, dashAt: 0, wantID: "sb", wantCommand: []string{"--", "x"}},
	}
	for _, tt := range tests {
		id, command := splitExecArgs(tt.args, tt.dashAt)
		if id != tt.wantID || !slices.Equal(command, tt.wantCommand) {
			t.Errorf("splitExecArgs(%q, %d) = %q, %q, want %q, %q", tt.args, tt.dashAt, id, command, tt.wantID, tt.wantCommand)
		}
	}
}

func TestProcessSpec(t *testing.T) {
	tests := []struct {
		name    string
		flags   processFlags
		command []string
		want    *berthv1.ProcessSpec
		wantErr string
	}{
		{name: "argv", command: []string{"ls", "-l"}, want: &berthv1.ProcessSpec{Argv: []string{"ls", "-l"}}},
		{
			name:    "everything",
			flags:   processFlags{env: []string{"A=1", "B=x=y"}, cwd: "/tmp", timeout: 90 * time.Second, user: "1000:100"},
			command: []string{"env"},
			want: &berthv1.ProcessSpec{Argv: []string{"env"}, Cwd: "/tmp", Env: map[string]string{"A": "1", "B": "x=y"}, User: "1000:100",
				Timeout: durationpb.New(90 * time.Second)},
		},
		{name: "shell", flags: processFlags{shell: "echo $HOME"}, want: &berthv1.ProcessSpec{ShellCommand: "echo $HOME"}},
		{name: "output limit", flags: processFlags{outputLimit: 64 << 20}, command: []string{"make"},
			want: &berthv1.ProcessSpec{Argv: []string{"make"}, StdoutLimitBytes: 64 << 20, StderrLimitBytes: 64 << 20}},
		{name: "bash", flags: processFlags{shell: "echo $HOME", bash: true}, want: &berthv1.ProcessSpec{ShellCommand: "echo $HOME", Shell: berthv1.Shell_SHELL_BASH}},
		{name: "no command", wantErr: "no command"},
		{name: "shell and command", flags: processFlags{shell: "x"}, command: []string{"y"}, wantErr: "either --shell or COMMAND"},
		{name: "bash alone", flags: processFlags{bash: true}, command: []string{"y"}, wantErr: "--bash needs --shell"},
		{name: "negative timeout", flags: processFlags{timeout: -time.Second}, command: []string{"y"}, wantErr: "must not be negative"},
		{name: "bad env", flags: processFlags{env: []string{"A"}}, command: []string{"y"}, wantErr: "--env"},
		{name: "tty", flags: processFlags{interactive: true, tty: true}, command: []string{"sh"}, want: &berthv1.ProcessSpec{Argv: []string{"sh"}}},
		{name: "detach and interactive", flags: processFlags{interactive: true, detach: true}, command: []string{"sh"}, wantErr: "--detach and -i"},
		{name: "interactive without stdin", flags: processFlags{interactive: true, noStdin: true}, command: []string{"sh"}, wantErr: "-i and --no-stdin"},
		{name: "session", flags: processFlags{shell: "pwd", session: "ss-1"}, want: &berthv1.ProcessSpec{ShellCommand: "pwd", SessionId: "ss-1"}},
		{name: "session without shell", flags: processFlags{session: "ss-1"}, command: []string{"pwd"}, wantErr: "--session needs --shell"},
		{name: "session with env", flags: processFlags{shell: "pwd", session: "ss-1", env: []string{"A=1"}}, wantErr: "takes its shell, user, cwd and environment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.flags.spec(tt.command)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("spec() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("spec(): %v", err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("spec() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForwardStdin(t *testing.T) {
	tests := []struct {
		f        processFlags
		terminal bool
		want     bool
	}{
		{f: processFlags{}, terminal: false, want: true},
		{f: processFlags{}, terminal: true, want: false},
		{f: processFlags{interactive: true}, terminal: true, want: true},
		{f: processFlags{tty: true}, terminal: true, want: false},
		{f: processFlags{interactive: true, tty: true}, terminal: true, want: true},
		{f: processFlags{noStdin: true}, terminal: false, want: false},
		{f: processFlags{noStdin: true}, terminal: true, want: false},
		{f: processFlags{detach: true}, terminal: false, want: false},
	}
	for _, tt := range tests {
		if got := tt.f.forwardStdin(tt.terminal); got != tt.want {
			t.Errorf("%+v.forwardStdin(%v) = %v, want %v", tt.f, tt.terminal, got, tt.want)
		}
	}
}

func TestResultExit(t *testing.T) {
	tests := []struct {
		res     *berthv1.ExecResult
		want    int
		wantErr bool
	}{
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(0)}, want: 0},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(1)}, want: 1},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(125)}, want: 125},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(130), Signal: "SIGINT"}, want: 130},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(137), Signal: "SIGKILL", OomKilled: true}, want: 137},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(143), Signal: "SIGTERM", TimedOut: true}, want: 143},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(255)}, want: 255},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(256)}, wantErr: true},
		{res: &berthv1.ExecResult{ExitCode: proto.Int32(-1)}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := resultExit(tt.res)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("resultExit(%v) = %d, %v, want %d (error %v)", tt.res, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestExitCode(t *testing.T) {
	notFound := &client.Error{Code: codes.NotFound, Reason: client.ReasonSandboxNotFound, Message: `sandbox "x" not found`}
	tests := []struct {
		name       string
		err        error
		want       int
		wantStderr string
	}{
		{name: "success", err: nil, want: 0},
		{name: "command status", err: exitStatus(3), want: 3},
		{name: "signal status", err: exitStatus(130), want: 130},
		{name: "wrapped status", err: fmt.Errorf("x: %w", exitStatus(7)), want: 7},
		{name: "berthd error", err: notFound, want: 125, wantStderr: "berth: sandbox \"x\" not found (SANDBOX_NOT_FOUND)\n"},
		{name: "wrapped berthd error", err: fmt.Errorf("exec e-1: %w", notFound), want: 125, wantStderr: "berth: exec e-1: sandbox \"x\" not found (SANDBOX_NOT_FOUND)\n"},
		{
			name: "grpc error without reason",
			err:  &client.Error{Code: codes.Unavailable, Message: "connection refused"},
			want: 125, wantStderr: "berth: connection refused (Unavailable)\n",
		},
		{
			name: "field violations",
			err: &client.Error{Code: codes.InvalidArgument, Reason: client.ReasonInvalidArgument, Message: "request is invalid",
				FieldViolations: []client.FieldViolation{{Field: "process.env", Description: "key contains '='"}}},
			want: 125, wantStderr: "berth: request is invalid (INVALID_ARGUMENT)\n  process.env: key contains '='\n",
		},
		{
			name: "violation already in the message",
			err: &client.Error{Code: codes.InvalidArgument, Reason: client.ReasonInvalidArgument, Message: "sandbox_id: too long",
				FieldViolations: []client.FieldViolation{{Field: "sandbox_id", Description: "too long"}}},
			want: 125, wantStderr: "berth: sandbox_id: too long (INVALID_ARGUMENT)\n",
		},
		{name: "local error", err: errors.New("--image is required"), want: 125, wantStderr: "berth: --image is required\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := exitCode(tt.err, &stderr); got != tt.want || stderr.String() != tt.wantStderr {
				t.Errorf("exitCode(%v) = %d, stderr %q, want %d, %q", tt.err, got, stderr.String(), tt.want, tt.wantStderr)
			}
		})
	}
}

// TestUsageErrors runs the CLI on command lines that fail before it dials.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args       []string
		wantStderr string
	}{
		{args: []string{"exec", "--bogus", "sb", "ls"}, wantStderr: "unknown flag: --bogus"},
		{args: []string{"exec"}, wantStderr: "requires at least 1 arg"},
		{args: []string{"exec", "sb"}, wantStderr: "no command"},
		{args: []string{"exec", "-di", "sb", "sh"}, wantStderr: "--detach and -i"},
		{args: []string{"exec", "--shell", "ls", "sb", "ls"}, wantStderr: "either --shell or COMMAND"},
		{args: []string{"run", "--", "ls"}, wantStderr: "--image is required"},
		{args: []string{"run", "--image", "x"}, wantStderr: "no command"},
		{args: []string{"run", "--image", "x", "--label", "nokv", "ls"}, wantStderr: "--label \"nokv\": want KEY=VALUE"},
		{args: []string{"sandbox", "create"}, wantStderr: "--image or --from-snapshot is required"},
		{args: []string{"sandbox", "create", "--image", "x", "--label", "=v"}, wantStderr: "want KEY=VALUE"},
		{args: []string{"sandbox", "get"}, wantStderr: "accepts 1 arg"},
		{args: []string{"sandbox", "rm"}, wantStderr: "requires at least 1 arg"},
		{args: []string{"sandbox", "ls", "extra"}, wantStderr: "unknown command"},
		{args: []string{"image", "import"}, wantStderr: "accepts 1 arg"},
		{args: []string{"nosuch"}, wantStderr: "unknown command"},
		// Issue 12: an unknown subcommand of a group printed help and
		// exited 0.
		{args: []string{"sandbox", "stop", "x"}, wantStderr: `unknown command "stop" for "berth sandbox"`},
		{args: []string{"image", "inspect", "x"}, wantStderr: `unknown command "inspect" for "berth image"`},
		// Issue 12: cobra's suggestion was printed as "\x0a\x0aDid you mean".
		{args: []string{"sandbox", "lss"}, wantStderr: "\n\nDid you mean this?\n\tls\n"},
		{args: []string{"exce"}, wantStderr: "\n\nDid you mean this?\n\texec\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			got := run(context.Background(), tt.args, &stdout, &stderr)
			if got != exitBerth || !strings.HasPrefix(stderr.String(), "berth: ") || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("berth %q = %d, stderr %q, want %d and %q", tt.args, got, stderr.String(), exitBerth, tt.wantStderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if got := run(context.Background(), []string{"version"}, &stdout, &stderr); got != 0 || !strings.HasPrefix(stdout.String(), "berth ") {
		t.Errorf("berth version = %d, %q, %q", got, stdout.String(), stderr.String())
	}
}

func TestAddrDefault(t *testing.T) {
	if got := addrDefault(func(string) string { return "" }); got != "unix:///run/berth/berthd.sock" {
		t.Errorf("addrDefault(no env) = %q, want unix:///run/berth/berthd.sock", got)
	}
	if got := addrDefault(func(k string) string { return map[string]string{"BERTH_ADDR": "host:7443"}[k] }); got != "host:7443" {
		t.Errorf("addrDefault(BERTH_ADDR=host:7443) = %q, want host:7443", got)
	}
}

func TestSignals(t *testing.T) {
	tests := []struct {
		sig      syscall.Signal
		wantName string
		wantExit int
	}{
		{syscall.SIGINT, "INT", 130},
		{syscall.SIGTERM, "TERM", 143},
		{syscall.SIGHUP, "1", 129},
	}
	for _, tt := range tests {
		if got := signalName(tt.sig); got != tt.wantName {
			t.Errorf("signalName(%v) = %q, want %q", tt.sig, got, tt.wantName)
		}
		if got := signalExit(tt.sig); got != tt.wantExit {
			t.Errorf("signalExit(%v) = %d, want %d", tt.sig, got, tt.wantExit)
		}
	}
}

func TestNotices(t *testing.T) {
	started := &berthv1.ExecStarted{Timeout: durationpb.New(5 * time.Second), StdoutLimitBytes: 100, StderrLimitBytes: 50}
	tests := []struct {
		name    string
		res     *berthv1.ExecResult
		dropped []*berthv1.ExecDropped
		want    []string
	}{
		{name: "clean", res: &berthv1.ExecResult{}},
		{name: "timeout", res: &berthv1.ExecResult{ExitCode: proto.Int32(143), TimedOut: true}, want: []string{"the command timed out after 5s"}},
		{name: "oom", res: &berthv1.ExecResult{ExitCode: proto.Int32(137), OomKilled: true}, want: []string{"the command was killed for lack of memory (OOM)"}},
		{
			name:    "truncated and dropped",
			res:     &berthv1.ExecResult{StdoutTruncated: true, StdoutBytes: 1000, StderrTruncated: true, StderrBytes: 60},
			dropped: []*berthv1.ExecDropped{{FirstSeq: 3, LastSeq: 9, LostBytes: 4096}},
			want: []string{
				"output events 3 to 9 (4096 bytes) were lost before berth read them",
				"stdout was cut at 100 of 1000 bytes",
				"stderr was cut at 50 of 60 bytes",
			},
		},
	}
	for _, tt := range tests {
		if got := notices(started, tt.res, tt.dropped); !slices.Equal(got, tt.want) {
			t.Errorf("notices(%s) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		t    time.Time
		want string
	}{
		{now.Add(-5 * time.Second), "5s ago"},
		{now.Add(-90 * time.Second), "1m ago"},
		{now.Add(-3 * time.Hour), "3h ago"},
		{now.Add(-47 * time.Hour), "47h ago"},
		{now.Add(-72 * time.Hour), "3d ago"},
		{now.Add(time.Hour), "2026-11-29T13:00:00Z"},
		{time.Unix(0, 0), "-"},
	}
	for _, tt := range tests {
		if got := ago(tt.t, now); got != tt.want {
			t.Errorf("ago(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"}, {3 << 20, "3.0 MiB"}, {5 << 30, "5.0 GiB"},
	}
	for _, tt := range tests {
		if got := byteSize(tt.n); got != tt.want {
			t.Errorf("byteSize(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
	if got, want := progressText(3<<20, 12<<20), "3.0 MiB / 12.0 MiB (25%)"; got != want {
		t.Errorf("progressText = %q, want %q", got, want)
	}
	if got, want := progressText(3<<20, -1), "3.0 MiB"; got != want {
		t.Errorf("progressText(unknown total) = %q, want %q", got, want)
	}
}

func TestSandboxTable(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	sbs := []*berthv1.Sandbox{
		{Id: "a", Image: "busybox", State: berthv1.SandboxState_SANDBOX_STATE_RUNNING, Owner: "unix:1000", CreatedAt: timestamppb.New(now.Add(-2 * time.Minute)),
			Runtime: &berthv1.RuntimeIdentity{AgentBootId: "0123456789abcdef0123"}},
		{Id: "long-sandbox", Image: "berth.dev/base:latest", State: berthv1.SandboxState_SANDBOX_STATE_STOPPED, CreatedAt: timestamppb.New(now.Add(-3 * time.Hour))},
	}
	var b bytes.Buffer
	if err := writeSandboxTable(&b, sbs, now); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"ID             IMAGE                   STATE     OWNER       CREATED   AGENT BOOT ID\n" +
		"a              busybox                 running   unix:1000   2m ago    0123456789ab\n" +
		"long-sandbox   berth.dev/base:latest   stopped   -           3h ago    -\n"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestExecTable(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	execs := []*berthv1.ExecInfo{
		{ExecId: "web", State: berthv1.ExecState_EXEC_STATE_RUNNING, Pid: 12, StartedAt: timestamppb.New(now.Add(-5 * time.Minute)),
			Argv: []string{"python3", "-m", "http.server"}, LastSeq: 7},
		{ExecId: "build", State: berthv1.ExecState_EXEC_STATE_RUNNING, Pid: 13, StartedAt: timestamppb.New(now.Add(-5 * time.Minute)),
			Argv: []string{"make"}, Timeout: durationpb.New(30 * time.Minute)},
		{ExecId: "hog", State: berthv1.ExecState_EXEC_STATE_EXITED, Pid: 40, StartedAt: timestamppb.New(now.Add(-90 * time.Second)),
			Argv: []string{"/bin/sh", "-c", "x"}, ArgvTruncated: true, Result: &berthv1.ExecResult{ExitCode: proto.Int32(137), Signal: "SIGKILL", OomKilled: true}},
		{ExecId: "slow", State: berthv1.ExecState_EXEC_STATE_EXITED, Pid: 41, StartedAt: timestamppb.New(now.Add(-time.Minute)),
			Argv: []string{"sleep", "99"}, Timeout: durationpb.New(time.Second), Result: &berthv1.ExecResult{ExitCode: proto.Int32(143), Signal: "SIGTERM", TimedOut: true}},
	}
	var b bytes.Buffer
	if err := writeExecTable(&b, execs, now); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"EXEC ID  STATE    PID  STARTED  TIMEOUT   LAST SEQ  EXIT                 COMMAND\n" +
		"web      running  12   5m ago   none      7                              python3 -m http.server\n" +
		"build    running  13   5m ago   25m left  0                              make\n" +
		"hog      exited   40   1m ago   none      0         137 SIGKILL oom      /bin/sh -c x ...\n" +
		"slow     exited   41   1m ago   1s        0         143 SIGTERM timeout  sleep 99\n"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

// TestUnreachableBerthdHint: a wrong socket gave a raw gRPC error with no
// hint of --addr or $BERTH_ADDR (issue 12).
func TestUnreachableBerthdHint(t *testing.T) {
	addr := "unix://" + t.TempDir() + "/nosuch.sock"
	for _, args := range [][]string{{"sandbox", "ls"}, {"ps", "sb"}, {"exec", "sb", "true"}} {
		var stdout, stderr bytes.Buffer
		got := run(context.Background(), append([]string{"--addr", addr, "--rpc-timeout", "5s"}, args...), &stdout, &stderr)
		want := "cannot reach berthd at " + addr + " (set --addr or $BERTH_ADDR)"
		if got != exitBerth || !strings.Contains(stderr.String(), want) {
			t.Errorf("berth %q = %d, stderr %q, want %d and %q", args, got, stderr.String(), exitBerth, want)
		}
	}
}
