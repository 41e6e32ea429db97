package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"
	"k8s.io/utils/cpuset"
)

// Modes of Config.CPUSet.
const (
	// CPUSetAuto pins every sandbox whose CPU cap is below the CPUs it
	// may use to ceil(CPUMillis/1000) of them, the least loaded
	// (allocCPUs): nproc, sched_getaffinity and whatever sizes its
	// parallelism by them see the sandbox's share, not the host's cores.
	CPUSetAuto = "auto"
	// CPUSetOff pins no sandbox: each may run on every CPU of the host,
	// its CFS quota alone capping what it takes.
	CPUSetOff = "off"
)

// labelCPUSet records the CPUs a sandbox is pinned to, in the kernel's
// list format ("1", "0-3,8"); absent on sandboxes that are not pinned.
// A started berthd counts the load from it (allocCPUs).
const labelCPUSet = LabelPrefix + "cpuset"

// cpusFor returns how many CPUs a sandbox with a cap of millis
// thousandths of a CPU is pinned to, out of host CPUs it may use: the cap
// rounded up to whole CPUs, or zero (no pinning) when it has no cap or
// the cap covers every one of host.
func cpusFor(millis uint64, host int) int {
	if millis == 0 || host <= 0 {
		return 0
	}
	n := (millis + 999) / 1000
	if n >= uint64(host) {
		return 0
	}
	return int(n)
}

// leastLoaded returns the n CPUs of allowed that carry the least load
// (thousandths of a CPU promised to the sandboxes pinned there, by CPU),
// the lower-numbered first among equal loads.
func leastLoaded(allowed cpuset.CPUSet, load map[int]uint64, n int) cpuset.CPUSet {
	cpus := allowed.List()
	slices.SortStableFunc(cpus, func(a, b int) int {
		switch {
		case load[a] < load[b]:
			return -1
		case load[a] > load[b]:
			return 1
		}
		return a - b
	})
	return cpuset.New(cpus[:min(n, len(cpus))]...)
}

// addLoad counts a sandbox with a cap of millis pinned to cpus into
// load: each of its CPUs carries an equal share of the cap.
func addLoad(load map[int]uint64, cpus cpuset.CPUSet, millis uint64) {
	if cpus.Size() == 0 {
		return
	}
	share := millis / uint64(cpus.Size())
	for _, c := range cpus.UnsortedList() {
		load[c] += share
	}
}

// pinning is the CPUs a create in progress reserved.
type pinning struct {
	cpus   cpuset.CPUSet
	millis uint64
}

// allowedCPUs returns the CPUs sandboxes may be pinned to: those berthd
// itself may run on (sched_getaffinity) that the cpuset cgroup sandboxes
// are created under allows too — containerd's default parent,
// /<namespace> in the cpuset hierarchy, or its root while that does not
// exist yet. runc refuses a cpuset outside its parent's.
func allowedCPUs(namespace string) (cpuset.CPUSet, error) {
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		return cpuset.New(), fmt.Errorf("read berthd's CPU affinity: %w", err)
	}
	var own []int
	for c := 0; len(own) < mask.Count(); c++ {
		if mask.IsSet(c) {
			own = append(own, c)
		}
	}
	allowed := cpuset.New(own...)
	root, file := "/sys/fs/cgroup/cpuset", "cpuset.effective_cpus"
	if cgroups.Mode() == cgroups.Unified {
		root, file = "/sys/fs/cgroup", "cpuset.cpus.effective"
	}
	for _, dir := range []string{filepath.Join(root, namespace), root} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return cpuset.New(), fmt.Errorf("read the CPUs of cgroup %s: %w", dir, err)
		}
		parent, err := cpuset.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return cpuset.New(), fmt.Errorf("CPUs of cgroup %s (%q): %w", dir, b, err)
		}
		if parent.Size() > 0 {
			allowed = allowed.Intersection(parent)
		}
		break
	}
	if allowed.Size() == 0 {
		return cpuset.New(), errors.New("berthd's CPU affinity and the sandboxes' parent cpuset cgroup have no CPU in common")
	}
	return allowed, nil
}

// allocCPUs reserves the CPUs sandbox spec is pinned to, the least loaded
// of Config's allowed CPUs by the sandboxes pinned before it: those
// containerd records (labelCPUSet, so a berthd started again counts what
// an earlier one pinned) and the creates still in progress. It returns an
// empty set, and pins nothing, with CPUSetOff or when the spec's CPU cap
// covers every allowed CPU. release gives the reservation back once the
// container records it (or the create failed).
func (r *Runtime) allocCPUs(ctx context.Context, spec SandboxSpec) (_ cpuset.CPUSet, release func(), err error) {
	n := cpusFor(spec.CPUMillis, r.cpus.Size())
	if r.cfg.CPUSet == CPUSetOff || n == 0 {
		return cpuset.New(), func() {}, nil
	}
	r.cpuMu.Lock()
	defer r.cpuMu.Unlock()
	if err := prepareCPUSetParent(r.cfg.Namespace); err != nil {
		return cpuset.New(), nil, err
	}
	records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q", labelCPUSet))
	if err != nil {
		return cpuset.New(), nil, fmt.Errorf("list the sandboxes' cpusets: %w", err)
	}
	load := make(map[int]uint64)
	recorded := make(map[string]bool, len(records))
	for _, c := range records {
		recorded[c.ID] = true
		cpus, err := cpuset.Parse(c.Labels[labelCPUSet])
		if err != nil {
			continue // not berthd's writing: counts nothing
		}
		millis, _ := strconv.ParseUint(c.Labels[labelCPUMillis], 10, 64)
		addLoad(load, cpus, millis)
	}
	for id, p := range r.cpuReserved {
		if !recorded[id] {
			addLoad(load, p.cpus, p.millis)
		}
	}
	cpus := leastLoaded(r.cpus, load, n)
	r.cpuReserved[spec.ID] = pinning{cpus: cpus, millis: spec.CPUMillis}
	return cpus, func() {
		r.cpuMu.Lock()
		defer r.cpuMu.Unlock()
		delete(r.cpuReserved, spec.ID)
	}, nil
}

// prepareCPUSetParent gives the sandboxes' parent cpuset cgroup on
// cgroup v1 (containerd's default, /<namespace>) the CPUs and memory nodes
// of the root when it has none, as runc does when it makes it. runsc
// (Debian's 20221219) makes it empty and then cannot write a sandbox's
// cpuset.cpus below it ("permission denied"): without this, the first
// pinned sandbox of a namespace under gVisor failed to start. cgroup v2
// needs nothing: an empty cpuset.cpus there means the parent's.
func prepareCPUSetParent(namespace string) error {
	if cgroups.Mode() == cgroups.Unified {
		return nil
	}
	// containerd's cgroup1 package does this (cpusetController.Create)
	// but brings D-Bus along; this is its copy for one level.
	const root = "/sys/fs/cgroup/cpuset"
	dir := filepath.Join(root, namespace)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the sandboxes' parent cpuset cgroup %s: %w", dir, err)
	}
	for _, name := range []string{"cpuset.cpus", "cpuset.mems"} {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("read %s of the sandboxes' parent cgroup: %w", name, err)
		}
		if len(strings.TrimSpace(string(have))) > 0 {
			continue
		}
		want, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return fmt.Errorf("read %s of the root cpuset cgroup: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), want, 0o644); err != nil {
			return fmt.Errorf("give the sandboxes' parent cgroup %s the root's %s: %w", dir, name, err)
		}
	}
	return nil
}

// CPUSet describes how sandboxes are pinned, for berthd's log: "off", or
// "auto on CPUs 0-63" with the CPUs sandboxes may be pinned to.
func (r *Runtime) CPUSet() string {
	if r.cfg.CPUSet == CPUSetOff {
		return CPUSetOff
	}
	return CPUSetAuto + " on CPUs " + r.cpus.String()
}
