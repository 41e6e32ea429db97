package admit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestAdmitExec(t *testing.T) {
	c := New(Limits{MaxExecsPerSandbox: 2, MaxExecs: 3, RetryDelay: time.Second}, nil, nil)
	busy := func(err error) *apierr.FleetBusy {
		t.Helper()
		var b *apierr.FleetBusy
		if !errors.As(err, &b) {
			t.Fatalf("admitExec error = %v, want a *apierr.FleetBusy", err)
		}
		return b
	}
	a1, err := c.AdmitExec("a")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.AdmitExec("a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AdmitExec("a")
	if b := busy(err); b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS || b.Limit != 2 || b.InUse != 2 || b.RetryDelay != time.Second {
		t.Errorf("third exec in a = %+v, want SANDBOX_EXECS limit 2 in use 2", b)
	}
	b1, err := c.AdmitExec("b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AdmitExec("c")
	if b := busy(err); b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS || b.Limit != 3 || b.InUse != 3 {
		t.Errorf("fourth exec = %+v, want SERVER_EXECS limit 3 in use 3", b)
	}
	a1.Release()
	a1.Release() // idempotent
	if sb, all := c.Running("a"); sb != 1 || all != 2 {
		t.Errorf("after a release: %d in a, %d in all; want 1, 2", sb, all)
	}
	if _, err := c.AdmitExec("c"); err != nil {
		t.Errorf("exec after a release: %v", err)
	}
	a2.Release()
	b1.Release()
	var nilSlot *ExecSlot
	nilSlot.Release() // safe
	if sb, all := c.Running("a"); sb != 0 || all != 1 {
		t.Errorf("after releases: %d in a, %d in all; want 0, 1", sb, all)
	}
}

func TestAdmitExecUnlimited(t *testing.T) {
	c := New(Limits{}, nil, nil)
	for i := range 1000 {
		if _, err := c.AdmitExec("a"); err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
	}
}

func TestAdmitSandbox(t *testing.T) {
	existing := map[string]uint64{"a": 100, "b": 0}
	usage := func(context.Context) (map[string]uint64, error) { return existing, nil }
	ctx := context.Background()

	t.Run("count", func(t *testing.T) {
		c := New(Limits{MaxSandboxes: 3}, nil, usage)
		release, err := c.AdmitSandbox(ctx, "c", 0)
		if err != nil {
			t.Fatal(err)
		}
		// c is pending: the server is full until it is released.
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "d", 0); !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES || b.InUse != 3 || b.Limit != 3 || b.SandboxID != "d" {
			t.Errorf("d while c pending = %v, want SANDBOXES in use 3 of 3", err)
		}
		// An existing or pending id is admitted: its creation returns it or
		// fails with SANDBOX_EXISTS.
		for _, id := range []string{"a", "c"} {
			if r, err := c.AdmitSandbox(ctx, id, 0); err != nil {
				t.Errorf("existing %s: %v", id, err)
			} else {
				r()
			}
		}
		release()
		release()
		if r, err := c.AdmitSandbox(ctx, "d", 0); err != nil {
			t.Errorf("d after c released: %v", err)
		} else {
			r()
		}
	})
	t.Run("memory", func(t *testing.T) {
		c := New(Limits{MemoryBudget: 300}, nil, usage)
		release, err := c.AdmitSandbox(ctx, "c", 150)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "d", 51); !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY || b.InUse != 250 || b.Requested != 51 || b.Limit != 300 {
			t.Errorf("d = %v, want MEMORY in use 250 requested 51 of 300", err)
		}
		if r, err := c.AdmitSandbox(ctx, "d", 50); err != nil {
			t.Errorf("d with what fits: %v", err)
		} else {
			r()
		}
		// No memory cap: not counted against the budget.
		if r, err := c.AdmitSandbox(ctx, "e", 0); err != nil {
			t.Errorf("e without a cap: %v", err)
		} else {
			r()
		}
	})
	t.Run("usage fails", func(t *testing.T) {
		c := New(Limits{MaxSandboxes: 1}, nil, func(context.Context) (map[string]uint64, error) { return nil, errors.New("containerd down") })
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "x", 0); err == nil || errors.As(err, &b) {
			t.Errorf("admit with usage failing = %v, want a plain error", err)
		}
	})
	t.Run("no limits asks nothing", func(t *testing.T) {
		c := New(Limits{}, nil, nil) // a nil usage would panic if called
		if r, err := c.AdmitSandbox(ctx, "x", 1<<40); err != nil {
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
		c := New(Limits{MemoryBudget: 300}, nil, usage)
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "new", tc.request); !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY {
			t.Errorf("%s: admitSandbox(%d) with %v promised = %v, want FLEET_BUSY for memory", tc.name, tc.request, tc.existing, err)
		}
	}
}
