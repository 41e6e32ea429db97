package lifecycle

import (
	"math"
	"testing"
	"time"

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

// TestEndAdmission: work admitted beside standby members that ends
// without keeping its room (a create, claim or fork that failed) tells
// the pool, after its admission is released, so that a member refused
// for that room (or that gave way to it) is made again now, not after
// some later delete; work that kept its room does not (it would cost a
// refused admission).
func TestEndAdmission(t *testing.T) {
	mk := &fakeMaker{busy: true}
	p := runStandbyPool(t, mk)
	m := &Manager{pool: p}
	refused := func() int { mk.mu.Lock(); defer mk.mu.Unlock(); return len(mk.refused) }
	p.Want("sb-a", 1)
	waitFor(t, 2*time.Second, "sb-a's member refused for room", func() bool { key, _ := p.next(); return key == "" && refused() == 1 })

	m.endAdmission(func() {}, true) // a create that made its sandbox: the room stays taken
	if key, _ := p.next(); key != "" || refused() != 1 {
		t.Fatalf("after work that kept its room: next = %q, %d refusals; want nothing retried", key, refused())
	}

	released := false
	m.endAdmission(func() {
		p.mu.Lock()
		told := p.freed
		p.mu.Unlock()
		if told {
			t.Error("the pool was told of the room before the admission was released: its retry could be refused")
		}
		mk.mu.Lock()
		mk.busy = false // the failed create's room is free again
		mk.mu.Unlock()
		released = true
	}, false)
	if !released {
		t.Fatal("endAdmission did not release the admission")
	}
	waitFor(t, 2*time.Second, "sb-a's member made after a failed create released its room", func() bool { return p.Ready(standbyKey("sb-a")) == 1 })
}
