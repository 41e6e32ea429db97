package server

import (
	"context"
	"fmt"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// Observer receives what berthd's handlers count; *metrics.Metrics
// implements it for Prometheus. Its methods must be cheap and must not
// block: they run on the request paths, output events included.
type Observer interface {
	// SandboxCreated: a create that made a new sandbox (warm false) or
	// handed out a warm-pool member (warm true) answered after took.
	SandboxCreated(warm bool, took time.Duration)
	// ExecStarted: a new exec started (its ExecStarted came back).
	ExecStarted()
	// ExecEnded: an exec this berthd started ended; outcome is one of
	// metrics.Outcome*. Called once per ExecStarted.
	ExecEnded(outcome string)
	// OutputSent: n bytes of stream ("stdout", "stderr") went to a caller.
	OutputSent(stream string, n int)
	// OutputDropped: a caller was told n output bytes were lost.
	OutputDropped(n uint64)
	// FileBytes: n bytes of file content moved "in" or "out" of a sandbox.
	FileBytes(direction string, n int)
	// AgentRestarted: berthd started a new task for a sandbox whose agent
	// died.
	AgentRestarted()
}

// noObserver is the Observer of a Service configured without one.
type noObserver struct{}

func (noObserver) SandboxCreated(bool, time.Duration) {}
func (noObserver) ExecStarted()                       {}
func (noObserver) ExecEnded(string)                   {}
func (noObserver) OutputSent(string, int)             {}
func (noObserver) OutputDropped(uint64)               {}
func (noObserver) FileBytes(string, int)              {}
func (noObserver) AgentRestarted()                    {}

// streamName is a Stream as the observer's label.
func streamName(s berthv1.Stream) string {
	if s == berthv1.Stream_STREAM_STDERR {
		return "stderr"
	}
	return "stdout"
}

// outcome classifies an exec's result for ExecEnded.
func outcome(res *berthv1.ExecResult) string {
	switch {
	case res.GetOomKilled():
		return metrics.OutcomeOOMKilled
	case res.GetTimedOut():
		return metrics.OutcomeTimedOut
	case res.GetSignal() != "":
		return metrics.OutcomeSignaled
	case res.GetExitCode() == 0:
		return metrics.OutcomeSuccess
	}
	return metrics.OutcomeFailure
}

// MetricsSnapshot implements metrics.Source: sandboxes by state from
// containerd (as ListSandboxes sees them), the warm pool, and what is in
// use of each admission limit.
func (s *Service) MetricsSnapshot(ctx context.Context) (metrics.Snapshot, error) {
	snap := metrics.Snapshot{Sandboxes: map[string]int{}, WarmPoolReady: map[string]int{}}
	for image := range s.cfg.WarmPool {
		snap.WarmPoolReady[image] = s.pool.Ready(image)
	}
	_, execs := s.capacity.running("")
	snap.Capacity = append(snap.Capacity,
		metrics.Capacity{Resource: "server_execs", InUse: uint64(execs), Limit: uint64(s.cfg.MaxExecs)},
		metrics.Capacity{Resource: "run_output_bytes", InUse: s.runBuffers.Used(), Limit: s.runBuffers.Limit()})
	sbs, err := s.rt.List(ctx, nil)
	if err != nil {
		return snap, fmt.Errorf("list sandboxes: %w", err)
	}
	var mem uint64
	for _, sb := range sbs {
		mem += sb.MemoryBytes
		if sb.Pooled {
			snap.Sandboxes["pooled"]++
			continue
		}
		snap.Sandboxes[stateLabel(s.sandboxProto(sb, nil, nil).GetState())]++
	}
	snap.Capacity = append(snap.Capacity,
		metrics.Capacity{Resource: "sandboxes", InUse: uint64(len(sbs)), Limit: uint64(s.cfg.MaxSandboxes)},
		metrics.Capacity{Resource: "memory_bytes", InUse: mem, Limit: s.cfg.MemoryBudgetBytes})
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
	}
	return "stopped"
}

var _ metrics.Source = (*Service)(nil)
