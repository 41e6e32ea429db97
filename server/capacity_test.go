package server

import (
	"context"
	"errors"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestAdmitExec(t *testing.T) {
	c := newCapacity(Config{MaxExecsPerSandbox: 2, MaxExecs: 3, BusyRetryDelay: time.Second}, nil)
	busy := func(err error) *fleetBusyError {
		t.Helper()
		var b *fleetBusyError
		if !errors.As(err, &b) {
			t.Fatalf("admitExec error = %v, want a *fleetBusyError", err)
		}
		return b
	}
	a1, err := c.admitExec("a")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.admitExec("a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.admitExec("a")
	if b := busy(err); b.resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS || b.limit != 2 || b.inUse != 2 || b.retryDelay != time.Second {
		t.Errorf("third exec in a = %+v, want SANDBOX_EXECS limit 2 in use 2", b)
	}
	b1, err := c.admitExec("b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.admitExec("c")
	if b := busy(err); b.resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS || b.limit != 3 || b.inUse != 3 {
		t.Errorf("fourth exec = %+v, want SERVER_EXECS limit 3 in use 3", b)
	}
	a1.release()
	a1.release() // idempotent
	if sb, all := c.running("a"); sb != 1 || all != 2 {
		t.Errorf("after a release: %d in a, %d in all; want 1, 2", sb, all)
	}
	if _, err := c.admitExec("c"); err != nil {
		t.Errorf("exec after a release: %v", err)
	}
	a2.release()
	b1.release()
	var nilSlot *execSlot
	nilSlot.release() // safe
	if sb, all := c.running("a"); sb != 0 || all != 1 {
		t.Errorf("after releases: %d in a, %d in all; want 0, 1", sb, all)
	}
}

func TestAdmitExecUnlimited(t *testing.T) {
	c := newCapacity(Config{}, nil)
	for i := range 1000 {
		if _, err := c.admitExec("a"); err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
	}
}

func TestAdmitSandbox(t *testing.T) {
	existing := map[string]uint64{"a": 100, "b": 0}
	usage := func(context.Context) (map[string]uint64, error) { return existing, nil }
	ctx := context.Background()

	t.Run("count", func(t *testing.T) {
		c := newCapacity(Config{MaxSandboxes: 3}, usage)
		release, err := c.admitSandbox(ctx, "c", 0)
		if err != nil {
			t.Fatal(err)
		}
		// c is pending: the server is full until it is released.
		var b *fleetBusyError
		if _, err := c.admitSandbox(ctx, "d", 0); !errors.As(err, &b) || b.resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES || b.inUse != 3 || b.limit != 3 || b.sandboxID != "d" {
			t.Errorf("d while c pending = %v, want SANDBOXES in use 3 of 3", err)
		}
		// An existing or pending id is admitted: its creation returns it or
		// fails with SANDBOX_EXISTS.
		for _, id := range []string{"a", "c"} {
			if r, err := c.admitSandbox(ctx, id, 0); err != nil {
				t.Errorf("existing %s: %v", id, err)
			} else {
				r()
			}
		}
		release()
		release()
		if r, err := c.admitSandbox(ctx, "d", 0); err != nil {
			t.Errorf("d after c released: %v", err)
		} else {
			r()
		}
	})
	t.Run("memory", func(t *testing.T) {
		c := newCapacity(Config{MemoryBudgetBytes: 300}, usage)
		release, err := c.admitSandbox(ctx, "c", 150)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		var b *fleetBusyError
		if _, err := c.admitSandbox(ctx, "d", 51); !errors.As(err, &b) || b.resource != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY || b.inUse != 250 || b.requested != 51 || b.limit != 300 {
			t.Errorf("d = %v, want MEMORY in use 250 requested 51 of 300", err)
		}
		if r, err := c.admitSandbox(ctx, "d", 50); err != nil {
			t.Errorf("d with what fits: %v", err)
		} else {
			r()
		}
		// No memory cap: not counted against the budget.
		if r, err := c.admitSandbox(ctx, "e", 0); err != nil {
			t.Errorf("e without a cap: %v", err)
		} else {
			r()
		}
	})
	t.Run("usage fails", func(t *testing.T) {
		c := newCapacity(Config{MaxSandboxes: 1}, func(context.Context) (map[string]uint64, error) { return nil, errors.New("containerd down") })
		var b *fleetBusyError
		if _, err := c.admitSandbox(ctx, "x", 0); err == nil || errors.As(err, &b) {
			t.Errorf("admit with usage failing = %v, want a plain error", err)
		}
	})
	t.Run("no limits asks nothing", func(t *testing.T) {
		c := newCapacity(Config{}, nil) // a nil usage would panic if called
		if r, err := c.admitSandbox(ctx, "x", 1<<40); err != nil {
			t.Error(err)
		} else {
			r()
		}
	})
}

// TestAdmitSandboxMemoryNoWrap: memory caps near 2^64, from a request or
// from sandboxes' records, must not wrap the budget's sum and be admitted.
func TestAdmitSandboxMemoryNoWrap(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		existing map[string]uint64
		request  uint64
	}{
		{"request", map[string]uint64{"a": 100}, 1<<64 - 50},
		{"records", map[string]uint64{"a": 1<<64 - 10, "b": 20}, 1},
		{"both", map[string]uint64{"a": 1 << 63}, 1 << 63},
	} {
		usage := func(context.Context) (map[string]uint64, error) { return tc.existing, nil }
		c := newCapacity(Config{MemoryBudgetBytes: 300}, usage)
		var b *fleetBusyError
		if _, err := c.admitSandbox(ctx, "new", tc.request); !errors.As(err, &b) || b.resource != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY {
			t.Errorf("%s: admitSandbox(%d) with %v promised = %v, want FLEET_BUSY for memory", tc.name, tc.request, tc.existing, err)
		}
	}
}
