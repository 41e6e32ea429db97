package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// execID derives an exec id from the test's name.
func execID(t testing.TB) string {
	return regexp.MustCompile(`[^A-Za-z0-9._-]`).ReplaceAllString(t.Name(), "_")
}

func TestInfo(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(got.GetBootId()) {
		t.Errorf("boot_id = %q, want 32 hex digits", got.GetBootId())
	}
	if got.GetVersion() != testVersion {
		t.Errorf("version = %q, want %q", got.GetVersion(), testVersion)
	}
	if got.GetPid() != int64(a.pid) {
		t.Errorf("pid = %d, want %d", got.GetPid(), a.pid)
	}
}

func TestVersionFlag(t *testing.T) {
	out, err := runBinary(agentBin, "--version")
	if err != nil {
		t.Fatalf("berth-agent --version: %v", err)
	}
	if got := strings.TrimSpace(out); got != testVersion {
		t.Errorf("berth-agent --version printed %q, want %q", got, testVersion)
	}
}

func TestExitCodes(t *testing.T) {
	a := startAgent(t)
	notExec := filepath.Join(a.dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noShebang := filepath.Join(a.dir, "no-shebang")
	if err := os.WriteFile(noShebang, []byte("echo script \"$1\"\nexit 4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		spec       *berthv1.ProcessSpec
		wantCode   int32
		wantStdout string
		wantStderr string // a substring
	}{
		{"true", argv("true"), 0, "", ""},
		{"false", argv("false"), 1, "", ""},
		{"exit 5", argv("sh", "-c", "exit 5"), 5, "", ""},
		{"shell exit 5", shell("exit 5"), 5, "", ""},
		{"bash", &berthv1.ProcessSpec{ShellCommand: `echo "$BASH_VERSION" | grep -q . && exit 3`, Shell: berthv1.Shell_SHELL_BASH}, 3, "", ""},
		{"missing command", argv("berth-no-such-command", "x"), 127, "", "berth-agent: berth-no-such-command: command not found\n"},
		{"missing path", argv("/no/such/program"), 127, "", "berth-agent: /no/such/program: No such file or directory\n"},
		{"shell missing command", shell("berth-no-such-command"), 127, "", "not found"},
		{"not executable", argv(notExec), 126, "", "berth-agent: " + notExec + ": Permission denied\n"},
		{"directory", argv(a.dir), 126, "", "berth-agent: " + a.dir + ": "},
		{"script without shebang", argv(noShebang, "arg"), 4, "script arg\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.run(t, execID(t), tt.spec)
			if got := r.result.GetExitCode(); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", got, tt.wantCode, r.stderr)
			}
			if got := string(r.stdout); got != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", got, tt.wantStdout)
			}
			if got := string(r.stderr); !strings.Contains(got, tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", got, tt.wantStderr)
			}
			if got := r.result.GetSignal(); got != "" {
				t.Errorf("signal = %q, want none", got)
			}
			if got, want := r.result.GetStderrBytes(), uint64(len(r.stderr)); got != want {
				t.Errorf("stderr_bytes = %d, want %d", got, want)
			}
		})
	}
}

func TestSignal(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		signal     string
		wantCode   int32
		wantSignal string
	}{
		{"KILL", 137, "SIGKILL"},
		{"sigterm", 143, "SIGTERM"},
		{"SIGINT", 130, "SIGINT"},
		{"15", 143, "SIGTERM"},
	}
	for _, tt := range tests {
		t.Run(tt.signal, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream := a.startExec(t, ctx, execID(t), argv("sleep", "100"))
			r := &execRun{}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			r.recvEvent(t, resp)
			if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: tt.signal}}}); err != nil {
				t.Fatalf("send signal: %v", err)
			}
			collect(t, stream, r)
			if got := r.result.GetExitCode(); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d", got, tt.wantCode)
			}
			if got := r.result.GetSignal(); got != tt.wantSignal {
				t.Errorf("signal = %q, want %q", got, tt.wantSignal)
			}
			if r.result.GetTimedOut() {
				t.Errorf("timed_out = true, want false")
			}
		})
	}
}

// TestTimeoutKillsGroup runs a command whose grandchild ignores SIGTERM and
// checks that the timeout kills the whole group, grandchild included.
func TestTimeoutKillsGroup(t *testing.T) {
	a := startAgent(t, "--kill-grace", "300ms")
	// The grandchild prints its pid, ignores SIGTERM and sleeps; the shell
	// waits for it.
	spec := shell(`sh -c 'trap "" TERM; echo $$; exec sleep 100' & wait`)
	spec.Timeout = durationpb.New(time.Second)
	start := time.Now()
	r := a.run(t, execID(t), spec)
	if !r.result.GetTimedOut() {
		t.Errorf("timed_out = false, want true")
	}
	if got := r.started.GetTimeout().AsDuration(); got != time.Second {
		t.Errorf("started timeout = %v, want 1s", got)
	}
	if got := r.result.GetExitCode(); got != 143 {
		t.Errorf("exit code = %d, want 143 (the shell dies of SIGTERM)", got)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if err != nil {
		t.Fatalf("stdout %q: want the grandchild's pid", r.stdout)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(%d, 0) after the result = %v, want ESRCH: the grandchild survived", pid, err)
	}
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Errorf("exec took %v", elapsed)
	}
}

// TestTimeoutKillsWhatIgnoresTerm: a process that ignores SIGTERM outlives
// its timeout only by the kill grace: then SIGKILL ends it, reported as a
// timeout with exit 137.
func TestTimeoutKillsWhatIgnoresTerm(t *testing.T) {
	a := startAgent(t, "--kill-grace", "300ms")
	spec := shell(`trap "" TERM; sleep 100`)
	spec.Timeout = durationpb.New(time.Second)
	r := a.run(t, execID(t), spec)
	res := r.result
	if !res.GetTimedOut() || res.GetExitCode() != 137 || res.GetSignal() != "SIGKILL" {
		t.Errorf("result = %v, want timed out, exit 137, SIGKILL", res)
	}
	if d := res.GetDuration().AsDuration(); d < 1300*time.Millisecond || d > 10*time.Second {
		t.Errorf("duration %v, want the 1 s timeout plus the 300 ms grace (well under 10 s)", d)
	}
}

// TestTimeoutBounds: a timeout outside the agent's bounds is refused
// naming process.timeout and the bound, never clamped (issue 21: -1s
// silently became 1 s); caps are taken as asked.
func TestTimeoutBounds(t *testing.T) {
	a := startAgent(t, "--min-timeout", "2s", "--max-timeout", "1h", "--default-timeout", "5m")
	// Caps are never clamped: zero is no cap, and any size may be asked
	// for (the stream has no ceiling; what is retained has its own budget).
	tests := []struct {
		name        string
		timeout     *durationpb.Duration
		limit       uint64
		wantTimeout time.Duration
		wantLimit   uint64
		wantErr     string
	}{
		{"defaults", nil, 0, 5 * time.Minute, 0, ""},
		{"zero timeout", durationpb.New(0), 0, 5 * time.Minute, 0, ""},
		{"at min", durationpb.New(2 * time.Second), 10, 2 * time.Second, 10, ""},
		{"at max", durationpb.New(time.Hour), 1 << 40, time.Hour, 1 << 40, ""},
		{"within", durationpb.New(3 * time.Minute), 4000, 3 * time.Minute, 4000, ""},
		{"below min", durationpb.New(time.Millisecond), 0, 0, 0, "below the minimum of 2s"},
		{"negative", durationpb.New(-time.Second), 0, 0, 0, "negative"},
		{"above max", durationpb.New(48 * time.Hour), 0, 0, 0, "exceeds the maximum of 1h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := argv("true")
			spec.Timeout = tt.timeout
			spec.StdoutLimitBytes = tt.limit
			spec.StderrLimitBytes = tt.limit
			if tt.wantErr != "" {
				err := a.startErr(t, execID(t), spec)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "process.timeout: ") || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("start with timeout %v = %v; want INVALID_ARGUMENT process.timeout saying %q", tt.timeout.AsDuration(), err, tt.wantErr)
				}
				return
			}
			r := a.run(t, execID(t), spec)
			if got := r.started.GetTimeout().AsDuration(); got != tt.wantTimeout {
				t.Errorf("started timeout = %v, want %v", got, tt.wantTimeout)
			}
			if got := r.started.GetStdoutLimitBytes(); got != tt.wantLimit {
				t.Errorf("started stdout_limit_bytes = %d, want %d", got, tt.wantLimit)
			}
			if got := r.started.GetStderrLimitBytes(); got != tt.wantLimit {
				t.Errorf("started stderr_limit_bytes = %d, want %d", got, tt.wantLimit)
			}
		})
	}
}

func TestStdin(t *testing.T) {
	a := startAgent(t)
	t.Run("cat echoes and sees EOF", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		spec := argv("cat")
		spec.Stdin = true
		stream := a.startExec(t, ctx, execID(t), spec)
		var want []byte
		for i := range 20 {
			// Bigger than a pipe buffer in total, with every byte value.
			chunk := bytes.Repeat([]byte{byte(i), 0, 0xff, '\n'}, 4096)
			want = append(want, chunk...)
			if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: chunk}}}); err != nil {
				t.Fatalf("send stdin: %v", err)
			}
		}
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}); err != nil {
			t.Fatalf("send close_stdin: %v", err)
		}
		r := collect(t, stream, nil)
		if got := r.result.GetExitCode(); got != 0 {
			t.Errorf("exit code = %d, want 0", got)
		}
		if !bytes.Equal(r.stdout, want) {
			t.Errorf("stdout is %d bytes, want the %d bytes sent", len(r.stdout), len(want))
		}
	})
	t.Run("unread stdin does not block the exec", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		spec := argv("sh", "-c", "exit 7")
		spec.Stdin = true
		stream := a.startExec(t, ctx, execID(t), spec)
		r := &execRun{}
		// Keep sending: the exec ends on the process's exit, and writes
		// after it are dropped.
		for range 64 {
			// Errors are expected once the exec ended and the stream closed.
			_ = stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: make([]byte, 16<<10)}}})
		}
		collect(t, stream, r)
		if got := r.result.GetExitCode(); got != 7 {
			t.Errorf("exit code = %d, want 7", got)
		}
	})
	t.Run("stdin without stdin", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stream := a.startExec(t, ctx, execID(t), argv("sleep", "100"))
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte("x")}}}); err != nil {
			t.Fatalf("send stdin: %v", err)
		}
		err := recvErr(t, stream)
		wantInvalid(t, err, "stdin")
		killExec(t, a, execID(t))
	})
}

// recvErr receives until the stream fails and returns the error.
func recvErr(t testing.TB, stream agentv1.AgentService_ExecClient) error {
	t.Helper()
	for range 1000 {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
	t.Fatal("stream did not fail")
	return nil
}

// killExec kills a running exec through a new attach and waits for its end.
func killExec(t testing.TB, a *testAgent, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := a.attachExec(t, ctx, id, 0)
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: "KILL"}}}); err != nil {
		t.Fatalf("send signal: %v", err)
	}
	collect(t, stream, nil)
}

// wantInvalid checks that err is INVALID_ARGUMENT with a BadRequest naming
// field.
func wantInvalid(t testing.TB, err error, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("error = %v, want InvalidArgument", err)
	}
	if got := rpcstatus.Reason(err); got != rpcstatus.ReasonInvalidArgument {
		t.Errorf("reason = %q, want %q", got, rpcstatus.ReasonInvalidArgument)
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if len(fields) != 1 || fields[0] != field {
		t.Errorf("BadRequest fields = %q, want [%q] (message %q)", fields, field, st.Message())
	}
	if !strings.HasPrefix(st.Message(), field+": ") {
		t.Errorf("message = %q, want it to start with %q", st.Message(), field+": ")
	}
}

func TestEnv(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name string
		env  map[string]string
		key  string
		want string
	}{
		{"equals signs", map[string]string{"V": "a=b==c"}, "V", "a=b==c\n"},
		{"newlines", map[string]string{"V": "line1\nline2\n\nend"}, "V", "line1\nline2\n\nend\n"},
		{"utf-8 and tabs", map[string]string{"V": "\tä€😀 "}, "V", "\tä€😀 \n"},
		{"agent env inherited", nil, "BERTH_TEST_BASE", "from-agent\n"},
		{"agent env overridden", map[string]string{"BERTH_TEST_BASE": "mine"}, "BERTH_TEST_BASE", "mine\n"},
		{"empty value", map[string]string{"V": ""}, "V", "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := argv("printenv", tt.key)
			spec.Env = tt.env
			r := a.run(t, execID(t), spec)
			if got := string(r.stdout); got != tt.want {
				t.Errorf("printenv %s = %q, want %q", tt.key, got, tt.want)
			}
		})
	}
}

// children returns the pids and states of the processes whose parent is
// ppid, from /proc/<pid>/stat (proc(5)), but for the agent's launcher,
// which lives as long as the agent.
func children(t testing.TB, ppid int) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	kids := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		rest := string(b[bytes.LastIndexByte(b, ')')+2:])
		var state string
		var parent int
		if _, err := fmt.Sscanf(rest, "%s %d", &state, &parent); err != nil {
			continue
		}
		if cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); parent == ppid && !bytes.HasPrefix(cmdline, []byte(launcher.Arg0+"\x00")) {
			kids[pid] = state
		}
	}
	return kids
}

// TestNoZombies runs commands whose children orphan their own children and
// checks that the agent, as their subreaper, takes them — they become its
// children while they run (without the subreaper they would go to the
// host's init, and the agent would have nothing to reap) — and reaps them
// all once they exit.
func TestNoZombies(t *testing.T) {
	a := startAgent(t)
	// The sleeps let go of the exec's output, so that it ends at once.
	r := a.run(t, execID(t), shell(`exec >/dev/null 2>&1; (sleep 2 &) ; (sleep 2 &) ; (sh -c 'sleep 2 & exit 0' &)`))
	if got := r.result.GetExitCode(); got != 0 {
		t.Fatalf("exit code = %d, want 0", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	var kids map[int]string
	adopted := 0
	for {
		kids = children(t, a.pid)
		adopted = max(adopted, len(kids))
		if adopted >= 3 && len(kids) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if adopted < 3 {
		t.Errorf("the agent (pid %d) adopted %d of the 3 orphaned sleeps, want all: is it their subreaper?", a.pid, adopted)
	}
	if len(kids) != 0 {
		t.Errorf("agent (pid %d) still has children 10s later (pid: state): %v; Z means unreaped", a.pid, kids)
	}
}

func TestBinaryOutput(t *testing.T) {
	a := startAgent(t)
	r := a.run(t, execID(t), argv("sh", "-c", `printf 'a\000b\377\376\n\303'; printf '\251z\000' >&2; printf 'last line'`))
	if got, want := r.stdout, []byte("a\x00b\xff\xfe\n\xc3last line"); !bytes.Equal(got, want) {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := r.stderr, []byte("\xa9z\x00"); !bytes.Equal(got, want) {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	if got, want := r.result.GetStdoutBytes(), uint64(len("a\x00b\xff\xfe\n\xc3last line")); got != want {
		t.Errorf("stdout_bytes = %d, want %d", got, want)
	}
}

// TestBackgroundChildHoldingStdout checks that the exec ends with its
// process even though a background child keeps stdout open.
func TestBackgroundChildHoldingStdout(t *testing.T) {
	a := startAgent(t, "--drain-grace", "200ms")
	start := time.Now()
	r := a.run(t, execID(t), shell(`sleep 30 & echo $!`))
	elapsed := time.Since(start)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout))); err == nil {
		defer syscall.Kill(pid, syscall.SIGKILL)
	} else {
		t.Errorf("stdout = %q, want the background pid", r.stdout)
	}
	if got := r.result.GetExitCode(); got != 0 {
		t.Errorf("exit code = %d, want 0", got)
	}
	if elapsed >= 30*time.Second {
		t.Errorf("exec took %v: it waited for the background sleep", elapsed)
	}
}

func TestOutputCap(t *testing.T) {
	a := startAgent(t)
	spec := argv("sh", "-c", "head -c 100000 /dev/zero; head -c 5000 /dev/zero | tr '\\0' e >&2")
	spec.StdoutLimitBytes = 1000
	spec.StderrLimitBytes = 10000
	r := a.run(t, execID(t), spec)
	if got, want := r.stdout, make([]byte, 1000); !bytes.Equal(got, want) {
		t.Errorf("stdout = %d bytes, want the first 1000 zero bytes", len(got))
	}
	if got := r.result.GetStdoutBytes(); got != 100000 {
		t.Errorf("stdout_bytes = %d, want 100000", got)
	}
	if !r.result.GetStdoutTruncated() {
		t.Errorf("stdout_truncated = false, want true")
	}
	if got, want := string(r.stderr), strings.Repeat("e", 5000); got != want {
		t.Errorf("stderr = %d bytes, want 5000 'e'", len(got))
	}
	if got := r.result.GetStderrBytes(); got != 5000 {
		t.Errorf("stderr_bytes = %d, want 5000", got)
	}
	if r.result.GetStderrTruncated() {
		t.Errorf("stderr_truncated = true, want false")
	}
	for _, o := range r.outputs {
		if len(o.GetData()) > 256<<10 {
			t.Errorf("output seq %d has %d bytes, want at most 256 KiB", o.GetSeq(), len(o.GetData()))
		}
	}
}

// TestAttachResumes drops a stream mid-command and re-attaches from the last
// sequence number seen: every byte arrives exactly once.
func TestAttachResumes(t *testing.T) {
	a := startAgent(t)
	id := execID(t)
	spec := shell(`echo one; echo two >&2; read x; echo "got $x"; echo three >&2`)
	spec.Stdin = true

	ctx1, cancel1 := context.WithTimeout(context.Background(), 30*time.Second)
	stream := a.startExec(t, ctx1, id, spec)
	first := &execRun{}
	for len(first.stdout) < len("one\n") || len(first.stderr) < len("two\n") {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if first.recvEvent(t, resp) {
			t.Fatalf("exec ended early: %v", first.result)
		}
	}
	cancel1() // the client goes away; the process waits for stdin

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream = a.attachExec(t, ctx, id, first.lastSeq)
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte("it\n")}}}); err != nil {
		t.Fatalf("send stdin: %v", err)
	}
	second := &execRun{lastSeq: first.lastSeq}
	collect(t, stream, second)
	if got := string(first.stdout) + string(second.stdout); got != "one\ngot it\n" {
		t.Errorf("stdout over both streams = %q, want %q", got, "one\ngot it\n")
	}
	if got := string(first.stderr) + string(second.stderr); got != "two\nthree\n" {
		t.Errorf("stderr over both streams = %q, want %q", got, "two\nthree\n")
	}
	if got, want := second.started.GetPid(), first.started.GetPid(); got != want {
		t.Errorf("attach started pid = %d, want %d", got, want)
	}

	// A finished exec replays exactly the events after since_seq.
	total := second.lastSeq
	for since := range total + 1 {
		t.Run(fmt.Sprintf("since %d", since), func(t *testing.T) {
			r := collect(t, a.attachExec(t, ctx, id, since), &execRun{lastSeq: since})
			if got, want := uint64(len(r.outputs)), total-since; got != want {
				t.Errorf("replayed %d events, want %d", got, want)
			}
			if r.result.GetExitCode() != 0 {
				t.Errorf("exit code = %d, want 0", r.result.GetExitCode())
			}
		})
	}
	t.Run("since beyond the end", func(t *testing.T) {
		wantInvalid(t, recvErr(t, a.attachExec(t, ctx, id, total+1)), "since_seq")
	})
}

func TestAttachUnknown(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := recvErr(t, a.attachExec(t, ctx, "no-such-exec", 0))
	if got := status.Code(err); got != codes.NotFound {
		t.Errorf("code = %v, want NotFound (%v)", got, err)
	}
	if got := rpcstatus.Reason(err); got != rpcstatus.ReasonExecNotFound {
		t.Errorf("reason = %q, want %q", got, rpcstatus.ReasonExecNotFound)
	}
	if !strings.Contains(status.Convert(err).Message(), `"no-such-exec"`) {
		t.Errorf("message %q does not name the exec id", status.Convert(err).Message())
	}
}

// TestValidation checks that malformed starts fail by name before anything
// runs: every spec would create a marker file if it ran.
func TestValidation(t *testing.T) {
	a := startAgent(t)
	marker := filepath.Join(a.dir, "marker")
	touch := "touch " + marker
	aFile := filepath.Join(a.dir, "file")
	if err := os.WriteFile(aFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	with := func(f func(*berthv1.ProcessSpec)) *berthv1.ProcessSpec {
		s := shell(touch)
		f(s)
		return s
	}
	tests := []struct {
		name       string
		id         string
		spec       *berthv1.ProcessSpec
		wantCode   codes.Code
		wantField  string // for INVALID_ARGUMENT
		wantReason string // for others
	}{
		{"no process", "v1", nil, codes.InvalidArgument, "process", ""},
		{"empty argv and shell", "v2", &berthv1.ProcessSpec{}, codes.InvalidArgument, "process.argv", ""},
		{"argv and shell", "v3", with(func(s *berthv1.ProcessSpec) { s.Argv = []string{"touch", marker} }), codes.InvalidArgument, "process.argv", ""},
		{"NUL in argv", "v4", argv("touch", marker, "x\x00y"), codes.InvalidArgument, "process.argv[2]", ""},
		{"empty argv0", "v5", argv("", marker), codes.InvalidArgument, "process.argv[0]", ""},
		{"NUL in shell command", "v6", shell(touch + "\x00"), codes.InvalidArgument, "process.shell_command", ""},
		{"bad shell", "v7", with(func(s *berthv1.ProcessSpec) { s.Shell = 42 }), codes.InvalidArgument, "process.shell", ""},
		{"env key with =", "v8", with(func(s *berthv1.ProcessSpec) { s.Env = map[string]string{"A=B": "x"} }), codes.InvalidArgument, "process.env", ""},
		{"empty env key", "v9", with(func(s *berthv1.ProcessSpec) { s.Env = map[string]string{"": "x"} }), codes.InvalidArgument, "process.env", ""},
		{"NUL in env key", "v10", with(func(s *berthv1.ProcessSpec) { s.Env = map[string]string{"A\x00": "x"} }), codes.InvalidArgument, "process.env", ""},
		{"NUL in env value", "v11", with(func(s *berthv1.ProcessSpec) { s.Env = map[string]string{"OK": "x", "K": "a\x00b"} }), codes.InvalidArgument, "process.env[K]", ""},
		{"relative cwd", "v12", with(func(s *berthv1.ProcessSpec) { s.Cwd = "tmp" }), codes.InvalidArgument, "process.cwd", ""},
		{"bad timeout", "v13", with(func(s *berthv1.ProcessSpec) { s.Timeout = &durationpb.Duration{Seconds: 1, Nanos: -5} }), codes.InvalidArgument, "process.timeout", ""},
		{"empty exec id", "", shell(touch), codes.InvalidArgument, "exec_id", ""},
		{"bad exec id", "a/b", shell(touch), codes.InvalidArgument, "exec_id", ""},
		{"long exec id", strings.Repeat("x", 129), shell(touch), codes.InvalidArgument, "exec_id", ""},
		{"missing cwd", "v14", with(func(s *berthv1.ProcessSpec) { s.Cwd = "/no/such/dir" }), codes.FailedPrecondition, "", rpcstatus.ReasonCwdInvalid},
		{"cwd is a file", "v15", with(func(s *berthv1.ProcessSpec) { s.Cwd = aFile }), codes.FailedPrecondition, "", rpcstatus.ReasonCwdInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.startErr(t, tt.id, tt.spec)
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %v, want %v (%v)", got, tt.wantCode, err)
			}
			if tt.wantCode == codes.InvalidArgument {
				wantInvalid(t, err, tt.wantField)
				return
			}
			if got := rpcstatus.Reason(err); got != tt.wantReason {
				t.Errorf("reason = %q, want %q", got, tt.wantReason)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, "process.cwd") || !strings.Contains(msg, tt.spec.GetCwd()) {
				t.Errorf("message %q does not name process.cwd and %q", msg, tt.spec.GetCwd())
			}
		})
	}
	// None of them ran, and a later valid start of the same ids is new.
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat marker = %v, want not exist: a rejected start ran", err)
	}
	if r := a.run(t, "v4", shell("exit 3")); r.result.GetExitCode() != 3 {
		t.Errorf("start after a rejected start of the same id: exit code %d, want 3", r.result.GetExitCode())
	}
}

func TestStreamProtocolErrors(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("first message stdin", func(t *testing.T) {
		stream, err := a.client.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{}}}); err != nil {
			t.Fatal(err)
		}
		wantInvalid(t, recvErr(t, stream), "event")
	})
	t.Run("no message", func(t *testing.T) {
		stream, err := a.client.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		wantInvalid(t, recvErr(t, stream), "event")
	})
	t.Run("invalid signal", func(t *testing.T) {
		id := execID(t)
		stream := a.startExec(t, ctx, id, argv("sleep", "100"))
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: "SIGNOPE"}}}); err != nil {
			t.Fatal(err)
		}
		wantInvalid(t, recvErr(t, stream), "signal.signal")
		killExec(t, a, id) // the process outlives the failed stream
	})
	t.Run("second start", func(t *testing.T) {
		id := execID(t)
		stream := a.startExec(t, ctx, id, argv("sleep", "100"))
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: "other", Process: argv("true")}}}); err != nil {
			t.Fatal(err)
		}
		wantInvalid(t, recvErr(t, stream), "event")
		killExec(t, a, id)
	})
}

// TestStartIsIdempotent starts the same exec id several times, also at
// once: the command runs once and every start sees the same events.
func TestStartIsIdempotent(t *testing.T) {
	a := startAgent(t)
	file := filepath.Join(a.dir, "runs")
	spec := shell("echo ran >> " + file + "; echo out")
	const n = 4
	runs := make([]*execRun, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { runs[i] = a.run(t, "same", spec) })
	}
	wg.Wait()
	runs = append(runs, a.run(t, "same", shell("echo ran >> "+file+"; echo other")))
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "ran\n"); got != 1 {
		t.Errorf("the command ran %d times, want 1", got)
	}
	for i, r := range runs {
		if got := string(r.stdout); got != "out\n" {
			t.Errorf("start %d: stdout = %q, want %q", i, got, "out\n")
		}
		if got, want := r.started.GetPid(), runs[0].started.GetPid(); got != want {
			t.Errorf("start %d: pid = %d, want %d", i, got, want)
		}
	}
}

func TestConcurrentExecs(t *testing.T) {
	a := startAgent(t)
	const n = 8
	runs := make([]*execRun, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			runs[i] = a.run(t, fmt.Sprintf("conc-%d", i), shell(fmt.Sprintf(`i=0; while [ $i -lt 300 ]; do echo exec%d-$i; echo err%d-$i >&2; i=$((i+1)); done`, i, i)))
		})
	}
	wg.Wait()
	for i, r := range runs {
		var wantOut, wantErr strings.Builder
		for j := range 300 {
			fmt.Fprintf(&wantOut, "exec%d-%d\n", i, j)
			fmt.Fprintf(&wantErr, "err%d-%d\n", i, j)
		}
		if got := string(r.stdout); got != wantOut.String() {
			t.Errorf("exec %d: stdout is not exactly its own 300 lines (%d bytes)", i, len(got))
		}
		if got := string(r.stderr); got != wantErr.String() {
			t.Errorf("exec %d: stderr is not exactly its own 300 lines (%d bytes)", i, len(got))
		}
	}
}

// TestRingShedding fills a tiny ring and checks what readers are told about
// the events it shed. The exec is `cat`, fed one 100-byte line at a time
// and echoing each before the next is sent, so that every output event is
// exactly one line and the lost bytes are known exactly.
func TestRingShedding(t *testing.T) {
	const (
		ringBytes = 4096
		lineLen   = 100
		lines     = 100
		overhead  = 160 // agent.EventOverhead
	)
	a := startAgent(t, "--ring-bytes", fmt.Sprint(ringBytes))
	id := execID(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := argv("cat")
	spec.Stdin = true
	stream := a.startExec(t, ctx, id, spec)
	live := &execRun{}
	for i := range lines {
		line := fmt.Sprintf("%0*d\n", lineLen-1, i)
		if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte(line)}}}); err != nil {
			t.Fatalf("send stdin: %v", err)
		}
		for len(live.stdout) < (i+1)*lineLen {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if live.recvEvent(t, resp) {
				t.Fatalf("exec ended early: %v", live.result)
			}
		}
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}); err != nil {
		t.Fatal(err)
	}
	collect(t, stream, live)
	if len(live.dropped) != 0 || len(live.outputs) != lines {
		t.Fatalf("live reader got %d events and %d dropped, want %d events, none dropped", len(live.outputs), len(live.dropped), lines)
	}

	// The ring keeps the newest events whose data+overhead fit.
	kept := ringBytes / (lineLen + overhead)
	lost := uint64(lines - kept)
	tests := []struct {
		since     uint64
		wantFirst uint64
		wantBytes uint64
	}{
		{0, 1, lost * lineLen},
		{1, 2, (lost - 1) * lineLen},
		{lost / 2, lost/2 + 1, (lost - lost/2) * lineLen},
		{lost - 1, lost, lineLen},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("since %d", tt.since), func(t *testing.T) {
			r := collect(t, a.attachExec(t, ctx, id, tt.since), &execRun{lastSeq: tt.since})
			if len(r.dropped) != 1 {
				t.Fatalf("got %d dropped events, want 1", len(r.dropped))
			}
			d := r.dropped[0]
			if d.GetFirstSeq() != tt.wantFirst || d.GetLastSeq() != lost || d.GetLostBytes() != tt.wantBytes {
				t.Errorf("dropped = {%d..%d, %d bytes}, want {%d..%d, %d bytes}",
					d.GetFirstSeq(), d.GetLastSeq(), d.GetLostBytes(), tt.wantFirst, lost, tt.wantBytes)
			}
			if got, want := string(r.stdout), string(live.stdout[lost*lineLen:]); got != want {
				t.Errorf("replayed %d bytes, want the last %d", len(got), len(want))
			}
			if got := d.GetLostBytes() + uint64(len(r.stdout)); got != r.result.GetStdoutBytes()-tt.since*lineLen {
				t.Errorf("dropped + replayed = %d bytes, want stdout_bytes %d - %d seen", got, r.result.GetStdoutBytes(), tt.since*lineLen)
			}
		})
	}
	t.Run("since after the shed range", func(t *testing.T) {
		r := collect(t, a.attachExec(t, ctx, id, lost), &execRun{lastSeq: lost})
		if len(r.dropped) != 0 || len(r.outputs) != kept {
			t.Errorf("got %d events and %d dropped, want %d events, none dropped", len(r.outputs), len(r.dropped), kept)
		}
	})
}

// TestDetachedOutputWithinRing checks that a ring no one reads holds at
// most its bytes, whatever the size of the process's writes: head writes
// 8 KiB at a time, twice the ring, and the pump reads what the pipe holds.
// An attach after the end gets a dropped event for everything else, with
// the exact byte count. For stdout, stderr and a terminal.
func TestDetachedOutputWithinRing(t *testing.T) {
	const (
		ringBytes = 4096
		overhead  = 160 // agent.EventOverhead
		total     = 1 << 20
	)
	a := startAgent(t, "--ring-bytes", fmt.Sprint(ringBytes))
	head := fmt.Sprintf("head -c %d /dev/zero", total)
	for _, tt := range []struct {
		name   string
		spec   *berthv1.ProcessSpec
		stream berthv1.Stream
	}{
		{"stdout", shell(head), berthv1.Stream_STREAM_STDOUT},
		{"stderr", shell(head + " >&2"), berthv1.Stream_STREAM_STDERR},
		{"tty", &berthv1.ProcessSpec{ShellCommand: head, Tty: &berthv1.TtySize{Rows: 24, Cols: 80}}, berthv1.Stream_STREAM_STDOUT},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			id := execID(t)
			start, err := a.client.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := start.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: id, Process: tt.spec, Background: true}}}); err != nil {
				t.Fatal(err)
			}
			if resp, err := start.Recv(); err != nil || resp.GetStarted() == nil {
				t.Fatalf("background start: %v, %v; want started", resp, err)
			}
			// Wait for its end without reading its output.
			wait, err := a.client.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := wait.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: id, ExitOnly: true}}}); err != nil {
				t.Fatal(err)
			}
			if r := collect(t, wait, nil); r.result.GetStdoutBytes()+r.result.GetStderrBytes() != total {
				t.Fatalf("result %v, want %d bytes written", r.result, total)
			}

			r := collect(t, a.attachExec(t, ctx, id, 0), &execRun{})
			got := r.stdout
			if tt.stream == berthv1.Stream_STREAM_STDERR {
				got = r.stderr
			}
			if len(r.dropped) != 1 || r.dropped[0].GetFirstSeq() != 1 {
				t.Fatalf("dropped = %v, want one range from seq 1", r.dropped)
			}
			if lost := r.droppedBytes(); lost+uint64(len(got)) != total || r.result.GetExitCode() != 0 {
				t.Errorf("lost %d + received %d bytes, exit %d; want %d bytes, exit 0", lost, len(got), r.result.GetExitCode(), total)
			}
			charged := uint64(len(got)) + uint64(len(r.outputs))*overhead
			if len(got) == 0 || charged > ringBytes || !bytes.Equal(got, make([]byte, len(got))) {
				t.Errorf("received %d bytes in %d events (charged %d), want 1 to %d zero bytes charged", len(got), len(r.outputs), charged, ringBytes)
			}
		})
	}
}

// TestSlowReaderLosesNothing checks flow control: a reader that falls far
// behind a fast producer (reading nothing until the producer has written
// many rings' worth) still gets every byte, without a dropped event; the
// producer waited for it.
func TestSlowReaderLosesNothing(t *testing.T) {
	a := startAgent(t, "--ring-bytes", "4096")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := execID(t)
	stream := a.startExec(t, ctx, id, shell(`seq 400000; echo done >&2`))
	r := &execRun{}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	r.recvEvent(t, resp)
	// Fall behind: seq writes its 2.7 MB (650 rings) in well under this.
	time.Sleep(300 * time.Millisecond)
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if r.recvEvent(t, resp) {
			break
		}
		if len(r.outputs)%50 == 0 {
			time.Sleep(10 * time.Millisecond) // a slow reader throughout
		}
	}
	if len(r.dropped) != 0 {
		t.Errorf("slow reader got %d dropped events, want none", len(r.dropped))
	}
	if got, want := uint64(len(r.stdout)), r.result.GetStdoutBytes(); got != want {
		t.Errorf("read %d bytes, want stdout_bytes %d", got, want)
	}
	var want strings.Builder
	for i := 1; i <= 400000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if string(r.stdout) != want.String() {
		t.Errorf("stdout is not seq 400000 (%d bytes, want %d)", len(r.stdout), want.Len())
	}
	if string(r.stderr) != "done\n" {
		t.Errorf("stderr = %q, want %q", r.stderr, "done\n")
	}
}

func TestHeartbeat(t *testing.T) {
	a := startAgent(t, "--heartbeat-interval", "50ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := shell(`echo ready; read x; exit 0`)
	spec.Stdin = true
	stream := a.startExec(t, ctx, execID(t), spec)
	r := &execRun{}
	// Two heartbeats after the output; recvEvent checks that each carries
	// the last sequence number seen.
	var beats int
	for beats < 2 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if r.recvEvent(t, resp) {
			t.Fatalf("exec ended early: %v", r.result)
		}
		if resp.GetHeartbeat() != nil && string(r.stdout) == "ready\n" {
			beats++
		}
	}
	if got := r.heartbeats[len(r.heartbeats)-1].GetLastSeq(); got != 1 {
		t.Errorf("heartbeat last_seq = %d, want 1", got)
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}); err != nil {
		t.Fatal(err)
	}
	collect(t, stream, r)
	if r.result.GetExitCode() != 0 {
		t.Errorf("exit code = %d, want 0", r.result.GetExitCode())
	}
}

func TestRetention(t *testing.T) {
	a := startAgent(t, "--retention", "100ms")
	id := execID(t)
	a.run(t, id, argv("true"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := recvErr(t, a.attachExec(t, ctx, id, 0))
		if status.Code(err) == codes.NotFound {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("exec still attachable 10s after a 100ms retention (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRetainedBounded runs three times more execs than the agent keeps:
// only the newest are listed and attachable, the older are forgotten at
// once (NOT_FOUND) rather than after the retention time, and a running
// exec is never among those forgotten.
func TestRetainedBounded(t *testing.T) {
	const keep = 5
	a := startAgent(t, "--max-retained", fmt.Sprint(keep))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	long := a.startExec(t, ctx, "long", argv("sleep", "30"))
	defer long.CloseSend()
	var ids []string
	for i := range 3 * keep {
		id := fmt.Sprintf("short-%d", i)
		a.run(t, id, argv("true"))
		ids = append(ids, id)
	}
	list := a.listExecs(t)
	if _, ok := list["long"]; !ok || len(list) != keep+1 {
		t.Errorf("ListExecs has %d execs %v, want the running one and the last %d ended", len(list), slices.Collect(maps.Keys(list)), keep)
	}
	for i, id := range ids {
		err := recvErr(t, a.attachExec(t, ctx, id, 0))
		forgotten := status.Code(err) == codes.NotFound
		if want := i < len(ids)-keep; forgotten != want {
			t.Errorf("attach %s (the %d. of %d): forgotten %v (%v), want %v", id, i+1, len(ids), forgotten, err, want)
		}
	}
}

// TestStopKillsExecs stops the agent with SIGTERM while execs run: each
// ends (the one ignoring SIGTERM by SIGKILL), its stream gets the result,
// and the agent exits 0.
func TestStopKillsExecs(t *testing.T) {
	a := startAgent(t, "--kill-grace", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tests := []struct {
		id         string
		spec       *berthv1.ProcessSpec
		wantSignal string
	}{
		{"polite", argv("sleep", "100"), "SIGTERM"},
		{"stubborn", shell(`trap "" TERM; echo ready; sleep 100; sleep 100`), "SIGKILL"},
	}
	streams := make([]agentv1.AgentService_ExecClient, len(tests))
	runs := make([]*execRun, len(tests))
	for i, tt := range tests {
		streams[i] = a.startExec(t, ctx, tt.id, tt.spec)
		runs[i] = &execRun{}
		// Wait until the process runs (and the stubborn one set its trap).
		for runs[i].started == nil || (tt.id == "stubborn" && len(runs[i].stdout) == 0) {
			resp, err := streams[i].Recv()
			if err != nil {
				t.Fatal(err)
			}
			runs[i].recvEvent(t, resp)
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		collect(t, streams[i], runs[i])
		if got := runs[i].result.GetSignal(); got != tt.wantSignal {
			t.Errorf("%s: signal = %q, want %q", tt.id, got, tt.wantSignal)
		}
	}
	select {
	case <-a.exited:
		if a.err != nil {
			t.Errorf("agent exit: %v, want 0", a.err)
		}
	case <-ctx.Done():
		t.Fatal("agent did not exit after SIGTERM")
	}
}

// TestStaleSocket starts an agent where a killed one left its socket.
func TestStaleSocket(t *testing.T) {
	a := startAgent(t)
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	a.err = nil // killed on purpose
	sock := filepath.Join(a.dir, "a.sock")
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("socket gone after SIGKILL (%v); nothing to test", err)
	}
	out, err := runBinary(agentBin, "--socket", sock, "--version")
	if err != nil || strings.TrimSpace(out) != testVersion {
		t.Fatalf("--version: %q, %v", out, err)
	}
	b := startAgentAt(t, a.dir)
	if r := b.run(t, "after-stale", argv("true")); r.result.GetExitCode() != 0 {
		t.Errorf("exit code = %d, want 0", r.result.GetExitCode())
	}
}

func TestCwd(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name string
		cwd  string
		want string
	}{
		{"default is the workdir", "", filepath.Join(a.dir, "work")},
		{"given", a.dir, a.dir},
		{"root", "/", "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := argv("pwd", "-P")
			spec.Cwd = tt.cwd
			r := a.run(t, execID(t), spec)
			want, err := filepath.EvalSymlinks(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(r.stdout)); got != want {
				t.Errorf("pwd = %q, want %q", got, want)
			}
		})
	}
	t.Run("workdir that cannot be created", func(t *testing.T) {
		b := startAgent(t, "--workdir", "/dev/null/work")
		r := b.run(t, execID(t), argv("pwd"))
		if got := strings.TrimSpace(string(r.stdout)); got != "/" {
			t.Errorf("pwd = %q, want / (the fallback)", got)
		}
	})
}

// TestAsPID1 runs the agent as PID 1 of a new pid namespace, as in a
// sandbox: it reaps the orphans the kernel re-parents to it without being a
// subreaper, and stops cleanly on SIGTERM although PID 1 has no default
// signal actions.
func TestAsPID1(t *testing.T) {
	e2e.NeedRoot(t, "a pid namespace")
	unshare, err := osexec.LookPath("unshare")
	if err != nil {
		e2e.Missing(t, "unshare(1) (util-linux) is not installed")
	}
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := startAgentCmd(t, dir, []string{unshare, "--pid", "--fork", "--kill-child"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetPid() != 1 {
		t.Fatalf("Info pid = %d, want 1", info.GetPid())
	}
	kids := children(t, a.pid)
	if len(kids) != 1 {
		t.Fatalf("unshare has children %v, want the agent alone", kids)
	}
	for pid := range kids {
		a.signalPid = pid // SIGTERM goes to the agent, not to unshare
	}

	r := a.run(t, execID(t), shell(`(sleep 0.1 &) ; (sh -c 'sleep 0.1 & exit 0' &); echo $$`))
	if got := r.result.GetExitCode(); got != 0 {
		t.Fatalf("exit code = %d, want 0", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	var left map[int]string
	for {
		left = children(t, a.signalPid)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) != 0 {
		t.Errorf("PID 1 still has children 10s later (pid: state): %v", left)
	}
}

// TestLogBoundsProgram runs a 100 KB program name with terminal escapes:
// the agent's log line about it stays short and carries no raw control
// character.
func TestLogBoundsProgram(t *testing.T) {
	a := startAgent(t)
	r := a.run(t, execID(t), argv(strings.Repeat("x", 100<<10)+"\x1b]0;pwned\x07"))
	if got := r.result.GetExitCode(); got != 127 {
		t.Fatalf("exit code = %d, want 127", got)
	}
	for _, line := range strings.Split(a.stderr.String(), "\n") {
		if len(line) > 2048 {
			t.Errorf("agent log line of %d bytes: %.120q...", len(line), line)
		}
		if strings.ContainsAny(line, "\x1b\x07") {
			t.Errorf("agent log line with a raw control character: %.200q", line)
		}
	}
}
