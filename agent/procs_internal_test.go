package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCPUCap: the cap is read from cgroup v1's quota and period or v2's
// cpu.max, at the path /proc/self/cgroup names or the mount's top; no cap
// ("max", -1) and no file are false.
func TestCPUCap(t *testing.T) {
	root := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "v1", "cpu", "ns", "sb", "cpu.cfs_quota_us"), "100000\n")
	write(filepath.Join(root, "v1", "cpu", "ns", "sb", "cpu.cfs_period_us"), "100000\n")
	write(filepath.Join(root, "v1top", "cpu", "cpu.cfs_quota_us"), "150000\n")
	write(filepath.Join(root, "v1top", "cpu", "cpu.cfs_period_us"), "100000\n")
	write(filepath.Join(root, "v1none", "cpu", "cpu.cfs_quota_us"), "-1\n")
	write(filepath.Join(root, "v1none", "cpu", "cpu.cfs_period_us"), "100000\n")
	write(filepath.Join(root, "v2", "x", "cpu.max"), "50000 100000\n")
	write(filepath.Join(root, "v2max", "cpu.max"), "max 100000\n")
	tests := []struct {
		name   string
		cgroup string
		root   string
		want   float64
		wantOK bool
	}{
		{"v1 own path", "12:pids:/ns/sb\n3:cpu,cpuacct:/ns/sb\n", filepath.Join(root, "v1"), 1, true},
		{"v1 container: own path not mounted, top is the container's", "3:cpu:/elsewhere/sb\n", filepath.Join(root, "v1top"), 1.5, true},
		{"v1 no cap", "3:cpu:/sb\n", filepath.Join(root, "v1none"), 0, false},
		{"v2", "0::/x\n", filepath.Join(root, "v2"), 0.5, true},
		{"v2 no cap", "0::/y\n", filepath.Join(root, "v2max"), 0, false},
		{"no cpu controller", "11:memory:/sb\n", filepath.Join(root, "v1"), 0, false},
		{"no files", "3:cpu:/sb\n", filepath.Join(root, "missing"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cpuCap(tt.root, []byte(tt.cgroup))
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("cpuCap = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
