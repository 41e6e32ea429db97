package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCPUShares: 1024 per CPU of the cap, 1024 without one, within the
// kernel's bounds; and v2's weight as runc converts it.
func TestCPUShares(t *testing.T) {
	for millis, want := range map[uint64]uint64{0: 1024, 1: 2, 500: 512, 1000: 1024, 2000: 2048, 1 << 40: 262144} {
		if got := cpuShares(millis); got != want {
			t.Errorf("cpuShares(%d) = %d, want %d", millis, got, want)
		}
	}
	for shares, want := range map[uint64]uint64{0: 1, 2: 1, 1024: 39, 2048: 79, 51200: 1953, 262144: 10000, 1 << 30: 10000} {
		if got := sharesToWeight(shares); got != want {
			t.Errorf("sharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
}

// TestFleetShares: the sum of the sandboxes' weights, at most 1024 per
// CPU (the kubelet's bound for kubepods), 1024 with none.
func TestFleetShares(t *testing.T) {
	for _, tc := range []struct {
		millis []uint64
		cpus   int
		want   uint64
	}{
		{nil, 2, 1024},
		{[]uint64{500}, 2, 512},
		{[]uint64{500, 1000}, 2, 1536},
		{[]uint64{500, 1000, 2000}, 2, 2048},
		{[]uint64{1000, 1000, 1000}, 64, 3072},
		{make([]uint64, 50), 2, 2048},
		{make([]uint64, 50), 1000, 51200},
		{make([]uint64, 500), 1000, 262144},
	} {
		if got := fleetShares(tc.millis, tc.cpus); got != tc.want {
			t.Errorf("fleetShares(%d sandboxes %v, %d CPUs) = %d, want %d", len(tc.millis), tc.millis[:min(len(tc.millis), 3)], tc.cpus, got, tc.want)
		}
	}
}

// TestProbeCPUWeight: on a v1 hierarchy's root (release_agent there)
// the parent is made and its weight written; seen from below the root
// (in a container) or on a v2 cgroup that is not the root it is refused,
// saying why.
func TestProbeCPUWeight(t *testing.T) {
	v1 := func(t *testing.T, root bool) string {
		dir := t.TempDir()
		cpu := filepath.Join(dir, "cpu")
		if err := os.Mkdir(cpu, 0o755); err != nil {
			t.Fatal(err)
		}
		files := []string{"cpu.shares"}
		if root {
			files = append(files, "release_agent")
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(cpu, f), []byte("1024\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	dir := v1(t, true)
	if err := probeCPUWeight(dir, false, "ns"); err == nil {
		// A fake tree: the kernel makes cpu.shares in a new cgroup.
		t.Fatal("probe of a parent without cpu.shares succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu", "ns", "cpu.shares"), []byte("1024\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := probeCPUWeight(dir, false, "ns"); err != nil {
		t.Fatalf("probe of a v1 root: %v", err)
	}
	if err := writeCPUWeight(dir, false, "ns", 51200); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cpu", "ns", "cpu.shares")); string(b) != "51200" {
		t.Errorf("cpu.shares written = %q, want 51200", b)
	}
	if err := probeCPUWeight(v1(t, false), false, "ns"); err == nil || !strings.Contains(err.Error(), "below the hierarchy's root") {
		t.Errorf("probe of a v1 cgroup below the root = %v, want it refused as below the root", err)
	}

	v2 := t.TempDir()
	for f, v := range map[string]string{"cgroup.subtree_control": "cpuset cpu io memory pids\n", "cgroup.type": "domain\n"} {
		if err := os.WriteFile(filepath.Join(v2, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := probeCPUWeight(v2, true, "ns"); err == nil || !strings.Contains(err.Error(), "below the hierarchy's root") {
		t.Errorf("probe of a v2 cgroup below the root = %v, want it refused as below the root", err)
	}
	if err := os.Remove(filepath.Join(v2, "cgroup.type")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(v2, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v2, "ns", "cpu.weight"), []byte("100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := probeCPUWeight(v2, true, "ns"); err != nil {
		t.Fatalf("probe of a v2 root: %v", err)
	}
	if err := writeCPUWeight(v2, true, "ns", 2048); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(v2, "ns", "cpu.weight")); string(b) != "79" {
		t.Errorf("cpu.weight written = %q, want 79 (2048 shares)", b)
	}
}
