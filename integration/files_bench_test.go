package integration

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// BenchmarkFiles128MiB measures WriteFile and ReadFile of a 128 MiB file
// through the public API (client -> berthd -> agent in a real sandbox),
// next to a plain local cp(1) of the same file on the host, with and
// without an fsync (WriteFile answers only after fsync). MB/s is the
// figure to compare; see integration/BENCHMARKS.md.
func BenchmarkFiles128MiB(b *testing.B) {
	if env.skip != "" {
		b.Skip("integration environment unavailable: " + env.skip)
	}
	const size = 128 << 20
	data := randomData(size)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
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
	const path = "/workspace/bench.bin"

	b.Run("WriteFile", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := c.WriteFile(ctx, id, path, bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReadFile", func(b *testing.B) {
		if _, err := c.WriteFile(ctx, id, path, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(size)
		for b.Loop() {
			if _, err := c.ReadFile(ctx, id, path, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})

	dir := b.TempDir()
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	dst := filepath.Join(dir, "dst.bin")
	b.Run("LocalCp", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v: %s", err, out)
			}
		}
	})
	b.Run("LocalCpFsync", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if out, err := exec.Command("sh", "-c", `cp "$1" "$2" && sync "$2"`, "sh", src, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp && sync: %v: %s", err, out)
			}
		}
	})
}

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
