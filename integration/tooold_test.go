package integration

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// olderAgentVersion is the version linked into the older agent of
// TestAgentTooOld.
const olderAgentVersion = "v0.0.0-older-agent"

// TestAgentTooOld runs sandboxes with a real agent built without newer
// methods (build tag berth_older_agent: no WriteStdin, ResizeExec,
// WatchFiles): berthd's calls of them — unary and stream — fail
// FAILED_PRECONDITION AGENT_TOO_OLD naming the agent's method and version,
// not INTERNAL; what the agent has still works.
func TestAgentTooOld(t *testing.T) {
	need(t)
	bin, err := agentbin.BuildTagged(t.TempDir(), "-X github.com/berth-sandbox/berth/internal/version.Version="+olderAgentVersion, "berth_older_agent")
	if err != nil {
		t.Fatal(err)
	}
	e := newInProcessEnvWith(t, "tooold", server.Config{}, func(c *runtime.Config) { c.AgentBinary = bin }, nil)
	sb := newSandboxOn(t, e.sandboxes, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	run, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "old"}}})
	if err != nil || string(run.GetStdout()) != "old\n" {
		t.Fatalf("Run on the older agent: %q, %v; want old", run.GetStdout(), err)
	}
	start, err := e.sandboxes.StartExec(ctx, &berthv1.StartExecRequest{SandboxId: sb, ExecId: "cat-old",
		Process: &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true, Tty: &berthv1.TtySize{Rows: 24, Cols: 80}}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := start.Recv(); err != nil {
		t.Fatal(err)
	}
	watch := func() error {
		s, err := e.sandboxes.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb, Path: "/tmp"})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		if err == io.EOF {
			t.Fatal("WatchFiles on the older agent ended OK")
		}
		return err
	}
	for _, tc := range []struct {
		call, agentMethod string
		do                func() error
	}{
		{"WriteExecStdin", "/berth.agent.v1.AgentService/WriteStdin", func() error {
			_, err := e.sandboxes.WriteExecStdin(ctx, &berthv1.WriteExecStdinRequest{SandboxId: sb, ExecId: "cat-old", Data: []byte("x")})
			return err
		}},
		{"ResizeExec", "/berth.agent.v1.AgentService/ResizeExec", func() error {
			_, err := e.sandboxes.ResizeExec(ctx, &berthv1.ResizeExecRequest{SandboxId: sb, ExecId: "cat-old", Rows: 30, Cols: 100})
			return err
		}},
		{"WatchFiles", "/berth.agent.v1.AgentService/WatchFiles", watch},
	} {
		err := tc.do()
		meta := rpcstatus.Metadata(err)
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonAgentTooOld ||
			meta["agent_method"] != tc.agentMethod || meta["agent_version"] != olderAgentVersion {
			t.Errorf("%s on an agent without %s: %v (metadata %v), want FAILED_PRECONDITION AGENT_TOO_OLD naming the method and version %s",
				tc.call, tc.agentMethod, err, meta, olderAgentVersion)
		}
	}
}
