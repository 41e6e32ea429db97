package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestCLIDockerHabits runs the real berth binary through the commands and
// flags docker users reach for (issue 25): --version, inspect, logs (with
// and without -f, --since), sandbox ls -q --filter, stats, run --rm and
// sandbox rm -f.
func TestCLIDockerHabits(t *testing.T) {
	need(t)
	tag := xid(t)
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Labels: map[string]string{"cli-docker": tag}}).GetId()
	ok := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, code := berthCLI(t, nil, args...)
		if code != 0 {
			t.Fatalf("berth %q: exit %d, stderr %q", args, code, errOut)
		}
		return out, errOut
	}

	if out, _ := ok("--version"); !strings.HasPrefix(out, "berth ") {
		t.Errorf("berth --version = %q, want berth VERSION ...", out)
	}

	out, _ := ok("inspect", id)
	var got []struct{ ID, Owner string }
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].ID != id || got[0].Owner == "" {
		t.Errorf("berth inspect %s = %q (%v), want a JSON array of that sandbox with its owner", id, out, err)
	}
	if out, errOut, code := berthCLI(t, nil, "inspect", id, "no-such-sandbox"); code != 125 || !strings.Contains(out, id) || !strings.Contains(errOut, "SANDBOX_NOT_FOUND") {
		t.Errorf("berth inspect %s no-such-sandbox: exit %d, stdout %q, stderr %q; want 125, the one found printed, SANDBOX_NOT_FOUND", id, code, out, errOut)
	}

	// logs: seq 1 "one" (stdout), 2 "two" (stderr), then 3 "three" once
	// the command is let go (the file appears). "two" waits for /tmp/a,
	// written once "one" has its seq: stdout and stderr are two pipes,
	// read concurrently, so without it "two" could take seq 1.
	out, _ = ok("exec", "-d", id, "--", "sh", "-c", "echo one; while [ ! -e /tmp/a ]; do sleep 0.1; done; echo two >&2; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo three")
	execID := strings.TrimSpace(out)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !poll(30*time.Second, func() bool { return listExecs(t, env.sandboxes, id)[execID].GetLastSeq() >= 1 }) {
		t.Fatalf("exec %s: no output event within 30 s", execID)
	}
	if _, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"touch", "/tmp/a"}}}); err != nil {
		t.Fatalf("touch /tmp/a: %v", err)
	}
	if !poll(30*time.Second, func() bool { return listExecs(t, env.sandboxes, id)[execID].GetLastSeq() >= 2 }) {
		t.Fatalf("exec %s: no two output events within 30 s", execID)
	}
	if out, errOut := ok("logs", id, execID); out != "one\n" || errOut != "two\n" {
		t.Errorf("berth logs of a running exec: stdout %q stderr %q, want one, two (and berth returning while it runs)", out, errOut)
	}
	if out, errOut := ok("logs", "--since", "1", id, execID); out != "" || errOut != "two\n" {
		t.Errorf("berth logs --since 1: stdout %q stderr %q, want only two", out, errOut)
	}
	go func() {
		time.Sleep(time.Second)
		env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"touch", "/tmp/go"}}})
	}()
	if out, errOut := ok("logs", "-f", id, execID); out != "one\nthree\n" || errOut != "two\n" {
		t.Errorf("berth logs -f: stdout %q stderr %q, want one three, two", out, errOut)
	}
	if out, _ := ok("logs", "--since", "2", id, execID); out != "three\n" {
		t.Errorf("berth logs --since 2 of an ended exec: %q, want three", out)
	}
	if _, errOut, code := berthCLI(t, nil, "logs", id, "no-such-exec"); code != 125 || !strings.Contains(errOut, "no-such-exec") {
		t.Errorf("berth logs of an unknown exec: exit %d stderr %q, want 125 naming it", code, errOut)
	}

	if out, _ := ok("sandbox", "ls", "-q", "--filter", "label=cli-docker="+tag, "--filter", "state=running"); out != id+"\n" {
		t.Errorf("sandbox ls -q --filter label=cli-docker=%s --filter state=running = %q, want %s", tag, out, id)
	}
	if out, _ := ok("sandbox", "ls", "-q", "--filter", "label=cli-docker="+tag, "--filter", "state=paused"); out != "" {
		t.Errorf("sandbox ls -q --filter state=paused = %q, want nothing", out)
	}
	if out, _ := ok("sandbox", "ls", "--filter", "label=cli-docker="+tag); !strings.Contains(out, "OWNER") {
		t.Errorf("sandbox ls has no OWNER column: %q", out)
	}

	if out, _ := ok("stats", "--interval", "200ms", id); !strings.Contains(out, "CPU %") || !strings.HasPrefix(strings.Split(out, "\n")[1], id+" ") {
		t.Errorf("berth stats %s = %q, want a table with a row of it", id, out)
	}

	if out, _ := ok("run", "--rm", "--image", env.image, "--", "echo", "hi"); out != "hi\n" {
		t.Errorf("berth run --rm: %q, want hi", out)
	}

	if _, errOut, code := berthCLI(t, nil, "sandbox", "rm", "no-such-sandbox"); code != 125 || !strings.Contains(errOut, "SANDBOX_NOT_FOUND") {
		t.Errorf("sandbox rm of a missing sandbox: exit %d stderr %q, want 125 SANDBOX_NOT_FOUND", code, errOut)
	}
	if out, _ := ok("sandbox", "rm", "-f", id, "no-such-sandbox"); out != id+"\nno-such-sandbox\n" {
		t.Errorf("sandbox rm -f: %q, want both ids", out)
	}
	if _, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("GetSandbox after rm -f = %v, want NOT_FOUND", err)
	}
}
