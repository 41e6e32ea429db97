package agent_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// withTTY returns spec running on a terminal of rows x cols.
func withTTY(spec *berthv1.ProcessSpec, rows, cols uint32) *berthv1.ProcessSpec {
	spec.Tty = &berthv1.TtySize{Rows: rows, Cols: cols}
	return spec
}

// recvUntil receives events into r until its stdout contains want, and
// fails when the exec ends first.
func recvUntil(t testing.TB, stream agentv1.AgentService_ExecClient, r *execRun, want string) {
	t.Helper()
	for !strings.Contains(string(r.stdout), want) {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv waiting for %q (stdout so far %q): %v", want, r.stdout, err)
		}
		if r.recvEvent(t, resp) {
			t.Fatalf("exec ended with %v before stdout held %q (stdout %q)", r.result, want, r.stdout)
		}
	}
}

func send(t testing.TB, stream agentv1.AgentService_ExecClient, req *agentv1.ExecRequest) {
	t.Helper()
	if err := stream.Send(req); err != nil {
		t.Fatalf("send %v: %v", req, err)
	}
}

func stdinReq(s string) *agentv1.ExecRequest {
	return &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte(s)}}}
}

func resizeReq(rows, cols uint32) *agentv1.ExecRequest {
	return &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Resize{Resize: &berthv1.ExecResize{Rows: rows, Cols: cols}}}
}

var closeStdinReq = &agentv1.ExecRequest{Event: &agentv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}}

// TestTTY runs commands on a terminal: one output stream with the line
// discipline's "\r\n", the terminal's name and size, a controlling terminal
// of a new session.
func TestTTY(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name     string
		spec     *berthv1.ProcessSpec
		want     string // a regexp for the whole stdout
		wantExit int32
	}{
		{"tty names a pts", argv("tty"), `^/dev/pts/[0-9]+\r\n$`, 0},
		{"stty size", argv("stty", "size"), `^24 80\r\n$`, 0},
		{"stderr is the terminal", shell(`echo out; echo err >&2; exit 3`), `^out\r\nerr\r\n$`, 3},
		{"no trailing newline", shell(`printf 'a\nb'`), `^a\r\nb$`, 0},
		// pid ppid ... fields 5-8 of /proc/PID/stat: pgrp, session, tty_nr,
		// tpgid (proc(5)); the shell leads its session and the terminal's
		// foreground group.
		{"session leader", shell(`set -- $(cut -d' ' -f1,5,6,8 /proc/$$/stat); echo "$1 $2 $3 $4"`), `^([0-9]+) ([0-9]+) ([0-9]+) ([0-9]+)\r\n$`, 0},
		{"missing program", argv("berth-no-such-command"), `^berth-agent: berth-no-such-command: command not found\n$`, 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.run(t, execID(t), withTTY(tt.spec, 24, 80))
			m := regexp.MustCompile(tt.want).FindStringSubmatch(string(r.stdout))
			if m == nil {
				t.Fatalf("stdout = %q, want it to match %q", r.stdout, tt.want)
			}
			if len(m) == 5 && !(m[1] == m[2] && m[2] == m[3] && m[3] == m[4]) {
				t.Errorf("pid, pgrp, session, tpgid = %v, want all equal", m[1:])
			}
			if len(r.stderr) != 0 || r.result.GetStderrBytes() != 0 {
				t.Errorf("stderr = %q (%d bytes), want nothing: a terminal is one stream", r.stderr, r.result.GetStderrBytes())
			}
			if got, want := r.result.GetStdoutBytes(), uint64(len(r.stdout)); got != want {
				t.Errorf("stdout_bytes = %d, want %d", got, want)
			}
			if got := r.result.GetExitCode(); got != tt.wantExit {
				t.Errorf("exit code = %d, want %d", got, tt.wantExit)
			}
		})
	}
}

// TestTTYResizeAndStdin types into a terminal, resizes it between two
// `stty size`, and ends cat with close_stdin's EOT.
func TestTTYResizeAndStdin(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("resize", func(t *testing.T) {
		spec := withTTY(shell(`stty size; read x; stty size`), 24, 80)
		spec.Stdin = true
		stream := a.startExec(t, ctx, execID(t), spec)
		r := &execRun{}
		recvUntil(t, stream, r, "24 80\r\n")
		send(t, stream, resizeReq(40, 132))
		send(t, stream, stdinReq("go\n"))
		collect(t, stream, r)
		// "go" is echoed by the terminal, then the new size.
		if got, want := string(r.stdout), "24 80\r\ngo\r\n40 132\r\n"; got != want {
			t.Errorf("stdout = %q, want %q", got, want)
		}
	})
	t.Run("close_stdin types EOT", func(t *testing.T) {
		spec := withTTY(argv("cat"), 24, 80)
		spec.Stdin = true
		stream := a.startExec(t, ctx, execID(t), spec)
		send(t, stream, stdinReq("abc\n"))
		send(t, stream, closeStdinReq)
		send(t, stream, stdinReq("dropped\n"))
		r := collect(t, stream, nil)
		if got, want := string(r.stdout), "abc\r\nabc\r\n"; got != want {
			t.Errorf("stdout = %q, want %q (echo, then cat's copy)", got, want)
		}
		if r.result.GetExitCode() != 0 {
			t.Errorf("exit code = %d, want 0", r.result.GetExitCode())
		}
	})
	t.Run("close_stdin ends input mid-line", func(t *testing.T) {
		// `printf 'abc' | berth exec -t -i SB -- cat`: one EOT after
		// "abc" only hands cat the partial line; the exec must still end.
		for i, input := range []string{"abc", "abc\nde"} {
			spec := withTTY(argv("cat"), 24, 80)
			spec.Stdin = true
			stream := a.startExec(t, ctx, execID(t)+strconv.Itoa(i), spec)
			send(t, stream, stdinReq(input))
			send(t, stream, closeStdinReq)
			r := collect(t, stream, nil)
			last := input[strings.LastIndexByte(input, 'c')+1:] // "" or "\nde"
			if got := string(r.stdout); strings.Count(got, "abc") != 2 || (last != "" && strings.Count(got, "de") != 2) {
				t.Errorf("input %q: stdout = %q, want the terminal's echo and cat's copy of every byte", input, got)
			}
			if r.result.GetExitCode() != 0 {
				t.Errorf("input %q: exit code = %d, want 0", input, r.result.GetExitCode())
			}
		}
	})
	t.Run("SIGWINCH reaches the foreground group", func(t *testing.T) {
		spec := withTTY(shell(`trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.01; done`), 24, 80)
		stream := a.startExec(t, ctx, execID(t), spec)
		r := &execRun{}
		recvUntil(t, stream, r, "ready\r\n")
		send(t, stream, resizeReq(50, 100))
		collect(t, stream, r)
		if got, want := string(r.stdout), "ready\r\n50 100\r\n"; got != want {
			t.Errorf("stdout = %q, want %q", got, want)
		}
	})
	t.Run("signal", func(t *testing.T) {
		stream := a.startExec(t, ctx, execID(t), withTTY(shell(`echo ready; exec sleep 30`), 24, 80))
		r := &execRun{}
		recvUntil(t, stream, r, "ready\r\n")
		send(t, stream, &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: "TERM"}}})
		collect(t, stream, r)
		if r.result.GetExitCode() != 143 || r.result.GetSignal() != "SIGTERM" {
			t.Errorf("result = %v, want exit 143 by SIGTERM", r.result)
		}
	})
}

// TestTTYBackgroundHolder ends a tty exec whose background child ignores
// the hangup and keeps the terminal open: completion is the process's exit.
func TestTTYBackgroundHolder(t *testing.T) {
	a := startAgent(t, "--drain-grace", "200ms")
	start := time.Now()
	r := a.run(t, execID(t), withTTY(shell(`trap '' HUP; sleep 5 & echo $!`), 24, 80))
	if elapsed := time.Since(start); elapsed >= 4*time.Second {
		t.Errorf("exec took %v: it waited for the child holding the terminal", elapsed)
	}
	if _, err := strconv.Atoi(strings.TrimSpace(string(r.stdout))); err != nil || r.result.GetExitCode() != 0 {
		t.Errorf("stdout %q exit %d, want the child's pid and 0", r.stdout, r.result.GetExitCode())
	}
}

func TestTTYErrors(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		size  *berthv1.TtySize
		field string
	}{
		{&berthv1.TtySize{Rows: 0, Cols: 80}, "process.tty.rows"},
		{&berthv1.TtySize{Rows: 24, Cols: 0}, "process.tty.cols"},
		{&berthv1.TtySize{Rows: 24, Cols: 65536}, "process.tty.cols"},
	} {
		spec := argv("true")
		spec.Tty = tc.size
		wantInvalid(t, a.startErr(t, execID(t), spec), tc.field)
	}

	// Resizing an exec without a terminal, or to a bad size, fails the
	// stream; the process runs on.
	stream := a.startExec(t, ctx, "no-tty", shell("exec sleep 30"))
	send(t, stream, resizeReq(10, 10))
	wantInvalid(t, recvErr(t, stream), "resize")
	stream = a.startExec(t, ctx, "tty", withTTY(shell("exec sleep 30"), 24, 80))
	send(t, stream, resizeReq(0, 10))
	wantInvalid(t, recvErr(t, stream), "resize.rows")
	killExec(t, a, "no-tty")
	killExec(t, a, "tty")
}

// TestTTYTimeoutKillsEveryGroup: a shell with job control on a terminal
// puts a background job in a process group of its own; a timeout must end
// it too — every process group of the terminal's session — not only the
// shell's group.
func TestTTYTimeoutKillsEveryGroup(t *testing.T) {
	a := startAgent(t, "--kill-grace", "300ms")
	spec := withTTY(shell(`set -m; sleep 100 & echo "job $!"; wait`), 24, 80)
	spec.Timeout = durationpb.New(time.Second)
	r := a.run(t, execID(t), spec)
	if !r.result.GetTimedOut() {
		t.Errorf("result = %v, want timed out", r.result)
	}
	m := regexp.MustCompile(`job ([0-9]+)`).FindStringSubmatch(string(r.stdout))
	if m == nil {
		t.Fatalf("stdout = %q, want the job's pid", r.stdout)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("kill(%d, 0) after the timed-out exec's result = %v, want ESRCH: the job in its own process group survived", pid, err)
	}
}
