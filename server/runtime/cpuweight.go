package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// berthd weighs the sandboxes' parent cgroup (containerd's default,
// /<namespace>, in the cpu hierarchy) as the sum of its sandboxes'
// weights, each 1024 per CPU of its cap, at most 1024 per CPU the
// sandboxes may run on — as the kubelet weighs a pod by its CPU request
// (MilliCPUToShares) and the pods' parent, kubepods, by the node's
// allocatable CPUs. Left at the kernel's default of 1024 — one task's
// weight at nice 0 — the parent made every sandbox of the host together
// weigh as one process against the host's others (berthd's and the
// client's threads, the shims, any other daemon): 50 sandboxes running
// execs got 0.60-0.65x of what as many host processes did beside other
// work (BENCHMARKS.md, session 9). The bound keeps the host's own
// processes — berthd, containerd, the shims that serve the sandboxes — a
// share when many sandboxes are held and a few are busy: the parent's
// weight is split among its busy sandboxes alone (a hostile review found
// that 200 sandboxes, one of them busy, would otherwise leave berthd a
// two-hundredth of the CPU). Only contention is affected: each sandbox is
// still held to its own CPU cap (cpu.cfs_quota_us). The sum counts every
// sandbox berthd holds, running or not. Config.CPUWeight CPUWeightOff
// leaves the parent's weight alone.

// Config.CPUWeight values.
const (
	CPUWeightAuto = "auto"
	CPUWeightOff  = "off"
)

// The bounds of cgroup v1's cpu.shares (kernel/sched/sched.h:
// MIN_SHARES, MAX_SHARES) and the weight of one task at nice 0.
const (
	minShares  = 2
	maxShares  = 262144
	taskShares = 1024
)

// cpuShares is the cpu.shares of a sandbox capped at millis thousandths
// of a CPU (0: no cap, which weighs as one CPU): 1024 per CPU, within the
// kernel's bounds.
func cpuShares(millis uint64) uint64 {
	if millis == 0 {
		return taskShares
	}
	return min(max(millis*taskShares/1000, minShares), maxShares)
}

// fleetShares is the weight of the sandboxes' parent cgroup for
// sandboxes capped at millis each (0: no cap), on cpus CPUs: the sum of
// their cpuShares, at most 1024 per CPU; 1024 with no sandbox.
func fleetShares(millis []uint64, cpus int) uint64 {
	if len(millis) == 0 {
		return taskShares
	}
	var sum uint64
	for _, m := range millis {
		sum += cpuShares(m)
	}
	return min(sum, uint64(max(cpus, 1))*taskShares, maxShares)
}

// sharesToWeight converts cgroup v1's cpu.shares to cgroup v2's
// cpu.weight [1, 10000] as runc and crun do for an OCI spec's
// linux.resources.cpu.shares on v2.
func sharesToWeight(shares uint64) uint64 {
	shares = min(max(shares, minShares), maxShares)
	return 1 + ((shares-2)*9999)/262142
}

// cpuWeightFile is the file that weighs the sandboxes' parent cgroup of
// namespace under the hierarchy mounted at root: cpu.shares in the v1
// cpu hierarchy, cpu.weight on v2.
func cpuWeightFile(root string, unified bool, namespace string) string {
	if unified {
		return filepath.Join(root, namespace, "cpu.weight")
	}
	return filepath.Join(root, "cpu", namespace, "cpu.shares")
}

// probeCPUWeight finds out, once at start, whether berthd can weigh the
// sandboxes' parent cgroup, and makes the parent when it is missing (as
// runc would at the first sandbox). It fails, saying why, where berthd
// sees the hierarchy from below its root (in a container: the parent
// containerd makes at the host's root is out of its sight), where the
// hierarchy has no cpu controller, or where it is read-only.
func probeCPUWeight(root string, unified bool, namespace string) error {
	dir := filepath.Join(root, "cpu")
	if unified {
		dir = root
		b, err := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
		if err != nil {
			return fmt.Errorf("no cgroup v2 hierarchy at %s: %w", root, err)
		}
		if !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpu ") {
			// runc enables it when it makes the first sandbox's
			// cgroup; until then there is no cpu.weight to write.
			if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
				return fmt.Errorf("enable the cpu controller below %s: %w", root, err)
			}
		}
		// cgroup-v2.rst: cgroup.type "exists on non-root cgroups".
		if _, err := os.Stat(filepath.Join(root, "cgroup.type")); err == nil {
			return fmt.Errorf("%s is a cgroup below the hierarchy's root (berthd runs in a container or cgroup namespace): the sandboxes' parent cgroup /%s, which containerd makes at the root, is out of its sight", root, namespace)
		}
	} else {
		if _, err := os.Stat(filepath.Join(dir, "cpu.shares")); err != nil {
			return fmt.Errorf("no cgroup v1 cpu hierarchy at %s: %w", dir, err)
		}
		// cgroup-v1/cgroups.rst: release_agent is "present in the top
		// cgroup only".
		if _, err := os.Stat(filepath.Join(dir, "release_agent")); err != nil {
			return fmt.Errorf("%s is a cpu cgroup below the hierarchy's root (berthd runs in a container, which sees its own cgroup there): the sandboxes' parent cgroup /%s, which containerd makes at the root, is out of its sight", dir, namespace)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, namespace), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the sandboxes' parent cpu cgroup: %w", err)
	}
	f := cpuWeightFile(root, unified, namespace)
	if err := unix.Access(f, unix.W_OK); err != nil {
		return fmt.Errorf("the sandboxes' parent cgroup's %s is not writable: %w", filepath.Base(f), err)
	}
	return nil
}

// writeCPUWeight weighs the sandboxes' parent cgroup as shares.
func writeCPUWeight(root string, unified bool, namespace string, shares uint64) error {
	v := min(max(shares, minShares), maxShares)
	if unified {
		v = sharesToWeight(v)
	}
	f := cpuWeightFile(root, unified, namespace)
	if err := os.WriteFile(f, []byte(strconv.FormatUint(v, 10)), 0o644); err != nil {
		return fmt.Errorf("weigh the sandboxes' parent cgroup (%s = %d): %w", f, v, err)
	}
	return nil
}

// reweighAfter reweighs after a create or delete under ctx, within the
// call budget even when ctx has ended; its error is left (reweigh).
func (r *Runtime) reweighAfter(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CallBudget)
	defer cancel()
	_ = r.reweigh(ctx)
}

// CPUWeight describes how the sandboxes' parent cgroup is weighed, for
// berthd's log: "auto", "off", or "off (auto unavailable)" when
// CPUWeightUnavailable says why.
func (r *Runtime) CPUWeight() string {
	switch {
	case r.cfg.CPUWeight == CPUWeightOff:
		return CPUWeightOff
	case r.cpuWeightErr != nil:
		return CPUWeightOff + " (" + CPUWeightAuto + " unavailable)"
	}
	return CPUWeightAuto
}

// CPUWeightUnavailable says why the sandboxes' parent cgroup is not
// weighed although Config.CPUWeight asked for CPUWeightAuto
// (probeCPUWeight found out at start); nil when it is, or with
// CPUWeightOff.
func (r *Runtime) CPUWeightUnavailable() error { return r.cpuWeightErr }

// reweigh sets the sandboxes' parent cgroup's weight to the fleetShares
// of the sandboxes containerd records on the CPUs they may run on (the
// cpuset's, else berthd's). Concurrent calls share one containerd List (coalescer), each
// seeing the sandboxes of a moment after it asked. Create and Delete call
// it and ignore its error (the weight is a share under contention, never
// a limit: no create fails for it); New fails on it.
func (r *Runtime) reweigh(ctx context.Context) error {
	if r.cfg.CPUWeight == CPUWeightOff || r.cpuWeightErr != nil {
		return nil
	}
	_, err := r.weighs.do(ctx, "", func(ctx context.Context) (struct{}, error) {
		records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q", labelCPUMillis))
		if err != nil {
			return struct{}{}, fmt.Errorf("list the sandboxes' CPU caps: %w", err)
		}
		millis := make([]uint64, 0, len(records))
		for _, c := range records {
			m, _ := strconv.ParseUint(c.Labels[labelCPUMillis], 10, 64)
			millis = append(millis, m)
		}
		cpus := r.cpus.Size()
		if cpus == 0 {
			cpus = goruntime.NumCPU()
		}
		return struct{}{}, writeCPUWeight(cgroupRoot, r.unified, r.cfg.Namespace, fleetShares(millis, cpus))
	})
	return err
}
