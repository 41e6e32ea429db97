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

// cgroupRoot is where the cgroup hierarchies are mounted; probeCPUSet
// takes it as a parameter so tests can give it a tree of their own.
const cgroupRoot = "/sys/fs/cgroup"

// probeCPUSet finds out, once at start, whether sandboxes can be pinned,
// and returns the CPUs they may be pinned to: those berthd itself may run
// on (sched_getaffinity) that the cpuset cgroup sandboxes are created
// under allows too — containerd's default parent, /<namespace> in the
// cpuset hierarchy. runc refuses a cpuset outside its parent's. On cgroup
// v1 it also prepares that parent (prepareCPUSetParent). root is the
// cgroup mount point (cgroupRoot), unified whether it is cgroup v2.
//
// It fails, saying why, when pinning cannot work from where berthd runs:
// no cpuset hierarchy (v1) or controller (v2); a hierarchy berthd sees
// from below its root — in a container, whose /sys/fs/cgroup is its own
// cgroup, the parent containerd makes at the host's root is out of its
// sight; a read-only one; or a parent it cannot create or fill. The
// caller then pins nothing (Runtime.CPUSetUnavailable).
func probeCPUSet(root string, unified bool, namespace string) (cpuset.CPUSet, error) {
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
	// A file only the hierarchy's root has: cpuset.memory_pressure_enabled
	// on v1 (cgroup-v1/cpusets.rst), the absence of cgroup.type on v2
	// (cgroup-v2.rst: "exists on non-root cgroups").
	dir, file := filepath.Join(root, "cpuset"), "cpuset.effective_cpus"
	if unified {
		dir, file = root, "cpuset.cpus.effective"
		b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err != nil {
			return cpuset.New(), fmt.Errorf("no cgroup v2 hierarchy at %s: %w", root, err)
		}
		if !slices.Contains(strings.Fields(string(b)), "cpuset") {
			return cpuset.New(), fmt.Errorf("the cgroup v2 hierarchy at %s has no cpuset controller (cgroup.controllers: %q)", root, strings.TrimSpace(string(b)))
		}
		if _, err := os.Stat(filepath.Join(root, "cgroup.type")); err == nil {
			return cpuset.New(), fmt.Errorf("%s is a cgroup below the hierarchy's root (berthd runs in a container or cgroup namespace): the sandboxes' parent cgroup /%s, which containerd makes at the root, is out of its sight", root, namespace)
		}
	} else {
		if _, err := os.Stat(filepath.Join(dir, "cpuset.cpus")); err != nil {
			return cpuset.New(), fmt.Errorf("no cgroup v1 cpuset hierarchy at %s: %w", dir, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "cpuset.memory_pressure_enabled")); err != nil {
			return cpuset.New(), fmt.Errorf("%s is a cpuset cgroup below the hierarchy's root (berthd runs in a container, which sees its own cgroup there): the sandboxes' parent cgroup /%s, which containerd makes at the root, is out of its sight", dir, namespace)
		}
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return cpuset.New(), fmt.Errorf("the cpuset hierarchy at %s is not writable: %w", dir, err)
	}
	if !unified {
		if err := prepareCPUSetParent(dir, namespace); err != nil {
			return cpuset.New(), err
		}
	}
	allowed := cpuset.New(own...)
	// The parent on v2 exists once containerd made a sandbox there; until
	// then it gets the root's CPUs.
	for _, d := range []string{filepath.Join(dir, namespace), dir} {
		b, err := os.ReadFile(filepath.Join(d, file))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return cpuset.New(), fmt.Errorf("read the CPUs of cgroup %s: %w", d, err)
		}
		parent, err := cpuset.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return cpuset.New(), fmt.Errorf("CPUs of cgroup %s (%q): %w", d, b, err)
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
	if r.cfg.CPUSet == CPUSetOff || r.cpusetErr != nil || n == 0 {
		return cpuset.New(), func() {}, nil
	}
	r.cpuMu.Lock()
	defer r.cpuMu.Unlock()
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
// needs nothing: an empty cpuset.cpus there means the parent's. root is
// the v1 cpuset hierarchy's mount point. It runs once, at start
// (probeCPUSet): runc and runsc do not remove the parent.
func prepareCPUSetParent(root, namespace string) error {
	// containerd's cgroup1 package does this (cpusetController.Create)
	// but brings D-Bus along; this is its copy for one level.
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
// "auto on CPUs 0-63" with the CPUs sandboxes may be pinned to, or
// "off (auto unavailable)" when CPUSetUnavailable says why not.
func (r *Runtime) CPUSet() string {
	switch {
	case r.cfg.CPUSet == CPUSetOff:
		return CPUSetOff
	case r.cpusetErr != nil:
		return CPUSetOff + " (" + CPUSetAuto + " unavailable)"
	}
	return CPUSetAuto + " on CPUs " + r.cpus.String()
}

// CPUSetUnavailable says why sandboxes are not pinned although
// Config.CPUSet asked for CPUSetAuto (probeCPUSet found out at start);
// nil when they are, or when CPUSetOff was asked for.
func (r *Runtime) CPUSetUnavailable() error { return r.cpusetErr }
