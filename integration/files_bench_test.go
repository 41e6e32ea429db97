package integration

import (
	"context"
	"testing"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// BenchmarkFileStat measures one Stat through the public API in a warm
// sandbox: the latency floor of a file request, including the agent's
// Info round trip within the connect budget (see reach).
func BenchmarkFileStat(b *testing.B) {
	if env.skip != "" {
		b.Skip("integration environment unavailable: " + env.skip)
	}
	ctx := context.Background()
	resp, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		b.Fatal(err)
	}
	id := resp.GetSandbox().GetId()
	defer env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		if _, err := c.Stat(ctx, id, "/workspace"); err != nil {
			b.Fatal(err)
		}
	}
}
