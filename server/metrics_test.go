package server

import (
	"slices"
	"strings"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// TestStateLabel: every state a sandbox reports has a berth_sandboxes label
// of its own, its name in the API, and the collector emits it; paused and
// hibernated sandboxes were counted as stopped.
func TestStateLabel(t *testing.T) {
	for v, name := range berthv1.SandboxState_name {
		st := berthv1.SandboxState(v)
		if st == berthv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
			continue
		}
		want := strings.ToLower(strings.TrimPrefix(name, "SANDBOX_STATE_"))
		if got := stateLabel(st); got != want {
			t.Errorf("stateLabel(%s) = %q, want %q", name, got, want)
		}
		if !slices.Contains(metrics.SandboxStates, want) {
			t.Errorf("metrics.SandboxStates %v lacks %q: a scrape would not show %s", metrics.SandboxStates, want, name)
		}
	}
}
