package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// TestRunDirIsSmallTmpfs writes 64 MiB into the agent's socket directory
// from a root workload: it stops at the run directory's 64 KiB, in a tmpfs
// of its own, and nothing reaches the host's disk.
func TestRunDirIsSmallTmpfs(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	got := run(t, sb.GetId(), "sh", "-c", "dd if=/dev/zero of=/.berth-run/fill bs=1M count=64 2>&1; echo exit $?; ls -l /.berth-run/fill")
	out := string(got.GetStdout())
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "exit 0") || !strings.Contains(out, " 65536 ") {
		t.Errorf("dd of 64 MiB into /.berth-run: %q, want ENOSPC after 65536 bytes", out)
	}
	var st unix.Statfs_t
	dir := filepath.Dir(env.rt.SocketPath(sb.GetId()))
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC || uint64(st.Blocks)*uint64(st.Bsize) != 64<<10 {
		t.Errorf("host %s: file system type %#x of %d bytes, want a 64 KiB tmpfs", dir, st.Type, uint64(st.Blocks)*uint64(st.Bsize))
	}
}

// TestFakeAgentRefused has a root workload rename the agent's socket and
// serve its own agent (the real binary, with no secret, not PID 1) at the
// socket's path: a berthd that connects anew refuses it
// (SANDBOX_UNREACHABLE, AGENT_UNVERIFIED) and sends it nothing, while the
// berthd connected before keeps talking to the real agent.
func TestFakeAgentRefused(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := env.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fake := "mv /.berth-run/agent.sock /.berth-run/real.sock && exec /.berth-agent --socket /.berth-run/agent.sock"
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: sb.GetId(), ExecId: "fake-agent", Background: true, Process: &berthv1.ProcessSpec{ShellCommand: fake}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("start the fake agent: %v", err)
	}
	if !poll(10*time.Second, func() bool {
		got := run(t, sb.GetId(), "ls", "/.berth-run")
		return string(got.GetStdout()) == "agent.sock\nreal.sock\n"
	}) {
		t.Fatal("the fake agent did not listen within 10 s")
	}

	const budget = time.Second
	other := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1, ConnectBudget: budget}))
	_, err = other.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"touch", "/workspace/sent-to-fake"}})
	var ue *client.UnreachableError
	if !errors.As(err, &ue) || ue.Detail.GetCause() != berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_UNVERIFIED ||
		ue.Detail.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || !strings.Contains(ue.Message, "not the sandbox's init") {
		t.Fatalf("Run through a berthd that meets the fake agent: %v, want SANDBOX_UNREACHABLE AGENT_UNVERIFIED naming the listener", err)
	}
	// The berthd connected before the swap still reaches the real agent,
	// which never got the command.
	got := run(t, sb.GetId(), "sh", "-c", "ls /workspace; cat /proc/1/cmdline | tr '\\0' ' '")
	if out := string(got.GetStdout()); strings.Contains(out, "sent-to-fake") || !strings.HasPrefix(out, "/.berth-agent --socket /.berth-run/agent.sock") {
		t.Errorf("workspace and PID 1 = %q, want no sent-to-fake and the real agent as PID 1", out)
	}
}
