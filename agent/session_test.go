package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// inSession returns a ProcessSpec running cmd in session id.
func inSession(id, cmd string) *berthv1.ProcessSpec {
	return &berthv1.ProcessSpec{SessionId: id, ShellCommand: cmd}
}

// TestSession runs the sequence in a session of the host's sh
// (dash on Debian) and of bash: state persists between commands, each has
// its own exit code and output, marker-like output is output, a timed-out
// command is interrupted and the session runs on, a background job
// survives the commands after it.
func TestSession(t *testing.T) {
	for _, sh := range []berthv1.Shell{berthv1.Shell_SHELL_SH, berthv1.Shell_SHELL_BASH} {
		t.Run(sh.String(), func(t *testing.T) {
			a := startAgent(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			created, err := a.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Owner: "alice",
				Session: &berthv1.CreateSessionRequest{SessionId: "s1", Name: "main", Shell: sh}})
			if err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
			if got := created.GetSession(); got.GetState() != berthv1.SessionState_SESSION_STATE_IDLE || got.GetOwner() != "alice" || got.GetPid() == 0 {
				t.Fatalf("CreateSession = %v, want idle, owner alice, a pid", got)
			}
			n := 0
			run := func(cmd string) *execRun {
				n++
				return a.run(t, fmt.Sprintf("c%d", n), inSession("s1", cmd))
			}
			expect := func(cmd, stdout, stderr string, code int32) {
				t.Helper()
				r := run(cmd)
				if string(r.stdout) != stdout || string(r.stderr) != stderr || r.result.GetExitCode() != code {
					t.Errorf("%q: stdout %q stderr %q exit %d, want %q %q %d", cmd, r.stdout, r.stderr, r.result.GetExitCode(), stdout, stderr, code)
				}
			}
			expect("cd /tmp; export A=1; f() { echo $A; }", "", "", 0)
			expect("pwd; f", "/tmp\n1\n", "", 0)
			expect("false", "", "", 1)
			expect("printf '0\\n'; echo 'it''s' >&2; exit_marker=1; echo \"$((exit_marker+1))\"", "0\n2\n", "its\n", 0)
			expect("sleep 30 & echo $! > /tmp/bg.$$", "", "", 0)
			expect("for i in 1 2 3; do echo line$i; done\necho 'two\nlines'", "line1\nline2\nline3\ntwo\nlines\n", "", 0)
			// A syntax error is the command's, not the session's end.
			if r := run("if then"); r.result.GetExitCode() != 2 || len(r.stderr) == 0 {
				t.Errorf("syntax error: exit %d stderr %q, want 2 and a message", r.result.GetExitCode(), r.stderr)
			}
			expect("echo $A", "1\n", "", 0)

			start := time.Now()
			r := a.run(t, "slow", &berthv1.ProcessSpec{SessionId: "s1", ShellCommand: "echo before; sleep 100; echo after", Timeout: durationpb.New(time.Second)})
			if !r.result.GetTimedOut() || string(r.stdout) != "before\n" || time.Since(start) > 20*time.Second {
				t.Errorf("sleep 100 with 1s timeout: timed_out %v stdout %q after %v, want timed out, %q", r.result.GetTimedOut(), r.stdout, time.Since(start), "before\n")
			}
			expect("echo next $A", "next 1\n", "", 0)
			// The background job of an earlier command still runs.
			expect("kill -0 $(cat /tmp/bg.$$) && echo alive; kill $(cat /tmp/bg.$$); rm /tmp/bg.$$", "alive\n", "", 0)

			list, err := a.client.ListSessions(ctx, &agentv1.ListSessionsRequest{})
			if err != nil || len(list.GetSessions()) != 1 || list.GetSessions()[0].GetCommands() != uint64(n+1) {
				t.Fatalf("ListSessions = %v, %v; want s1 with %d commands", list, err, n+1)
			}
			// Refused: fields the session decides, an unknown session.
			if err := a.startErr(t, "bad", &berthv1.ProcessSpec{SessionId: "s1", ShellCommand: "true", Cwd: "/"}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "process.cwd") {
				t.Errorf("cwd with session_id: %v, want INVALID_ARGUMENT naming process.cwd", err)
			}
			if err := a.startErr(t, "bad2", inSession("nope", "true")); status.Code(err) != codes.NotFound {
				t.Errorf("unknown session: %v, want NOT_FOUND", err)
			}
			// exit ends the session with the command.
			expect("exit 7", "", "", 7)
			if err := a.startErr(t, "late", inSession("s1", "true")); status.Code(err) != codes.FailedPrecondition {
				t.Errorf("command after exit: %v, want FAILED_PRECONDITION", err)
			}
			if _, err := a.client.DeleteSession(ctx, &agentv1.DeleteSessionRequest{SessionId: "s1"}); err != nil {
				t.Fatalf("DeleteSession: %v", err)
			}
			if _, err := a.client.DeleteSession(ctx, &agentv1.DeleteSessionRequest{SessionId: "s1"}); status.Code(err) != codes.NotFound {
				t.Errorf("second DeleteSession: %v, want NOT_FOUND", err)
			}
		})
	}
}

// TestCreateSessionFieldNames: a bad cwd, env or user of CreateSession is
// refused naming the request's own field (cwd, env, user), as the caller
// wrote it, not process.cwd of the exec spec the agent checks it as.
func TestCreateSessionFieldNames(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name  string
		req   *berthv1.CreateSessionRequest
		code  codes.Code
		field string
	}{
		{"relative cwd", &berthv1.CreateSessionRequest{SessionId: "c1", Cwd: "tmp"}, codes.InvalidArgument, "cwd"},
		{"missing cwd", &berthv1.CreateSessionRequest{SessionId: "c2", Cwd: "/no/such/dir"}, codes.FailedPrecondition, "cwd"},
		{"env key with =", &berthv1.CreateSessionRequest{SessionId: "c3", Env: map[string]string{"A=B": "1"}}, codes.InvalidArgument, "env"},
	} {
		_, err := a.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Owner: "alice", Session: tt.req})
		st := status.Convert(err)
		if st.Code() != tt.code || !strings.HasPrefix(st.Message(), tt.field+":") || strings.Contains(st.Message(), "process.") {
			t.Errorf("%s: %v; want %v with a message starting %q and no process. field", tt.name, err, tt.code, tt.field+":")
			continue
		}
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				if d.GetMetadata()["field"] != tt.field {
					t.Errorf("%s: ErrorInfo field %q, want %q", tt.name, d.GetMetadata()["field"], tt.field)
				}
			case *errdetails.BadRequest:
				for _, v := range d.GetFieldViolations() {
					if v.GetField() != tt.field {
						t.Errorf("%s: BadRequest field %q, want %q", tt.name, v.GetField(), tt.field)
					}
				}
			}
		}
	}
}
