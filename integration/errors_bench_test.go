package integration

import (
	"context"
	"testing"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
)

// BenchmarkRun runs `true` in a sandbox through berthd's Run: containerd's
// task state, the agent's Info within the connect budget (the reachability
// check), capacity admission and the exec itself.
//
//	go test -run '^$' -bench . -benchtime 3s ./integration/
func BenchmarkRun(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip)
	}
	sb := benchSandbox(b)
	ctx := context.Background()
	req := &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"true"}}}
	for b.Loop() {
		if _, err := env.sandboxes.Run(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAgentInfo is the reachability check alone: one Info call to a
// sandbox's agent over a kept connection.
func BenchmarkAgentInfo(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip)
	}
	sb := benchSandbox(b)
	pool := agentconn.NewPool(nil)
	defer pool.Close()
	agent, err := pool.Get(env.rt.SocketPath(sb.GetId()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		if _, err := agent.Info(ctx, &agentv1.InfoRequest{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTaskState is the other part of the check: the sandbox's record
// and task state from containerd.
func BenchmarkTaskState(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip)
	}
	sb := benchSandbox(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := env.rt.Get(ctx, sb.GetId()); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSandbox(b *testing.B) *berthv1.Sandbox {
	b.Helper()
	return benchSandboxOf(b, &berthv1.CreateSandboxRequest{Image: env.image})
}

// benchSandboxOf creates the sandbox req asks for and deletes it when the
// benchmark ends.
func benchSandboxOf(b *testing.B, req *berthv1.CreateSandboxRequest) *berthv1.Sandbox {
	b.Helper()
	resp, err := env.sandboxes.CreateSandbox(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
	})
	return resp.GetSandbox()
}
