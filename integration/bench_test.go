package integration

import (
	"context"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// BenchmarkRunTrue measures one `true` through the whole path in a warm
// sandbox: client -> berthd (unix socket) -> agent (unix socket) -> fork,
// exec, wait4 -> result back. Results are in BENCHMARKS.md.
func BenchmarkRunTrue(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip)
	}
	ctx := context.Background()
	created, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		b.Fatal(err)
	}
	defer env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: created.GetSandbox().GetId()})
	req := &berthv1.RunRequest{SandboxId: created.GetSandbox().GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"true"}}}
	b.ResetTimer()
	for b.Loop() {
		resp, err := env.sandboxes.Run(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetResult().GetExitCode() != 0 {
			b.Fatalf("true exited %d", resp.GetResult().GetExitCode())
		}
	}
}
