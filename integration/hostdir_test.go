package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// The host directory bind-mounted at /.berth-run is writable by the
// sandbox's root (the default workload user), so nothing berthd or
// containerd does on the host may follow what the sandbox put there.

// TestAgentLogNotRedirectable has the sandbox replace what used to be its
// agent log in /.berth-run with a symlink to a host file, then has its task
// restarted: containerd's shim (host root) opens the log of the new task,
// and must not write the host file.
func TestAgentLogNotRedirectable(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, nil)
	id, before := sb.GetId(), sb.GetRuntime()
	victim := filepath.Join(env.dir, shortID("victim"))
	r := run(t, id, "sh", "-c", "ln -sf "+victim+" /.berth-run/agent.log && for f in /.berth-run/*; do ln -sf "+victim+" \"$f.log\"; done")
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("ln in the sandbox: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
	}
	signalAgent(t, before.GetTaskPid(), 9)
	waitRuntime(t, c, id, before.GetAgentBootId())
	if b, err := os.ReadFile(victim); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host file %s after the restart: %q, %v; want it never created", victim, b, err)
	}
	if b, err := os.ReadFile(env.rt.LogPath(id)); err != nil || strings.Count(string(b), "berth-agent serving") < 2 {
		t.Errorf("agent log %s = %q, %v; want both agents' start lines", env.rt.LogPath(id), b, err)
	}
}

// TestAgentSocketNotRedirectable has sandbox a replace its agent socket
// with a symlink to sandbox b's socket on the host. A berthd that dials a
// afresh (after its own restart, or when an idle connection is redialed)
// must not end up talking to b's agent: a command for a must never run in
// b.
func TestAgentSocketNotRedirectable(t *testing.T) {
	need(t)
	a, b := newSandbox(t, nil), newSandbox(t, nil)
	bsock := env.rt.SocketPath(b.GetId())
	r := run(t, a.GetId(), "sh", "-c", "ln -s "+bsock+" /.berth-run/x && mv -f /.berth-run/x /.berth-run/agent.sock")
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("ln in the sandbox: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
	}
	// A fresh berthd has no connection to a yet.
	fresh := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1, ConnectBudget: 500 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := fresh.Run(ctx, a.GetId(), &berthv1.ProcessSpec{Argv: []string{"hostname"}})
	if got := strings.TrimSpace(string(resp.GetStdout())); got == b.GetId() {
		t.Fatalf("a command for sandbox %s ran in sandbox %s", a.GetId(), b.GetId())
	}
	var unreachable *client.UnreachableError
	if !errors.As(err, &unreachable) || unreachable.Detail.GetCause() != berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING {
		t.Errorf("Run in a sandbox whose socket is a symlink = %v, %v; want SANDBOX_UNREACHABLE SOCKET_MISSING", resp, err)
	}
	if _, err := fresh.Stat(ctx, a.GetId(), "/"); !errors.As(err, &unreachable) {
		t.Errorf("Stat in a sandbox whose socket is a symlink = %v; want SANDBOX_UNREACHABLE", err)
	}
	// Sandbox b itself is untouched.
	if got := strings.TrimSpace(string(run(t, b.GetId(), "hostname").GetStdout())); got != b.GetId() {
		t.Errorf("hostname in %s = %q", b.GetId(), got)
	}
}
