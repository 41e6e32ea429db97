package integration

import (
	"context"
	"os"
	"path/filepath"
	goruntime "runtime"
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
// cgroup weighs 1024 per CPU of its cap (512 for 500 millis, 1024 for
// 1000, 2048 for 2000) and the sandboxes' parent cgroup the sum of its
// sandboxes', at most 1024 per CPU of this 2-CPU host (1024 with none),
// after each create and delete and after a restart; with --cpu-weight off
// a new sandbox keeps the kernel's default of 1024 and the parent is left
// as it was.
func TestCPUWeight(t *testing.T) {
	need(t)
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		t.Fatalf("this test reads cgroup v1's cpu hierarchy (RUNTIME-NOTES.md: this machine's cgroups are v1): %v", err)
	}
	if goruntime.NumCPU() != 2 {
		t.Fatalf("this test is written for a 2-CPU host (RUNTIME-NOTES.md), this one has %d", goruntime.NumCPU())
	}
	e := newBinaryEnv(t, "weight")
	p := startBerthd(t, e, "--max-cpu-millis", "4000")
	e.importBase(t)
	parent := func(when string, want uint64) {
		t.Helper()
		if got := cpuSharesOf(t, e.ns); got != want {
			t.Errorf("the parent's cpu.shares %s = %d, want %d", when, got, want)
		}
	}
	parent("with no sandbox", 1024)
	for _, s := range []struct {
		id     string
		millis uint64
		parent uint64
	}{{"w-half", 500, 512}, {"w-one", 1000, 512 + 1024}, {"w-two", 2000, 2048}} {
		if err := createWithCPU(e, s.id, s.millis); err != nil {
			t.Fatal(err)
		}
		if got, want := cpuSharesOf(t, e.ns+"/"+s.id), s.millis*1024/1000; got != want {
			t.Errorf("cpu.shares of sandbox %s (%d millis) = %d, want %d", s.id, s.millis, got, want)
		}
		parent("after "+s.id+"'s create", s.parent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range []struct {
		id     string
		parent uint64
	}{{"w-two", 512 + 1024}, {"w-half", 1024}} {
		if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: s.id}); err != nil {
			t.Fatal(err)
		}
		parent("after "+s.id+"'s delete", s.parent)
	}
	if err := createWithCPU(e, "w-half2", 500); err != nil {
		t.Fatal(err)
	}
	parent("with sandboxes of 1000 and 500 millis", 1536)

	// A restarted berthd weighs what it finds; with --cpu-weight off it
	// leaves the parent as it was and its sandboxes at the default.
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Logf("berthd's exit after SIGTERM: %v", err)
	}
	if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/cpu", e.ns, "cpu.shares"), []byte("1024"), 0o644); err != nil {
		t.Fatal(err)
	}
	p = startBerthd(t, e, "--max-cpu-millis", "4000")
	parent("after a restart with sandboxes of 1000 and 500 millis", 1536)
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
	parent("with --cpu-weight off", 1536)
}
