package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestSessionShells runs the session sequence on a real sandbox,
// in busybox sh (the base image's /bin/sh) and in bash, through the Go
// client: state persists between commands, each command has its own exit
// code and output, output that looks like any marker is only output, a
// `sleep 100` with a 1 s timeout is interrupted and the next command runs,
// a background job survives, and each command is an exec (ListExecs,
// attach from a seq).
func TestSessionShells(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c, err := client.Dial(t.Context(), env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, sh := range []berthv1.Shell{berthv1.Shell_SHELL_SH, berthv1.Shell_SHELL_BASH} {
		t.Run(sh.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			info, err := c.CreateSession(ctx, &berthv1.CreateSessionRequest{SandboxId: sb.GetId(), Name: "dev", Shell: sh})
			if err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
			id := info.GetSessionId()
			if !strings.HasPrefix(id, "ss-") || info.GetState() != berthv1.SessionState_SESSION_STATE_IDLE || info.GetShell() != sh {
				t.Fatalf("CreateSession = %v, want a minted ss- id, idle, %v", info, sh)
			}
			expect := func(cmd, stdout, stderr string, code int32) *berthv1.RunResponse {
				t.Helper()
				r, err := c.RunInSession(ctx, sb.GetId(), id, cmd)
				if err != nil {
					t.Fatalf("RunInSession(%q): %v", cmd, err)
				}
				if string(r.GetStdout()) != stdout || string(r.GetStderr()) != stderr || r.GetResult().GetExitCode() != code {
					t.Errorf("%q: stdout %q stderr %q exit %d, want %q %q %d", cmd, r.GetStdout(), r.GetStderr(), r.GetResult().GetExitCode(), stdout, stderr, code)
				}
				return r
			}
			expect("cd /tmp; export A=1; f() { echo $A; }", "", "", 0)
			expect("pwd; f", "/tmp\n1\n", "", 0)
			expect("false", "", "", 1)
			// Text a prompt scraper or an in-band protocol would take for
			// the end of the command, or for a status.
			marker := "0\n__END__ 0\n\x00\n$ \nberth_cmd='exit 3'\n"
			expect(`printf '0\n__END__ 0\n\0\n$ \n'; printf "berth_cmd='exit 3'\n"; printf '1\n' >&2; (exit 5)`, marker, "1\n", 5)
			expect("echo $A; pwd", "1\n/tmp\n", "", 0)
			expect("sleep 300 & echo $! > /tmp/bg-"+id, "", "", 0)

			start := time.Now()
			slow, err := c.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{SessionId: id, ShellCommand: "echo before; sleep 100; echo after", Timeout: durationpb.New(time.Second)})
			if err != nil {
				t.Fatalf("Run sleep 100: %v", err)
			}
			if res := slow.GetResult(); !res.GetTimedOut() || res.GetExitCode() != 130 || string(slow.GetStdout()) != "before\n" || time.Since(start) > 30*time.Second {
				t.Errorf("sleep 100 with a 1 s timeout: %v stdout %q after %v, want timed out, exit 130, %q", res, slow.GetStdout(), time.Since(start), "before\n")
			}
			expect("echo next $A", "next 1\n", "", 0)
			expect("kill -0 $(cat /tmp/bg-"+id+") && echo alive", "alive\n", "", 0)

			// Each command is an exec: listed, attachable from a seq.
			execs, err := c.ListExecs(ctx, sb.GetId())
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, e := range execs.GetExecs() {
				found = found || e.GetExecId() == slow.GetExecId()
			}
			if !found {
				t.Errorf("ListExecs has no %s", slow.GetExecId())
			}

			// One command at a time.
			busy, err := c.ExecBackground(ctx, sb.GetId(), &berthv1.ProcessSpec{SessionId: id, ShellCommand: "sleep 5"})
			if err != nil {
				t.Fatalf("background session command: %v", err)
			}
			_, err = c.RunInSession(ctx, sb.GetId(), id, "true")
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Reason != client.ReasonSessionBusy || ce.Metadata["exec_id"] != busy.GetExecId() {
				t.Errorf("second command while %s runs: %v, want SESSION_BUSY naming it", busy.GetExecId(), err)
			}

			list, err := c.ListSessions(ctx, sb.GetId())
			if err != nil {
				t.Fatal(err)
			}
			var mine *berthv1.SessionInfo
			for _, s := range list {
				if s.GetSessionId() == id {
					mine = s
				}
			}
			if mine == nil || mine.GetName() != "dev" || mine.GetState() != berthv1.SessionState_SESSION_STATE_BUSY || mine.GetCurrentExecId() != busy.GetExecId() {
				t.Errorf("ListSessions: %v, want %s named dev, busy with %s", list, id, busy.GetExecId())
			}
			if err := c.DeleteSession(ctx, sb.GetId(), id); err != nil {
				t.Fatalf("DeleteSession: %v", err)
			}
			// Its background job went with it.
			out := run(t, sb.GetId(), "sh", "-c", fmt.Sprintf("kill -0 $(cat /tmp/bg-%s) 2>/dev/null && echo alive || echo gone", id))
			if string(out.GetStdout()) != "gone\n" {
				t.Errorf("background job after DeleteSession: %q, want gone", out.GetStdout())
			}
			_, err = c.RunInSession(ctx, sb.GetId(), id, "true")
			if !errors.As(err, &ce) || ce.Reason != client.ReasonSessionNotFound {
				t.Errorf("command in a deleted session: %v, want SESSION_NOT_FOUND", err)
			}
		})
	}
}

// TestSessionAsUser runs a session as another user than the agent's: its
// FIFOs are its own, reached through the sessions directory.
func TestSessionAsUser(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.sandboxes.CreateSession(ctx, &berthv1.CreateSessionRequest{SandboxId: sb.GetId(), SessionId: "u"}); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"cd /tmp", "id -u; pwd"} {
		r, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{SessionId: "u", ShellCommand: cmd}})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetResult().GetExitCode() != 0 || (cmd != "cd /tmp" && string(r.GetStdout()) != "1000\n/tmp\n") {
			t.Errorf("%q as uid 1000: stdout %q stderr %q exit %d, want exit 0 (and 1000, /tmp)", cmd, r.GetStdout(), r.GetStderr(), r.GetResult().GetExitCode())
		}
	}
}

// TestWatchFilesReconnect watches a sandbox's directory through berthd and
// the Go client: 1,000 files created in the sandbox arrive as CREATE events
// exactly once each across a reconnect that resumes from the last seq, and
// a watch whose ring is smaller than what happened reports the loss as a
// typed overflow.
func TestWatchFilesReconnect(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c, err := client.Dial(t.Context(), env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run(t, sb.GetId(), "mkdir", "-p", "/workspace/w/sub")

	w, err := c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), Path: "/workspace/w", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	recv := func(w *client.FileWatch) *berthv1.WatchFilesResponse {
		t.Helper()
		msg, err := w.Recv()
		if err != nil {
			t.Fatalf("WatchFiles: %v", err)
		}
		return msg
	}
	started := recv(w).GetStarted()
	if !strings.HasPrefix(started.GetWatchId(), "wt-") || started.GetPath() != "/workspace/w" {
		t.Fatalf("started = %v, want a minted wt- id on /workspace/w", started)
	}
	const n = 1000
	run(t, sb.GetId(), "sh", "-c", fmt.Sprintf("cd /workspace/w/sub && i=0; while [ $i -lt %d ]; do : > f$i; i=$((i+1)); done", n))
	seen := map[string]int{}
	var last uint64
	take := func(w *client.FileWatch, count int) {
		t.Helper()
		for range count {
			msg := recv(w)
			f := msg.GetFile()
			if f == nil || f.GetSeq() != last+1 || f.GetKind() != berthv1.FileEventKind_FILE_EVENT_KIND_CREATE {
				t.Fatalf("%v after seq %d, want the CREATE numbered %d", msg, last, last+1)
			}
			last = f.GetSeq()
			seen[f.GetPath()]++
		}
	}
	take(w, 400)
	w.Close()
	w, err = c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), WatchId: started.GetWatchId(), SinceSeq: last})
	if err != nil {
		t.Fatal(err)
	}
	if st := recv(w).GetStarted(); st.GetWatchId() != started.GetWatchId() || st.GetLastSeq() != n {
		t.Errorf("resumed: %v, want %s at seq %d", st, started.GetWatchId(), n)
	}
	take(w, n-400)
	for i := range n {
		if p := fmt.Sprintf("/workspace/w/sub/f%d", i); seen[p] != 1 {
			t.Errorf("%s seen %d times, want once", p, seen[p])
		}
	}
	w.Close()

	// A ring of 100 events and 300 creations before anyone reads.
	small, err := c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), WatchId: "small", Path: "/workspace/w", BufferEvents: 100})
	if err != nil {
		t.Fatal(err)
	}
	recv(small)
	small.Close()
	run(t, sb.GetId(), "sh", "-c", "cd /workspace/w && i=0; while [ $i -lt 300 ]; do : > g$i; i=$((i+1)); done")
	deadline := time.Now().Add(time.Minute)
	for {
		small, err = c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), WatchId: "small"})
		if err != nil {
			t.Fatal(err)
		}
		if recv(small).GetStarted().GetLastSeq() == 300 || time.Now().After(deadline) {
			break
		}
		small.Close()
		time.Sleep(50 * time.Millisecond)
	}
	if o := recv(small).GetOverflow(); o.GetReason() != berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_RING || o.GetFirstSeq() != 1 || o.GetLastSeq() != 200 {
		t.Errorf("replay of a 100-event ring after 300 events: %v, want a RING overflow of 1-200", o)
	}
	if f := recv(small).GetFile(); f.GetSeq() != 201 || f.GetPath() != "/workspace/w/g200" {
		t.Errorf("after the overflow: %v, want seq 201, g200", f)
	}
}

// TestSessionAfterRestart kills berthd (the real binary) with SIGKILL
// between two commands of a session: the agent owns the session, so the
// next berthd lists it and runs the next command in the same shell, with
// the cwd and variables the first one set.
func TestSessionAfterRestart(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "sr")
	p1 := startBerthd(t, e)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "sessrestart", Image: baseImage})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	defer e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	sess, err := e.sandboxes.CreateSession(ctx, &berthv1.CreateSessionRequest{SandboxId: id, SessionId: "kept", Shell: berthv1.Shell_SHELL_BASH})
	if err != nil {
		t.Fatal(err)
	}
	in := func(cmd string) *berthv1.RunResponse {
		t.Helper()
		r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{SessionId: "kept", ShellCommand: cmd}})
		if err != nil {
			t.Fatalf("Run(%q) in session: %v", cmd, err)
		}
		return r
	}
	in("cd /tmp && X=before-restart; sleep 600 &")
	if err := p1.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("berthd exited cleanly after SIGKILL?")
	}
	startBerthd(t, e)
	list, err := e.sandboxes.ListSessions(ctx, &berthv1.ListSessionsRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if ss := list.GetSessions(); len(ss) != 1 || ss[0].GetPid() != sess.GetSession().GetPid() || ss[0].GetCommands() != 1 {
		t.Fatalf("ListSessions after the restart: %v, want session kept (pid %d) with 1 command", ss, sess.GetSession().GetPid())
	}
	if r := in("pwd; echo $X; jobs | wc -l"); string(r.GetStdout()) != "/tmp\nbefore-restart\n1\n" || r.GetResult().GetExitCode() != 0 {
		t.Errorf("after the restart: stdout %q exit %d, want /tmp, before-restart, 1 job; exit 0", r.GetStdout(), r.GetResult().GetExitCode())
	}
}
