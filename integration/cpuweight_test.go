package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// cpuSharesOf reads cpu.shares of the cgroup rel (below the v1 cpu
// hierarchy): the sandboxes' parent is the namespace, a sandbox's cgroup
// namespace/id (containerd's default cgroups path).
func cpuSharesOf(t *testing.T, rel string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.shares"))
	if err != nil {
		t.Fatalf("read the cpu.shares of cgroup %s: %v", rel, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("cpu.shares of cgroup %s = %q: %v", rel, b, err)
	}
	return v
}

// TestCPUWeight: with berthd's default --cpu-weight auto each sandbox's
// cgroup weighs 1024 per CPU of its cap (512 for 500 millis, 2048 for
// 2000) and the sandboxes' parent cgroup the sum of its sandboxes' (1024
// with none), after each create and delete and after a restart; with
// --cpu-weight off a new sandbox keeps the kernel's default of 1024 and
// the parent is left as it was.
func TestCPUWeight(t *testing.T) {
	need(t)
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		t.Fatalf("this test reads cgroup v1's cpu hierarchy (RUNTIME-NOTES.md: this machine's cgroups are v1): %v", err)
	}
	e := newBinaryEnv(t, "weight")
	p := startBerthd(t, e, "--max-cpu-millis", "4000")
	e.importBase(t)
	if got := cpuSharesOf(t, e.ns); got != 1024 {
		t.Errorf("the parent's cpu.shares with no sandbox = %d, want 1024", got)
	}
	if err := createWithCPU(e, "w-half", 500); err != nil {
		t.Fatal(err)
	}
	if err := createWithCPU(e, "w-two", 2000); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]uint64{"w-half": 512, "w-two": 2048} {
		if got := cpuSharesOf(t, e.ns+"/"+id); got != want {
			t.Errorf("cpu.shares of sandbox %s = %d, want %d", id, got, want)
		}
	}
	if got := cpuSharesOf(t, e.ns); got != 512+2048 {
		t.Errorf("the parent's cpu.shares with sandboxes of 500 and 2000 millis = %d, want %d", got, 512+2048)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: "w-half"}); err != nil {
		t.Fatal(err)
	}
	if got := cpuSharesOf(t, e.ns); got != 2048 {
		t.Errorf("the parent's cpu.shares after w-half's delete = %d, want 2048", got)
	}

	// A restarted berthd weighs what it finds; with --cpu-weight off it
	// leaves the parent as it was and its sandboxes at the default.
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Logf("berthd's exit after SIGTERM: %v", err)
	}
	if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/cpu", e.ns, "cpu.shares"), []byte("1024"), 0o644); err != nil {
		t.Fatal(err)
	}
	p = startBerthd(t, e, "--max-cpu-millis", "4000")
	if got := cpuSharesOf(t, e.ns); got != 2048 {
		t.Errorf("the parent's cpu.shares after a restart with w-two (2000 millis) = %d, want 2048", got)
	}
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Logf("berthd's exit after SIGTERM: %v", err)
	}
	startBerthd(t, e, "--max-cpu-millis", "4000", "--cpu-weight", "off")
	if err := createWithCPU(e, "w-off", 500); err != nil {
		t.Fatal(err)
	}
	if got := cpuSharesOf(t, e.ns+"/w-off"); got != 1024 {
		t.Errorf("cpu.shares of a 500-millis sandbox with --cpu-weight off = %d, want the kernel's 1024", got)
	}
	if got := cpuSharesOf(t, e.ns); got != 2048 {
		t.Errorf("the parent's cpu.shares with --cpu-weight off = %d, want 2048 as the last berthd left it", got)
	}
}
