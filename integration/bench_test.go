package integration

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

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

// BenchmarkCreateToFirstExec measures a sandbox's create-to-first-exec time:
// CreateSandbox, then Run of /bin/echo, until its result arrives, through
// berthd's gRPC API. "cold" creates a container each time; "warm" is served
// from a warm pool of one (refilled between iterations, off the clock);
// "ctr-run" is `ctr run --rm` of the same image on the same containerd, the
// whole lifecycle of a container running echo, for comparison. Besides
// ns/op each reports its median and fastest run in ms. Deleting the
// sandboxes is off the clock.
//
//	BERTH_E2E=1 GO_TEST_PKGS=./integration/ GO_TEST_FLAGS="-run ^$ -bench CreateToFirstExec -benchtime 20x" scripts/test.sh
func BenchmarkCreateToFirstExec(b *testing.B) {
	if env.skip != "" {
		b.Skip("integration environment unavailable: " + env.skip)
	}
	b.Run("cold", func(b *testing.B) {
		benchCreate(b, env.sandboxes, nil, false)
	})
	b.Run("warm", func(b *testing.B) {
		e := newInProcessEnv(b, "bw", warmPoolConfig())
		benchCreate(b, e.sandboxes, e, true)
	})
	b.Run("ctr-run", func(b *testing.B) {
		times := make([]time.Duration, 0, b.N)
		for i := range b.N {
			start := time.Now()
			out, err := exec.Command("ctr", "--address", env.containerd, "--namespace", env.namespace,
				"run", "--rm", "--snapshotter", env.snapshotter, baseImage, fmt.Sprintf("ctr-bench-%d-%d", time.Now().UnixNano(), i), "/bin/echo", "hi").CombinedOutput()
			if err != nil || string(out) != "hi\n" {
				b.Fatalf("ctr run: %v: %q", err, out)
			}
			times = append(times, time.Since(start))
		}
		reportMedian(b, times)
	})
}

func benchCreate(b *testing.B, sandboxes berthv1.SandboxServiceClient, pool *berthEnv, wantPool bool) {
	ctx := context.Background()
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if pool != nil {
			waitPool(b, pool, 1)
		}
		b.StartTimer()
		start := time.Now()
		resp, err := sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
		if err != nil {
			b.Fatal(err)
		}
		r, err := sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: resp.GetSandbox().GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"/bin/echo", "hi"}}})
		if err != nil || string(r.GetStdout()) != "hi\n" {
			b.Fatalf("Run: %v %q", err, r.GetStdout())
		}
		times = append(times, time.Since(start))
		b.StopTimer()
		if resp.GetFromWarmPool() != wantPool {
			b.Fatalf("from_warm_pool = %v, want %v", resp.GetFromWarmPool(), wantPool)
		}
		if _, err := sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportMedian(b, times)
}

func reportMedian(b *testing.B, times []time.Duration) {
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2])/float64(time.Millisecond), "median-ms")
	b.ReportMetric(float64(times[0])/float64(time.Millisecond), "min-ms")
}
