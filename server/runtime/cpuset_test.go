package runtime

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/utils/cpuset"
)

// TestCPUsFor: a cap is rounded up to whole CPUs, and a cap that covers
// every CPU (or more) pins nothing, nor does no cap.
func TestCPUsFor(t *testing.T) {
	for _, tc := range []struct {
		millis uint64
		host   int
		want   int
	}{
		{0, 2, 0},
		{10, 2, 1},
		{500, 2, 1},
		{1000, 2, 1},
		{1001, 2, 0}, // two CPUs of two: all of them
		{2000, 2, 0},
		{3000, 2, 0},
		{1001, 64, 2},
		{63500, 64, 0},
		{62001, 64, 63},
		{1000, 1, 0},
	} {
		if got := cpusFor(tc.millis, tc.host); got != tc.want {
			t.Errorf("cpusFor(%d, %d) = %d, want %d", tc.millis, tc.host, got, tc.want)
		}
	}
}

// TestLeastLoaded: the CPUs with the least millis pinned to them, the
// lowest-numbered among equals, only among the allowed ones.
func TestLeastLoaded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allowed cpuset.CPUSet
		pinned  []pinning
		n       int
		want    string
	}{
		{"idle host", cpuset.New(0, 1), nil, 1, "0"},
		{"one pinned", cpuset.New(0, 1), []pinning{{cpuset.New(0), 1000}}, 1, "1"},
		{"weighted by millis", cpuset.New(0, 1), []pinning{{cpuset.New(0), 1000}, {cpuset.New(1), 500}}, 1, "1"},
		{"two CPUs share a cap", cpuset.New(0, 1, 2), []pinning{{cpuset.New(0, 1), 1000}, {cpuset.New(2), 600}}, 1, "0"},
		{"several", cpuset.New(2, 3, 5, 7), []pinning{{cpuset.New(3), 100}, {cpuset.New(0), 5000}}, 2, "2,5"},
		{"not allowed ones ignored", cpuset.New(4, 5), []pinning{{cpuset.New(0, 1), 2000}, {cpuset.New(4), 10}}, 1, "5"},
	} {
		load := make(map[int]uint64)
		for _, p := range tc.pinned {
			addLoad(load, p.cpus, p.millis)
		}
		if got := leastLoaded(tc.allowed, load, tc.n).String(); got != tc.want {
			t.Errorf("%s: leastLoaded(%s, %v, %d) = %s, want %s", tc.name, tc.allowed, load, tc.n, got, tc.want)
		}
	}
}

// TestProbeCPUSet: pinning is possible only where berthd sees the root of
// a writable cpuset hierarchy (v1) or of a v2 hierarchy with the cpuset
// controller; a container's view of its own cgroup (the DaemonSet's pod of
// issue 21: every create failed INTERNAL when berthd tried to mkdir the
// namespace's cgroup there) says why not instead. Where it works, the
// CPUs are berthd's affinity within the parent's, and on v1 the
// namespace's cgroup is given the root's CPUs and memory nodes once.
func TestProbeCPUSet(t *testing.T) {
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !mask.IsSet(cpu) {
		cpu++
	}
	one := strconv.Itoa(cpu)
	const ns = "berth-unit"
	for _, tc := range []struct {
		name    string
		unified bool
		files   map[string]string // path under the root -> content
		want    string            // CPUs, or a part of the error
		wantErr bool
	}{
		{name: "v1 root", files: map[string]string{
			"cpuset/cpuset.cpus": one + "\n", "cpuset/cpuset.mems": "0\n", "cpuset/cpuset.effective_cpus": one + "\n",
			"cpuset/cpuset.memory_pressure_enabled": "0\n", ns + "-placeholder": ""}, want: one},
		{name: "v1 container's own cgroup", files: map[string]string{
			"cpuset/cpuset.cpus": one + "\n", "cpuset/cpuset.effective_cpus": one + "\n"}, want: "below the hierarchy's root", wantErr: true},
		{name: "v1 no cpuset hierarchy", files: map[string]string{"memory/memory.limit_in_bytes": "1\n"}, want: "no cgroup v1 cpuset hierarchy", wantErr: true},
		{name: "v2 root", unified: true, files: map[string]string{
			"cgroup.controllers": "cpuset cpu io memory pids\n", "cpuset.cpus.effective": one + "\n"}, want: one},
		{name: "v2 parent's own CPUs", unified: true, files: map[string]string{
			"cgroup.controllers": "cpuset cpu\n", "cpuset.cpus.effective": "0-1023\n", ns + "/cpuset.cpus.effective": one + "\n"}, want: one},
		{name: "v2 no cpuset controller", unified: true, files: map[string]string{"cgroup.controllers": "cpu io memory pids\n"}, want: "no cpuset controller", wantErr: true},
		{name: "v2 cgroup namespace", unified: true, files: map[string]string{
			"cgroup.controllers": "cpuset cpu\n", "cgroup.type": "domain\n", "cpuset.cpus.effective": one + "\n"}, want: "below the hierarchy's root", wantErr: true},
	} {
		root := t.TempDir()
		for name, content := range tc.files {
			if strings.HasSuffix(name, "-placeholder") {
				// The namespace's v1 cgroup as the kernel makes it: its
				// files there, empty.
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					name := filepath.Join("cpuset", ns, f)
					if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(root, name), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := probeCPUSet(root, tc.unified, ns)
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: probeCPUSet = %s, %v; want an error saying %q", tc.name, got, err, tc.want)
		case !tc.wantErr && (err != nil || got.String() != tc.want):
			t.Errorf("%s: probeCPUSet = %s, %v; want CPUs %s", tc.name, got, err, tc.want)
		}
		if tc.name == "v1 root" {
			for f, want := range map[string]string{"cpuset.cpus": one + "\n", "cpuset.mems": "0\n"} {
				if b, err := os.ReadFile(filepath.Join(root, "cpuset", ns, f)); err != nil || string(b) != want {
					t.Errorf("%s: the namespace's %s = %q, %v; want the root's %q", tc.name, f, b, err, want)
				}
			}
		}
	}
}
