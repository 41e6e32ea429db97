package runtime

import (
	"context"
	"fmt"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/typeurl/v2"
)

// Usage is what a sandbox's cgroup reports now.
type Usage struct {
	// CPU is the CPU time used by all its processes (user + system).
	CPU time.Duration
	// MemoryBytes is the working set: usage minus inactive file cache.
	MemoryBytes uint64
	// MemoryPeakBytes is the highest usage seen, cache included (0 when the
	// cgroup does not report it).
	MemoryPeakBytes uint64
	// Pids is the number of processes and threads.
	Pids uint64
	// DiskBytes is what the sandbox's disk quota counts: the bytes its
	// writable layer holds beyond its image. Zero when disk quotas are
	// not available (Runtime.DiskQuota) or could not be read.
	DiskBytes uint64
}

// Usage reads the sandbox task's metrics from containerd (cgroup v1 or v2
// stats, as the shim reports them) and, with disk quotas, its disk use.
func (r *Runtime) Usage(ctx context.Context, id string) (_ Usage, err error) {
	c := r.begin(ctx, "read the usage of sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	u, err := r.taskUsage(ctx, id)
	if err == nil && r.quota != nil {
		u.DiskBytes, _ = r.diskUsed(ctx, id)
	}
	return u, err
}

func (r *Runtime) taskUsage(ctx context.Context, id string) (Usage, error) {
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return Usage{}, r.containerError(id, err)
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return Usage{}, fmt.Errorf("load task %s: %w", id, err)
	}
	m, err := task.Metrics(ctx)
	if err != nil {
		return Usage{}, fmt.Errorf("metrics of task %s: %w", id, err)
	}
	v, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return Usage{}, fmt.Errorf("decode metrics of task %s: %w", id, err)
	}
	switch st := v.(type) {
	case *cgroup1stats.Metrics:
		u := Usage{
			CPU:             time.Duration(st.GetCPU().GetUsage().GetTotal()),
			MemoryPeakBytes: st.GetMemory().GetUsage().GetMax(),
			Pids:            st.GetPids().GetCurrent(),
		}
		usage, inactive := st.GetMemory().GetUsage().GetUsage(), st.GetMemory().GetTotalInactiveFile()
		if inactive < usage {
			u.MemoryBytes = usage - inactive
		}
		return u, nil
	case *cgroup2stats.Metrics:
		u := Usage{
			CPU:             time.Duration(st.GetCPU().GetUsageUsec()) * time.Microsecond,
			MemoryPeakBytes: st.GetMemory().GetMaxUsage(),
			Pids:            st.GetPids().GetCurrent(),
		}
		usage, inactive := st.GetMemory().GetUsage(), st.GetMemory().GetInactiveFile()
		if inactive < usage {
			u.MemoryBytes = usage - inactive
		}
		return u, nil
	default:
		return Usage{}, fmt.Errorf("metrics of task %s: unknown type %T", id, v)
	}
}
