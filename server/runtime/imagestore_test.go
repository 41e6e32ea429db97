package runtime

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestImageBudget: the budget refuses the byte that passes the bound, keeps
// refusing after, and a sum that would wrap past 2^64 is refused, not
// wrapped under the bound.
func TestImageBudget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		used, limit uint64
		adds        []uint64
		refusedAt   int // index of the first refused add; -1: none
		wantAdding  uint64
	}{
		{name: "fits exactly", used: 60, limit: 100, adds: []uint64{30, 10}, refusedAt: -1, wantAdding: 40},
		{name: "one byte over", used: 60, limit: 100, adds: []uint64{30, 11, 1}, refusedAt: 1, wantAdding: 41},
		{name: "store already over", used: 150, limit: 100, adds: []uint64{1}, refusedAt: 0, wantAdding: 1},
		{name: "sum wraps", used: 10, limit: math.MaxUint64, adds: []uint64{math.MaxUint64 - 20, 30}, refusedAt: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &imageBudget{full: ImageStoreFull{LimitBytes: tc.limit, UsedBytes: tc.used}}
			refusedAt := -1
			for i, n := range tc.adds {
				if err := b.add(n); err != nil && refusedAt < 0 {
					refusedAt = i
				} else if err == nil && refusedAt >= 0 {
					t.Fatalf("add %d succeeded after add %d was refused", i, refusedAt)
				}
			}
			if refusedAt != tc.refusedAt {
				t.Fatalf("first refusal at add %d; want %d", refusedAt, tc.refusedAt)
			}
			err := b.exceeded()
			if (err != nil) != (tc.refusedAt >= 0) {
				t.Fatalf("exceeded() = %v after refusal at %d", err, refusedAt)
			}
			if err == nil {
				return
			}
			var full *ImageStoreFull
			if !errors.As(err, &full) || !errors.Is(err, ErrImageStoreFull) {
				t.Fatalf("exceeded() = %T %v; want an *ImageStoreFull", err, err)
			}
			if full.LimitBytes != tc.limit || full.UsedBytes != tc.used || (tc.wantAdding != 0 && full.AddingBytes != tc.wantAdding) {
				t.Errorf("refusal %+v; want limit %d, used %d, adding %d", *full, tc.limit, tc.used, tc.wantAdding)
			}
			if !strings.Contains(err.Error(), "--max-image-store-bytes") {
				t.Errorf("refusal %q does not name the flag that sets the bound", err)
			}
		})
	}
	var none *imageBudget
	if err := none.add(math.MaxUint64); err != nil || none.exceeded() != nil {
		t.Errorf("a nil budget refused: %v", err)
	}
}
