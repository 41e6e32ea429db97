package lifecycle

import (
	"math"
	"testing"

	"github.com/berth-sandbox/berth/server/apierr"
)

// TestStandbyCovers: members give way only when together they hold what
// the refusal lacks (InUse + Requested - Limit).
func TestStandbyCovers(t *testing.T) {
	busy := &apierr.FleetBusy{Limit: 300, InUse: 300, Requested: 200} // lacks 200
	for _, tc := range []struct {
		holds  map[string]uint64
		counts map[string]int
		want   bool
	}{
		{map[string]uint64{"p": 100}, map[string]int{"p": 1}, false},
		{map[string]uint64{"p": 100}, map[string]int{"p": 2}, true},
		{map[string]uint64{"p": 100, "q": 100}, map[string]int{"p": 1, "q": 1}, true},
		{map[string]uint64{"p": 100}, map[string]int{"p": 1, "q": 5}, false}, // q's members hold none of it
		{nil, map[string]int{"p": 3}, false},
	} {
		if got := standbyCovers(busy, tc.holds, tc.counts); got != tc.want {
			t.Errorf("standbyCovers(lacking 200, holds %v, counts %v) = %v, want %v", tc.holds, tc.counts, got, tc.want)
		}
	}
	if !standbyCovers(&apierr.FleetBusy{Limit: 3, InUse: 3, Requested: 1}, map[string]uint64{"p": 1}, map[string]int{"p": 1}) {
		t.Error("one member does not cover a sandbox cap one short")
	}
	if standbyCovers(&apierr.FleetBusy{Limit: 3, InUse: 1, Requested: math.MaxUint64}, map[string]uint64{"p": math.MaxUint64}, map[string]int{"p": 1}) {
		t.Error("a request no limit holds is covered")
	}
}
