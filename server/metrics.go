package server

import (
	"context"
	"fmt"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// MetricsSnapshot implements metrics.Source: sandboxes by state from
// containerd (as ListSandboxes sees them), the warm pool, and what is in
// use of each admission limit.
func (s *Service) MetricsSnapshot(ctx context.Context) (metrics.Snapshot, error) {
	snap := metrics.Snapshot{Sandboxes: map[string]int{}, WarmPoolReady: map[string]int{}}
	for image := range s.cfg.WarmPool {
		snap.WarmPoolReady[image] = s.life.WarmPoolReady(image)
	}
	_, execs := s.capacity.Running("")
	snap.Capacity = append(snap.Capacity,
		metrics.Capacity{Resource: "server_execs", InUse: uint64(execs), Limit: uint64(s.cfg.MaxExecs)},
		metrics.Capacity{Resource: "run_output_bytes", InUse: s.runBuffers.Used(), Limit: s.runBuffers.Limit()})
	sbs, err := s.rt.List(ctx, nil)
	if err != nil {
		return snap, fmt.Errorf("list sandboxes: %w", err)
	}
	var mem, disk uint64
	for _, sb := range sbs {
		mem += sb.MemoryBytes
		disk += sb.DiskBytes
		if sb.Pooled {
			snap.Sandboxes["pooled"]++
			continue
		}
		snap.Sandboxes[stateLabel(s.sandboxes.Describe(sb, nil, nil).GetState())]++
	}
	snap.Capacity = append(snap.Capacity,
		metrics.Capacity{Resource: "sandboxes", InUse: uint64(len(sbs)), Limit: uint64(s.cfg.MaxSandboxes)},
		metrics.Capacity{Resource: "memory_bytes", InUse: mem, Limit: s.cfg.MemoryBudgetBytes},
		metrics.Capacity{Resource: "disk_bytes", InUse: disk, Limit: s.capacity.Limits().DiskBudget})
	return snap, nil
}

// stateLabel is a SandboxState as the metrics' label.
func stateLabel(st berthv1.SandboxState) string {
	switch st {
	case berthv1.SandboxState_SANDBOX_STATE_STARTING:
		return "starting"
	case berthv1.SandboxState_SANDBOX_STATE_RUNNING:
		return "running"
	case berthv1.SandboxState_SANDBOX_STATE_STOPPING:
		return "stopping"
	case berthv1.SandboxState_SANDBOX_STATE_PAUSED:
		return "paused"
	case berthv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		return "hibernated"
	}
	return "stopped"
}

var _ metrics.Source = (*Service)(nil)
