package admit

import (
	"context"
	"errors"
	"strings"
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
	existing := map[string]Held{"a": {MemoryBytes: 100}, "b": {}}
	usage := func(context.Context) (map[string]Held, error) { return existing, nil }
	ctx := context.Background()

	t.Run("count", func(t *testing.T) {
		c := New(Limits{MaxSandboxes: 3}, nil, usage)
		release, err := c.AdmitSandbox(ctx, "c", Held{})
		if err != nil {
			t.Fatal(err)
		}
		// c is pending: the server is full until it is released.
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "d", Held{}); !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES || b.InUse != 3 || b.Limit != 3 || b.SandboxID != "d" {
			t.Errorf("d while c pending = %v, want SANDBOXES in use 3 of 3", err)
		}
		// An existing or pending id is admitted: its creation returns it or
		// fails with SANDBOX_EXISTS.
		for _, id := range []string{"a", "c"} {
			if r, err := c.AdmitSandbox(ctx, id, Held{}); err != nil {
				t.Errorf("existing %s: %v", id, err)
			} else {
				r()
			}
		}
		release()
		release()
		if r, err := c.AdmitSandbox(ctx, "d", Held{}); err != nil {
			t.Errorf("d after c released: %v", err)
		} else {
			r()
		}
	})
	t.Run("memory", func(t *testing.T) {
		c := New(Limits{MemoryBudget: 300}, nil, usage)
		release, err := c.AdmitSandbox(ctx, "c", Held{MemoryBytes: 150})
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "d", Held{MemoryBytes: 51}); !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY || b.InUse != 250 || b.Requested != 51 || b.Limit != 300 {
			t.Errorf("d = %v, want MEMORY in use 250 requested 51 of 300", err)
		}
		if r, err := c.AdmitSandbox(ctx, "d", Held{MemoryBytes: 50}); err != nil {
			t.Errorf("d with what fits: %v", err)
		} else {
			r()
		}
		// No memory cap: not counted against the budget.
		if r, err := c.AdmitSandbox(ctx, "e", Held{}); err != nil {
			t.Errorf("e without a cap: %v", err)
		} else {
			r()
		}
	})
	t.Run("usage fails", func(t *testing.T) {
		c := New(Limits{MaxSandboxes: 1}, nil, func(context.Context) (map[string]Held, error) { return nil, errors.New("containerd down") })
		var b *apierr.FleetBusy
		if _, err := c.AdmitSandbox(ctx, "x", Held{}); err == nil || errors.As(err, &b) {
			t.Errorf("admit with usage failing = %v, want a plain error", err)
		}
	})
	t.Run("no limits asks nothing", func(t *testing.T) {
		c := New(Limits{}, nil, nil) // a nil usage would panic if called
		if r, err := c.AdmitSandbox(ctx, "x", Held{MemoryBytes: 1 << 40, DiskBytes: 1 << 40}); err != nil {
			t.Error(err)
		} else {
			r()
		}
	})
}

// TestAdmitSandboxNoWrap: caps near 2^64, from a request or from
// sandboxes' records, must not wrap a sum and be admitted: not the
// server's memory or disk budget, nor a principal's caps.
func TestAdmitSandboxNoWrap(t *testing.T) {
	ctx := context.Background()
	const budget = 300
	mem := func(b uint64) Held { return Held{Owner: "p", MemoryBytes: b} }
	disk := func(b uint64) Held { return Held{Owner: "p", DiskBytes: b} }
	limits := map[berthv1.CapacityResource]Limits{
		berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY:           {MemoryBudget: budget},
		berthv1.CapacityResource_CAPACITY_RESOURCE_DISK:             {DiskBudget: budget},
		berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY: {PerPrincipal: PrincipalLimits{MemoryBytes: budget}},
		berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK:   {PerPrincipal: PrincipalLimits{DiskBytes: budget}},
	}
	for _, tc := range []struct {
		name     string
		of       func(uint64) Held
		resource []berthv1.CapacityResource
	}{
		{"memory", mem, []berthv1.CapacityResource{berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY}},
		{"disk", disk, []berthv1.CapacityResource{berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK}},
	} {
		for _, r := range tc.resource {
			for _, sums := range []struct {
				name     string
				existing map[string]uint64
				request  uint64
			}{
				{"request", map[string]uint64{"a": 100}, 1<<64 - 50},
				{"records", map[string]uint64{"a": 1<<64 - 10, "b": 20}, 1},
				{"both", map[string]uint64{"a": 1 << 63}, 1 << 63},
			} {
				existing := map[string]Held{}
				for id, b := range sums.existing {
					existing[id] = tc.of(b)
				}
				c := New(limits[r], nil, func(context.Context) (map[string]Held, error) { return existing, nil })
				var b *apierr.FleetBusy
				if _, err := c.AdmitSandbox(ctx, "new", tc.of(sums.request)); !errors.As(err, &b) || b.Resource != r {
					t.Errorf("%s %s: AdmitSandbox(%d) with %v held = %v, want FLEET_BUSY for %v", tc.name, sums.name, sums.request, sums.existing, err, r)
				}
			}
		}
	}
}

// TestAdmitSandboxDisk sums disk quotas against the disk budget (the btrfs
// pool's size): two quotas that fill the pool leave no room for a third,
// and one larger than the pool is refused on an empty server.
func TestAdmitSandboxDisk(t *testing.T) {
	ctx := context.Background()
	const gib = 1 << 30
	existing := map[string]Held{"a": {Owner: "p", DiskBytes: 10 * gib}, "pooled": {Pooled: true, DiskBytes: 5 * gib}, "none": {Owner: "q"}}
	c := New(Limits{DiskBudget: 20 * gib}, nil, func(context.Context) (map[string]Held, error) { return existing, nil })
	var b *apierr.FleetBusy
	if _, err := c.AdmitSandbox(ctx, "big", Held{Owner: "q", DiskBytes: 30 * gib}); !errors.As(err, &b) ||
		b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_DISK || b.Limit != 20*gib || b.InUse != 15*gib || b.Requested != 30*gib || b.Principal != "" {
		t.Errorf("30 GiB on a 20 GiB pool = %v (%+v), want DISK limit 20 GiB in use 15 GiB requested 30 GiB", err, b)
	}
	release, err := c.AdmitSandbox(ctx, "fits", Held{Owner: "q", DiskBytes: 5 * gib})
	if err != nil {
		t.Fatalf("5 GiB with 15 GiB of 20 promised: %v", err)
	}
	// "fits" is pending: the pool is promised in full until it is released.
	if _, err := c.AdmitSandbox(ctx, "one-more", Held{Owner: "q", DiskBytes: 1}); !errors.As(err, &b) || b.InUse != 20*gib {
		t.Errorf("a byte more while fits is pending = %v, want DISK in use 20 GiB", err)
	}
	// No quota is not counted against the budget.
	if r, err := c.AdmitSandbox(ctx, "no-quota", Held{Owner: "q"}); err != nil {
		t.Errorf("a sandbox without a disk quota: %v", err)
	} else {
		r()
	}
	release()
	if r, err := c.AdmitSandbox(ctx, "one-more", Held{Owner: "q", DiskBytes: 5 * gib}); err != nil {
		t.Errorf("5 GiB after fits released: %v", err)
	} else {
		r()
	}
	u, err := c.Usage(ctx, map[string]Held{"creating": {DiskBytes: gib}, "a": {DiskBytes: 99 * gib}})
	if err != nil {
		t.Fatal(err)
	}
	if u.DiskBytes != 16*gib || u.DiskBudget != 20*gib || u.Sandboxes != 4 {
		t.Errorf("Usage = %+v, want 4 sandboxes holding 16 GiB of a 20 GiB disk budget", u)
	}
}

// TestAdmitSandboxPerPrincipal caps each principal's sandboxes, memory and
// disk on its own: one principal at its cap is refused, naming itself,
// while another still creates; unclaimed warm-pool members count for no
// one, and a claim counts for the claimant.
func TestAdmitSandboxPerPrincipal(t *testing.T) {
	ctx := context.Background()
	existing := map[string]Held{
		"a1":     {Owner: "alice", MemoryBytes: 100, DiskBytes: 1000},
		"a2":     {Owner: "alice", MemoryBytes: 100, DiskBytes: 1000},
		"b1":     {Owner: "bob", MemoryBytes: 100, DiskBytes: 1000},
		"pool-1": {Pooled: true, MemoryBytes: 100, DiskBytes: 1000},
		"pool-2": {Pooled: true, MemoryBytes: 100, DiskBytes: 1000},
	}
	usage := func(context.Context) (map[string]Held, error) { return existing, nil }
	for _, tc := range []struct {
		name   string
		limits PrincipalLimits
		want   Held // alice's next sandbox, refused
		// resource, limit, in use and requested of the refusal
		resource                berthv1.CapacityResource
		limit, inUse, requested uint64
	}{
		{"sandboxes", PrincipalLimits{MaxSandboxes: 2}, Held{}, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES, 2, 2, 1},
		{"memory", PrincipalLimits{MemoryBytes: 250}, Held{MemoryBytes: 51}, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY, 250, 200, 51},
		{"disk", PrincipalLimits{DiskBytes: 2500}, Held{DiskBytes: 501}, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK, 2500, 2000, 501},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Limits{PerPrincipal: tc.limits}, nil, usage)
			alice := tc.want
			alice.Owner = "alice"
			var b *apierr.FleetBusy
			if _, err := c.AdmitSandbox(ctx, "a3", alice); !errors.As(err, &b) || b.Resource != tc.resource || b.Principal != "alice" ||
				b.Limit != tc.limit || b.InUse != tc.inUse || b.Requested != tc.requested || b.SandboxID != "a3" {
				t.Errorf("alice's a3 = %v (%+v), want %v of alice limit %d in use %d requested %d", err, b, tc.resource, tc.limit, tc.inUse, tc.requested)
			}
			if b != nil && !strings.Contains(b.Error(), `"alice"`) {
				t.Errorf("refusal %q does not name the principal", b.Error())
			}
			bob := tc.want
			bob.Owner = "bob"
			rb, err := c.AdmitSandbox(ctx, "b2", bob)
			if err != nil {
				t.Fatalf("bob's b2 beside alice at her cap: %v", err)
			}
			defer rb()
			// The warm pool makes members for no one.
			if r, err := c.AdmitSandbox(ctx, "pool-3", Held{Pooled: true, MemoryBytes: 100, DiskBytes: 1000}); err != nil {
				t.Errorf("a warm-pool member: %v", err)
			} else {
				r()
			}
			// Claiming a member counts it for the claimant: alice may not,
			// carol may, and while carol's claim is pending the member is
			// hers.
			if _, err := c.AdmitClaim(ctx, "pool-1", "alice", existing["pool-1"]); !errors.As(err, &b) || b.Principal != "alice" {
				t.Errorf("alice claims pool-1 = %v, want FLEET_BUSY for alice", err)
			}
			rc, err := c.AdmitClaim(ctx, "pool-1", "carol", existing["pool-1"])
			if err != nil {
				t.Fatalf("carol claims pool-1: %v", err)
			}
			defer rc()
			u, err := c.Usage(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if u.Sandboxes != 6 || u.MemoryBytes != 500+bob.MemoryBytes || u.DiskBytes != 5000+bob.DiskBytes {
				t.Errorf("Usage = %+v, want the claim counted once among 6 sandboxes", u)
			}
		})
	}
	t.Run("no caps asks nothing of a claim", func(t *testing.T) {
		c := New(Limits{MaxSandboxes: 1}, nil, nil) // a nil usage would panic if called
		if r, err := c.AdmitClaim(ctx, "pool-1", "alice", Held{}); err != nil {
			t.Error(err)
		} else {
			r()
		}
	})
}

// TestAdmitSandboxDiskPoolResized: the disk budget is read again at each
// admission (Limits.DiskBudgetNow: berthd's statfs of the pool), not only
// at start: a pool shrunk since refuses what the old size would have
// admitted, one grown admits what it refused, and a failed read keeps the
// budget last read.
func TestAdmitSandboxDiskPoolResized(t *testing.T) {
	ctx := context.Background()
	const gib = 1 << 30
	existing := map[string]Held{"a": {Owner: "p", DiskBytes: 10 * gib}}
	pool, poolErr := uint64(20*gib), error(nil)
	c := New(Limits{DiskBudget: 20 * gib, DiskBudgetNow: func() (uint64, error) { return pool, poolErr }}, nil,
		func(context.Context) (map[string]Held, error) { return existing, nil })
	admit := func(disk uint64) error {
		r, err := c.AdmitSandbox(ctx, "new", Held{Owner: "q", DiskBytes: disk})
		if err == nil {
			r()
		}
		return err
	}
	if err := admit(8 * gib); err != nil {
		t.Fatalf("8 GiB beside 10 GiB on a 20 GiB pool: %v", err)
	}
	pool = 15 * gib // shrunk
	var b *apierr.FleetBusy
	if err := admit(8 * gib); !errors.As(err, &b) || b.Limit != 15*gib || b.InUse != 10*gib {
		t.Errorf("8 GiB beside 10 GiB after the pool shrank to 15 GiB = %v (%+v), want DISK limit 15 GiB in use 10 GiB", err, b)
	}
	if l := c.Limits().DiskBudget; l != 15*gib {
		t.Errorf("Limits().DiskBudget = %d, want the 15 GiB last read", l)
	}
	pool = 40 * gib // grown
	if err := admit(25 * gib); err != nil {
		t.Errorf("25 GiB beside 10 GiB after the pool grew to 40 GiB: %v", err)
	}
	pool, poolErr = 1, errors.New("statfs: EIO")
	if u, err := c.Usage(ctx, nil); err != nil || u.DiskBudget != 40*gib {
		t.Errorf("Usage when the pool cannot be read = %+v, %v; want the 40 GiB budget last read", u, err)
	}
	if err := admit(25 * gib); err != nil {
		t.Errorf("25 GiB when the pool cannot be read (40 GiB last read): %v", err)
	}
}

// TestAdmitStored: stored copies (snapshots, fork copies) count their disk
// against the server's disk budget and their owner's disk cap, and nothing
// else: no sandbox, no memory. A copy past a cap is FLEET_BUSY naming the
// sandbox it is a copy of; one pending counts for the next.
func TestAdmitStored(t *testing.T) {
	held := map[string]Held{
		"sb-a":             {Owner: "alice", MemoryBytes: 100, DiskBytes: 50},
		"berth-snapshot/1": {Owner: "alice", DiskBytes: 40, Stored: true},
		"berth-snapshot/2": {Owner: "bob", DiskBytes: 30, Stored: true},
	}
	c := New(Limits{MaxSandboxes: 1, DiskBudget: 200, PerPrincipal: PrincipalLimits{MaxSandboxes: 1, MemoryBytes: 100, DiskBytes: 100}}, nil,
		func(context.Context) (map[string]Held, error) { return held, nil })
	ctx := context.Background()
	u, err := c.Usage(ctx, nil)
	if err != nil || u.Sandboxes != 1 || u.MemoryBytes != 100 || u.DiskBytes != 120 {
		t.Errorf("Usage = %+v, %v: want 1 sandbox, 100 memory, 120 disk (copies count disk only)", u, err)
	}
	release, err := c.AdmitStored(ctx, "sb-a", "alice", 10)
	if err != nil {
		t.Fatalf("alice's copy of 10 within her cap (50+40+10): %v", err)
	}
	_, err = c.AdmitStored(ctx, "sb-a", "alice", 1)
	var b *apierr.FleetBusy
	if !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK || b.Limit != 100 || b.InUse != 100 || b.Requested != 1 ||
		b.Principal != "alice" || b.SandboxID != "sb-a" {
		t.Errorf("alice's copy past her cap while one is pending = %v (%+v), want PRINCIPAL_DISK limit 100 in use 100 requested 1 for sb-a", err, b)
	}
	release()
	release, err = c.AdmitStored(ctx, "sb-b", "bob", 70)
	if err != nil {
		t.Fatalf("bob's copy (30+70 of his 100; the sandbox caps do not apply to copies): %v", err)
	}
	release()
	_, err = c.AdmitStored(ctx, "sb-b", "bob", 81)
	if !errors.As(err, &b) || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_DISK || b.Limit != 200 || b.InUse != 120 || b.Requested != 81 {
		t.Errorf("a copy past the server's disk budget = %v (%+v), want DISK limit 200 in use 120 requested 81", err, b)
	}
}

// TestHibernatedMemory: a hibernated sandbox holds no memory, so another
// sandbox fits in its place; its wake is admitted again and refused
// (MEMORY, PRINCIPAL_MEMORY) while the memory is taken, admitted once it
// is free, and held for it until released; a checkpoint image (Stored)
// counts against its owner's disk.
func TestHibernatedMemory(t *testing.T) {
	const mib = 1 << 20
	held := map[string]Held{
		"asleep":               {Owner: "alice", MemoryBytes: 64 * mib, DiskBytes: 10 * mib, Hibernated: true},
		"checkpoint-of/asleep": {Owner: "alice", DiskBytes: 30 * mib, Stored: true},
	}
	usage := func(context.Context) (map[string]Held, error) { return held, nil }
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		limits Limits
		want   berthv1.CapacityResource
	}{
		{"server budget", Limits{MemoryBudget: 100 * mib}, berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY},
		{"principal cap", Limits{PerPrincipal: PrincipalLimits{MemoryBytes: 100 * mib}}, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := New(tt.limits, nil, usage)
			release, err := c.AdmitSandbox(ctx, "other", Held{Owner: "alice", MemoryBytes: 64 * mib})
			if err != nil {
				t.Fatalf("a sandbox in the hibernated one's memory: %v, want admitted", err)
			}
			held["other"] = Held{Owner: "alice", MemoryBytes: 64 * mib}
			release()
			defer delete(held, "other")
			_, err = c.AdmitWake(ctx, "asleep")
			var busy *apierr.FleetBusy
			if !errors.As(err, &busy) || busy.Resource != tt.want || busy.InUse != 64*mib || busy.Requested != 64*mib || busy.SandboxID != "asleep" {
				t.Fatalf("AdmitWake with its memory taken: %v (%+v), want FLEET_BUSY %v in use 64 MiB requested 64 MiB", err, busy, tt.want)
			}
			delete(held, "other")
			wake, err := c.AdmitWake(ctx, "asleep")
			if err != nil {
				t.Fatalf("AdmitWake with the memory free: %v", err)
			}
			// Held for the wake: another sandbox does not take it meanwhile.
			if _, err := c.AdmitSandbox(ctx, "third", Held{Owner: "alice", MemoryBytes: 64 * mib}); !errors.As(err, &busy) {
				t.Errorf("a sandbox during the wake: %v, want FLEET_BUSY (the wake holds the memory)", err)
			}
			wake()
			if r, err := c.AdmitSandbox(ctx, "third", Held{Owner: "alice", MemoryBytes: 64 * mib}); err != nil {
				t.Errorf("a sandbox after the wake released (still hibernated in the record): %v", err)
			} else {
				r()
			}
		})
	}
	c := New(Limits{PerPrincipal: PrincipalLimits{DiskBytes: 50 * mib}}, nil, usage)
	_, err := c.AdmitStored(ctx, "asleep", "alice", 20*mib)
	var busy *apierr.FleetBusy
	if !errors.As(err, &busy) || busy.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK || busy.InUse != 40*mib {
		t.Errorf("a 20 MiB copy past 40 MiB held (10 the sandbox, 30 its checkpoint image) under a 50 MiB cap: %v, want PRINCIPAL_DISK in use 40 MiB", err)
	}
	if _, err := c.AdmitWake(ctx, "asleep"); err != nil {
		t.Errorf("AdmitWake without memory limits: %v, want admitted", err)
	}
}

// TestAdmitStandbyMember: a fork standby member (Held.Standby) counts for
// its parent's owner: a member of alice's past her cap is refused, and
// her members fill her cap for her own next sandbox (the caller then
// makes them give way), not for bob's.
func TestAdmitStandbyMember(t *testing.T) {
	ctx := context.Background()
	existing := map[string]Held{
		"a1":        {Owner: "alice", MemoryBytes: 100},
		"standby-1": {Owner: "alice", Standby: true, MemoryBytes: 100},
	}
	usage := func(context.Context) (map[string]Held, error) { return existing, nil }
	c := New(Limits{PerPrincipal: PrincipalLimits{MaxSandboxes: 2, MemoryBytes: 250}}, nil, usage)
	var b *apierr.FleetBusy
	if _, err := c.AdmitSandbox(ctx, "standby-2", Held{Owner: "alice", Standby: true, MemoryBytes: 100}); !errors.As(err, &b) ||
		b.Principal != "alice" || b.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES || b.InUse != 2 {
		t.Errorf("alice's second member = %v (%+v), want PRINCIPAL_SANDBOXES of alice with 2 in use", err, b)
	}
	if _, err := c.AdmitSandbox(ctx, "a2", Held{Owner: "alice", MemoryBytes: 10}); !errors.As(err, &b) || b.Principal != "alice" || b.InUse != 2 {
		t.Errorf("alice's a2 beside her member = %v (%+v), want refused for alice with 2 in use (her member counted)", err, b)
	}
	r, err := c.AdmitSandbox(ctx, "b1", Held{Owner: "bob", MemoryBytes: 100})
	if err != nil {
		t.Fatalf("bob's b1 beside alice's member: %v", err)
	}
	r()
	// The fork that takes the member claims it: it is counted once.
	rc, err := c.AdmitClaim(ctx, "standby-1", "alice", existing["standby-1"])
	if err != nil {
		t.Fatalf("alice's fork claims her member: %v", err)
	}
	rc()
}

// TestUsageLeavesOutStandby: the usage a node reports to its fleet
// (Usage) leaves out fork standby members, made and being made: they give
// way to any sandbox refused for room, so a gateway that placed by a
// count with them in would refuse (FLEET_BUSY) a sandbox the node takes.
func TestUsageLeavesOutStandby(t *testing.T) {
	ctx := context.Background()
	existing := map[string]Held{
		"a1":        {Owner: "alice", MemoryBytes: 100, DiskBytes: 10},
		"standby-1": {Owner: "alice", Standby: true, MemoryBytes: 100, DiskBytes: 10},
	}
	usage := func(context.Context) (map[string]Held, error) { return existing, nil }
	c := New(Limits{MaxSandboxes: 3, MemoryBudget: 300}, nil, usage)
	r, err := c.AdmitSandbox(ctx, "standby-2", Held{Owner: "alice", Standby: true, MemoryBytes: 100})
	if err != nil {
		t.Fatalf("member standby-2: %v", err)
	}
	defer r()
	u, err := c.Usage(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if u.Sandboxes != 1 || u.MemoryBytes != 100 || u.DiskBytes != 10 {
		t.Errorf("Usage with a member made and one admitted = %d sandboxes, %d memory, %d disk bytes; want 1, 100, 10 (a1 only)", u.Sandboxes, u.MemoryBytes, u.DiskBytes)
	}
}

// TestStandbyInRefusal: a refusal at a principal's cap says how much of
// what she holds is her fork standby members (which she cannot list, and
// which stayed: they could not make room), so that "delete sandboxes"
// does not send her hunting for sandboxes she does not have. A refusal
// at the server's limits, which another principal may get, says nothing
// of anyone's members.
func TestStandbyInRefusal(t *testing.T) {
	ctx := context.Background()
	existing := map[string]Held{
		"a1":        {Owner: "alice", MemoryBytes: 100, DiskBytes: 10},
		"standby-1": {Owner: "alice", Standby: true, MemoryBytes: 100, DiskBytes: 10},
		"standby-2": {Owner: "alice", Standby: true, MemoryBytes: 100, DiskBytes: 10},
	}
	usage := func(context.Context) (map[string]Held, error) { return existing, nil }
	for _, tt := range []struct {
		name     string
		limits   Limits
		want     Held
		standby  uint64
		inMsg    string
		resource berthv1.CapacityResource
	}{
		{"alice's sandboxes cap", Limits{PerPrincipal: PrincipalLimits{MaxSandboxes: 3}}, Held{Owner: "alice"},
			2, "2 of them are fork standby members", berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES},
		{"alice's memory cap", Limits{PerPrincipal: PrincipalLimits{MemoryBytes: 350}}, Held{Owner: "alice", MemoryBytes: 100},
			200, "200 bytes of them are held by fork standby members", berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY},
		{"alice's disk cap", Limits{PerPrincipal: PrincipalLimits{DiskBytes: 35}}, Held{Owner: "alice", DiskBytes: 10},
			20, "20 bytes of them are held by fork standby members", berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK},
		{"the server's sandboxes, for bob", Limits{MaxSandboxes: 3}, Held{Owner: "bob"},
			0, "", berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES},
		{"the server's memory, for alice", Limits{MemoryBudget: 350}, Held{Owner: "alice", MemoryBytes: 100},
			0, "", berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := New(tt.limits, nil, usage)
			_, err := c.AdmitSandbox(ctx, "new", tt.want)
			var b *apierr.FleetBusy
			if !errors.As(err, &b) || b.Resource != tt.resource {
				t.Fatalf("AdmitSandbox = %v, want FLEET_BUSY on %v", err, tt.resource)
			}
			if b.Standby != tt.standby {
				t.Errorf("Standby = %d, want %d", b.Standby, tt.standby)
			}
			msg := err.Error()
			if tt.inMsg != "" && !strings.Contains(msg, tt.inMsg) {
				t.Errorf("message %q lacks %q", msg, tt.inMsg)
			}
			if tt.inMsg == "" && strings.Contains(msg, "standby") {
				t.Errorf("message %q speaks of standby members at the server's limits", msg)
			}
		})
	}
}
