package lifecycle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestHealth: a node's containerd that does not answer, a full sandbox
// pool, or agents that do not start make the node unhealthy with that
// reason, each change is reported once, and the node is healthy again when
// containerd answers, a create succeeds, or a fault seen by creates is
// older than healthFaultHold (issue 22).
func TestHealth(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var changes []string
	h := &health{onChange: func(h cluster.Health) { changes = append(changes, h.Reason) }}
	want := func(step, reason string) {
		t.Helper()
		if got := h.get().Reason; got != reason {
			t.Errorf("%s: reason %q, want %q", step, got, reason)
		}
	}
	down := &runtime.UnavailableError{Op: "ask containerd its version", Err: errors.New("connection refused")}
	h.probed(t0, nil)
	want("first probe answered", "")
	h.probed(t0.Add(time.Second), down)
	h.probed(t0.Add(2*time.Second), down)
	want("containerd down", cluster.HealthContainerd)
	if since := h.get().Since; !since.Equal(t0.Add(time.Second)) {
		t.Errorf("since %v, want the first failed probe's %v", since, t0.Add(time.Second))
	}
	h.probed(t0.Add(3*time.Second), nil)
	want("containerd back", "")

	// A create that found containerd gone marks the node at once.
	h.created(t0.Add(4*time.Second), false, fmt.Errorf("read sandbox sb-1: %w", down))
	want("create saw containerd down", cluster.HealthContainerd)
	h.probed(t0.Add(5*time.Second), nil)

	full := &runtime.PoolFullError{Pool: "the btrfs pool /p", Op: "create sandbox sb-2", Err: errors.New("no space left on device")}
	h.created(t0.Add(6*time.Second), false, full)
	want("pool full", cluster.HealthNoSpace)
	h.probed(t0.Add(7*time.Second), nil)
	want("pool full, containerd answers", cluster.HealthNoSpace)
	h.probed(t0.Add(6*time.Second+healthFaultHold+time.Second), nil)
	want("pool full, held long enough", "")

	launch := fmt.Errorf("%w: agent of sandbox sb-3 did not answer within 10s", apierr.ErrUnreachable)
	for i := range launchFailuresUnhealthy - 1 {
		h.created(t0.Add(time.Minute+time.Duration(i)*time.Second), true, launch)
	}
	want("agent launches failing, below the count", "")
	h.created(t0.Add(2*time.Minute), true, launch)
	want("agent launches failing", cluster.HealthAgentLaunch)
	h.created(t0.Add(2*time.Minute+time.Second), true, nil)
	want("a create succeeded", "")

	if fmt.Sprint(changes) != fmt.Sprint([]string{cluster.HealthContainerd, "", cluster.HealthContainerd, "", cluster.HealthNoSpace, "", cluster.HealthAgentLaunch, ""}) {
		t.Errorf("changes reported %q, want one per change", changes)
	}
}

// TestHealthPoolSpace: a pool with less than poolMinFree left (at least
// 1% of it) makes the node unhealthy (NO_SPACE) at the probe, before a
// create fails there, and healthy again soon after space came back; a
// fault a create saw is not cut short by a probe that finds room.
func TestHealthPoolSpace(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &health{}
	const gib = 1 << 30
	h.poolSpace(t0, runtime.PoolSpace{Pool: "the btrfs pool /p", FreeBytes: 10 * gib, SizeBytes: 20 * gib})
	if r := h.get().Reason; r != "" {
		t.Fatalf("10 GiB free: reason %q, want healthy", r)
	}
	h.poolSpace(t0.Add(time.Second), runtime.PoolSpace{Pool: "the btrfs pool /p", FreeBytes: 100 << 20, SizeBytes: 20 * gib})
	if r := h.get().Reason; r != cluster.HealthNoSpace {
		t.Fatalf("100 MiB free of 20 GiB: reason %q, want %s", r, cluster.HealthNoSpace)
	}
	// Space back: healthy within a few probes.
	h.probed(t0.Add(2*time.Second), nil)
	h.poolSpace(t0.Add(2*time.Second), runtime.PoolSpace{FreeBytes: 10 * gib, SizeBytes: 20 * gib})
	h.probed(t0.Add(6*time.Second), nil)
	if r := h.get().Reason; r != "" {
		t.Errorf("space back for 4s: reason %q, want healthy", r)
	}
	// A create's NO_SPACE (a quota group's, say) holds its full time.
	h.created(t0.Add(10*time.Second), false, &runtime.PoolFullError{Pool: "the btrfs pool /p", Err: errors.New("no space left on device")})
	h.poolSpace(t0.Add(11*time.Second), runtime.PoolSpace{FreeBytes: 10 * gib, SizeBytes: 20 * gib})
	h.probed(t0.Add(15*time.Second), nil)
	if r := h.get().Reason; r != cluster.HealthNoSpace {
		t.Errorf("5s after a create's NO_SPACE: reason %q, want %s", r, cluster.HealthNoSpace)
	}
}
