package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestDefaultLimits checks that a sandbox created without resources gets
// the server's default caps in its cgroup and its processes' RLIMIT_NOFILE
// (512 pids × 1024 descriptors: at most 524288 open files, a fifth of this
// host's file table), and that a request whose pids_limit × open files
// exceeds the per-sandbox bound is refused by name.
func TestDefaultLimits(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	res := sb.GetResources()
	if res.GetPidsLimit() != 512 || res.GetCpuMillis() != 1000 || res.GetMemoryBytes() != 1<<30 || res.GetOpenFilesLimit() != 1024 {
		t.Errorf("default resources = %v, want pids 512, cpu 1000, memory 1 GiB, open files 1024", res)
	}
	got := run(t, sb.GetId(), "sh", "-c", `ulimit -Hn; cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/pids/pids.max`)
	if want := "1024\n1073741824\n100000\n100000\n544\n"; string(got.GetStdout()) != want {
		t.Errorf("hard RLIMIT_NOFILE, memory limit, CFS quota and period, pids.max = %q (stderr %q), want %q", got.GetStdout(), got.GetStderr(), want)
	}
	// One process cannot hold more than 1024 descriptors, nor raise its
	// limit.
	got = run(t, sb.GetId(), "bash", "-c", `for i in $(seq 2000); do exec {fd}</dev/null 2>/dev/null || { echo "stopped at $i"; break; }; done; ulimit -n 4096 2>/dev/null && echo raised`)
	if out := string(got.GetStdout()); !strings.HasPrefix(out, "stopped at 10") || strings.Contains(out, "raised") {
		t.Errorf("opening 2000 descriptors, then raising the limit: %q (stderr %q), want stopped near 1021 and no raise", out, got.GetStderr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{PidsLimit: 32768}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "resources.pids_limit") {
		t.Errorf("pids_limit 32768 with the default open files: %v, want INVALID_ARGUMENT naming resources.pids_limit", err)
	}
}
