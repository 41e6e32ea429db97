package runtime

import (
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

// TestAllowedCPUs: the CPUs a sandbox may be pinned to are among those
// berthd may run on.
func TestAllowedCPUs(t *testing.T) {
	got, err := allowedCPUs("berth-unit-test-no-such-cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		t.Fatal(err)
	}
	if got.Size() == 0 || got.Size() > mask.Count() {
		t.Errorf("allowedCPUs = %s: %d CPUs, want 1 to berthd's %d", got, got.Size(), mask.Count())
	}
	for _, c := range got.List() {
		if !mask.IsSet(c) {
			t.Errorf("allowedCPUs = %s holds CPU %d, which berthd may not run on", got, c)
		}
	}
}
