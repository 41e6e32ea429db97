package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
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

	measure(b, "fork/berth-Fork-1", 0, forkSample(&berthv1.ForkSandboxRequest{SandboxId: id, Count: 1}))
	measure(b, "fork/berth-Fork-10", 0, forkSample(&berthv1.ForkSandboxRequest{SandboxId: id, Count: 10}))
	measure(b, "fork/berth-cold", 0, coldSample(&berthv1.CreateSandboxRequest{Image: baseImage}))
	benchForkStandby(b, req)

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

// forkStandbyBench is the most standby members per parent of the fork
// group's standby berthd (server.Config.ForkStandby, --fork-standby):
// enough for its fork of 10.
const forkStandbyBench = 10

// benchForkStandby adds the fork group's rows for forks served by fork
// standby members: a berthd of its own keeping up to forkStandbyBench per
// parent (server.Config.ForkStandby), a parent of req with forkBenchBytes
// written as the group's, forked once off the clock (members are made
// after a fork, as many as it had children). Fork-1-standby: each sample
// waits, off the clock, until the member is ready, and fails unless the
// child is that member. Then a fork of 10 off the clock (the parent then
// wants 10), and Fork-10-standby: each sample waits until the 10 members
// are ready and fails unless every child is one of them.
func benchForkStandby(b *testing.B, req *berthv1.CreateSandboxRequest) {
	ctx := context.Background()
	e := newInProcessEnv(b, "benchstandby", server.Config{ForkStandby: forkStandbyBench, DefaultDiskBytes: testDiskQuota()})
	resp, err := e.sandboxes.CreateSandbox(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	id := resp.GetSandbox().GetId()
	b.Cleanup(func() { e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}) })
	r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{
		ShellCommand: fmt.Sprintf("head -c %d /dev/urandom > /workspace/data.bin && sync", forkBenchBytes)}})
	if err != nil || r.GetResult().GetExitCode() != 0 {
		b.Fatalf("write /workspace/data.bin: %v %q", err, r.GetStderr())
	}
	first, err := e.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: first.GetSandboxes()[0].GetId()}); err != nil {
		b.Fatal(err)
	}
	fork := forkSampleOn(e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1})
	measure(b, "fork/berth-Fork-1-standby", 0, func(b *testing.B) sample {
		b.StopTimer()
		waitStandby(b, e.svc, id, 1)
		member := standbyMembers(b, e.rt, id)
		b.StartTimer()
		s := fork(b)
		if s.child != member[0] {
			b.Fatalf("the fork made %s, not its standby member %v: this row times standby forks only", s.child, member)
		}
		return s.sample
	})

	ten, err := e.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: forkStandbyBench})
	if err != nil {
		b.Fatal(err)
	}
	for _, sb := range ten.GetSandboxes() {
		if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
			b.Fatal(err)
		}
	}
	fork10 := forkSampleOn(e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: id, Count: forkStandbyBench})
	measure(b, "fork/berth-Fork-10-standby", 0, func(b *testing.B) sample {
		b.StopTimer()
		waitStandby(b, e.svc, id, forkStandbyBench)
		members := standbyMembers(b, e.rt, id)
		b.StartTimer()
		s := fork10(b)
		if len(s.children) != forkStandbyBench || !sameSet(s.children, members) {
			b.Fatalf("the fork made %v, not its standby members %v: this row times standby forks only", s.children, members)
		}
		return s.sample
	})
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// forkSample times ForkSandbox of count children of sandbox id to its
// answer (every child's agent answered); their deletion is off the clock.
func forkSample(req *berthv1.ForkSandboxRequest) func(*testing.B) sample {
	fork := forkSampleOn(env.sandboxes, req)
	return func(b *testing.B) sample { return fork(b).sample }
}

// forkSampled is a forkSample and the ids of its children (child the
// first).
type forkSampled struct {
	sample
	child    string
	children []string
}

// forkSampleOn is forkSample on svc.
func forkSampleOn(svc berthv1.SandboxServiceClient, req *berthv1.ForkSandboxRequest) func(*testing.B) forkSampled {
	count := req.GetCount()
	return func(b *testing.B) forkSampled {
		ctx := context.Background()
		start := time.Now()
		resp, err := svc.ForkSandbox(ctx, req)
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		defer b.StartTimer()
		if n := len(resp.GetSandboxes()); n != int(count) {
			b.Fatalf("ForkSandbox made %d children, want %d", n, count)
		}
		var children []string
		for _, sb := range resp.GetSandboxes() {
			children = append(children, sb.GetId())
			if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
				b.Fatal(err)
			}
		}
		return forkSampled{sample: sample{d: d}, child: children[0], children: children}
	}
}

// coldSample times CreateSandbox of req to its answer; the deletion is
// off the clock.
func coldSample(req *berthv1.CreateSandboxRequest) func(*testing.B) sample {
	return func(b *testing.B) sample {
		ctx := context.Background()
		start := time.Now()
		resp, err := env.sandboxes.CreateSandbox(ctx, req)
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
	}
}

// forkGVisorMiB is what the fork-gvisor group's parent has written in
// /workspace: gVisor's gofer makes writing a GiB there slow, and the
// copy's cost does not depend on it (a btrfs snapshot).
const forkGVisorMiB = 64

// benchForkGVisor is BenchmarkSideBySide's fork-gvisor group: ForkSandbox
// of 1 child of a gVisor sandbox with forkGVisorMiB of random data in
// /workspace (files only: no memory fork yet), timed to the answer, beside
// a cold CreateSandbox of the base image under gVisor timed the same way.
func benchForkGVisor(b *testing.B) {
	if env.snapshotter != "btrfs" {
		b.Fatalf("fork needs the btrfs snapshotter, have %q", env.snapshotter)
	}
	id := benchSandboxOf(b, &berthv1.CreateSandboxRequest{Image: env.image, Runtime: "gvisor"}).GetId()
	r, err := env.sandboxes.Run(context.Background(), &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{
		ShellCommand: fmt.Sprintf("head -c %d /dev/urandom > /workspace/data.bin && sync", forkGVisorMiB<<20)}})
	if err != nil || r.GetResult().GetExitCode() != 0 {
		b.Fatalf("write /workspace/data.bin: %v %q", err, r.GetStderr())
	}
	measure(b, "fork-gvisor/berth-Fork-1", 0, forkSample(&berthv1.ForkSandboxRequest{SandboxId: id, Count: 1}))
	measure(b, "fork-gvisor/berth-cold", 0, coldSample(&berthv1.CreateSandboxRequest{Image: baseImage, Runtime: "gvisor"}))
	// With memory: the parent checkpointed and restored, the child
	// restored from the same image (a process holding 64 MiB of memory
	// runs in the parent: its pages are in the image).
	startDetachedIn(b, env.sandboxes, id, "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom >/dev/shm/held && exec sleep 100000", forkGVisorMiB<<20))
	measure(b, "fork-gvisor/berth-Fork-1-memory", 0, forkSample(&berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Memory: true}))
}
