package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// forkBenchBytes is what the fork group's parent has written in
// /workspace before it is forked: 1 GiB (the figure), or
// BERTH_BENCH_FORK_BYTES.
var forkBenchBytes = func() int64 {
	if n, err := strconv.ParseInt(os.Getenv("BERTH_BENCH_FORK_BYTES"), 10, 64); err == nil && n > 0 {
		return n
	}
	return 1 << 30
}()

// forkLabel names forkBenchBytes in the table.
var forkLabel = fmt.Sprintf("%d MiB written", forkBenchBytes>>20)

// benchFork is BenchmarkSideBySide's fork group: ForkSandbox of 1 and of
// 10 children of a sandbox with forkBenchBytes of random data in
// /workspace (written out before the clock starts; the children's
// deletion is off the clock), timed to the answer (every child's agent
// answered), beside a cold CreateSandbox of the base image timed the same
// way and `cp -a --reflink=never` of a host directory holding the same
// data on the same btrfs (a full copy of the workspace, what a fork costs
// without copy-on-write; the copy is removed and the file system synced
// off the clock).
func benchFork(b *testing.B) {
	if env.snapshotter != "btrfs" {
		b.Fatalf("fork needs the btrfs snapshotter, have %q", env.snapshotter)
	}
	ctx := context.Background()
	req := &berthv1.CreateSandboxRequest{Image: env.image}
	if testDiskQuota() > 0 {
		// Every child inherits the quota, and 11 sandboxes' quotas must
		// fit the tests' disk budget: the data and a little room.
		req.Resources = &berthv1.Resources{DiskBytes: max(testDiskQuota(), uint64(forkBenchBytes)+64<<20)}
	}
	id := benchSandboxOf(b, req).GetId()
	r, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{
		ShellCommand: fmt.Sprintf("head -c %d /dev/urandom > /workspace/data.bin && sync", forkBenchBytes)}})
	if err != nil || r.GetResult().GetExitCode() != 0 {
		b.Fatalf("write /workspace/data.bin: %v %q", err, r.GetStderr())
	}

	fork := func(count uint32) func(*testing.B) sample {
		return func(b *testing.B) sample {
			start := time.Now()
			resp, err := env.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: count})
			d := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			defer b.StartTimer()
			if n := len(resp.GetSandboxes()); n != int(count) {
				b.Fatalf("ForkSandbox made %d children, want %d", n, count)
			}
			for _, sb := range resp.GetSandboxes() {
				if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
					b.Fatal(err)
				}
			}
			return sample{d: d}
		}
	}
	measure(b, "fork/berth-Fork-1", 0, fork(1))
	measure(b, "fork/berth-Fork-10", 0, fork(10))
	measure(b, "fork/berth-cold", 0, func(b *testing.B) sample {
		start := time.Now()
		resp, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		defer b.StartTimer()
		if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()}); err != nil {
			b.Fatal(err)
		}
		return sample{d: d}
	})

	dir, err := os.MkdirTemp(hostBenchDir(), "bench-fork-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sh := func(script string, args ...string) { hostShell(b, script, args...) }
	ws, cp := filepath.Join(dir, "workspace"), filepath.Join(dir, "copy")
	sh(`mkdir "$1" && head -c "$2" /dev/urandom > "$1/data.bin" && sync -f "$1"`, ws, strconv.FormatInt(forkBenchBytes, 10))
	measure(b, "fork/host-cp", 0, func(b *testing.B) sample {
		start := time.Now()
		sh(`cp -a --reflink=never "$1" "$2"`, ws, cp)
		d := time.Since(start)
		b.StopTimer()
		defer b.StartTimer()
		if err := os.RemoveAll(cp); err != nil {
			b.Fatal(err)
		}
		writeOut(b, dir, "")
		return sample{d: d}
	})
}
