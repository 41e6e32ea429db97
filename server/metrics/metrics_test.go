package metrics

import "testing"

// TestFleetConflicts checks that berth_fleet_sandbox_conflicts reads its
// source at each scrape.
func TestFleetConflicts(t *testing.T) {
	m := New()
	n := 2
	m.SetFleetConflicts(func() int { return n })
	for _, want := range []int{2, 0} {
		n = want
		families, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := -1.0
		for _, f := range families {
			if f.GetName() == "berth_fleet_sandbox_conflicts" && len(f.GetMetric()) == 1 {
				got = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if got != float64(want) {
			t.Errorf("berth_fleet_sandbox_conflicts = %v, want %d", got, want)
		}
	}
}
