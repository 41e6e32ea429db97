// Package admit admits new sandboxes and execs within berthd's limits
// (server.Config: MaxSandboxes, MemoryBudgetBytes, DiskOvercommit,
// MaxExecs, MaxExecsPerSandbox and the per-principal caps) and refuses the
// rest with *apierr.FleetBusy (RESOURCE_EXHAUSTED FLEET_BUSY) before
// anything starts.
package admit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/server/apierr"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// Limits are the limits of admission; zero fields impose none.
type Limits struct {
	// MaxSandboxes caps the sandboxes held, running or stopped.
	MaxSandboxes int
	// MaxExecsPerSandbox caps the execs running at once in one sandbox.
	MaxExecsPerSandbox int
	// MaxExecs caps the execs running at once in all sandboxes.
	MaxExecs int
	// MemoryBudget caps the memory promised to sandboxes, in bytes: the
	// sum of their memory caps (sandboxes without one count zero).
	MemoryBudget uint64
	// DiskBudget caps the disk promised to sandboxes, in bytes: the sum of
	// their disk quotas (sandboxes without one count zero). berthd sets it
	// to the size of the btrfs pool that holds the quotas times
	// --disk-overcommit, so that quotas that are each kept cannot together
	// fill the pool (issue 21).
	DiskBudget uint64
	// DiskBudgetNow, when set, reads the disk budget again at each check
	// (berthd: statfs(2) of the btrfs pool times --disk-overcommit), so
	// that a pool grown or shrunk since start is counted as it is; a
	// failed read keeps the budget last read (DiskBudget at first).
	DiskBudgetNow func() (uint64, error)
	// PerPrincipal caps what one principal's sandboxes hold.
	PerPrincipal PrincipalLimits
	// RetryDelay is the retry delay a refusal suggests.
	RetryDelay time.Duration
}

// PrincipalLimits cap what the sandboxes one principal holds (Held.Owner)
// may together be promised; zero fields impose none. Warm-pool members of
// an image count for no principal until one claims them; fork standby
// members count for their parent's owner (Held.Standby).
type PrincipalLimits struct {
	// MaxSandboxes caps the principal's sandboxes, running or stopped.
	MaxSandboxes int
	// MemoryBytes caps the sum of their memory caps, in bytes.
	MemoryBytes uint64
	// DiskBytes caps the sum of their disk quotas, in bytes.
	DiskBytes uint64
}

func (l PrincipalLimits) any() bool {
	return l.MaxSandboxes > 0 || l.MemoryBytes > 0 || l.DiskBytes > 0
}

// Held is what one sandbox holds against the limits.
type Held struct {
	// Owner is the principal that holds it (auth.Principal.Name).
	Owner string
	// Pooled is true for an unclaimed warm-pool member, which no
	// principal holds yet.
	Pooled bool
	// MemoryBytes is its memory cap in bytes (zero: none, counted zero).
	MemoryBytes uint64
	// DiskBytes is its disk quota in bytes (zero: none, counted zero);
	// for a stored copy, the bytes it counts (runtime.Runtime.StoredDisk).
	DiskBytes uint64
	// Stored is true for a stored snapshot or a fork's copy
	// (runtime.Runtime.StoredDisk), or a hibernated sandbox's checkpoint
	// image (runtime.Runtime.Promised): it holds disk against the
	// server's disk budget and its owner's disk cap, and is no sandbox.
	Stored bool
	// Hibernated is true for a hibernated sandbox: it counts as a sandbox
	// and holds its disk, but no memory, until AdmitWake admits its wake.
	Hibernated bool
	// Standby is true for a fork standby member (runtime.Promise.Standby):
	// made ahead for the next fork of a sandbox of Owner's, it counts
	// against Owner's caps and the server's limits as Owner's sandboxes
	// do, so that a principal's members fit within its caps. Admission
	// never removes one: the caller makes members give way when a refusal
	// names a limit they hold room in (lifecycle's giveWay).
	Standby bool
}

// Observer is told when admitted execs start and end (server/metrics).
type Observer interface {
	ExecStarted()
	ExecEnded(outcome string)
}

// Capacity admits new sandboxes and execs within Limits.
//
// Sandboxes are counted from containerd (every berth container in the
// namespace, stopped ones included, plus creations admitted and not yet
// finished), so the count survives a berthd restart. Execs are counted in
// memory: an exec holds its slot from its start until berthd sees it exit,
// also after its caller went away (a follower keeps watching it), or until
// its runtime dies. Execs started by an earlier berthd process are not
// counted.
type Capacity struct {
	limits Limits
	obs    Observer
	// usage lists the sandboxes that exist with what they hold.
	usage func(context.Context) (map[string]Held, error)

	// createMu serializes sandbox admission, so that two creations cannot
	// both take the last place.
	createMu sync.Mutex
	pending  map[string]Held // admitted creations and claims by sandbox id

	mu    sync.Mutex
	execs map[string]int // running execs per sandbox
	total int

	disk   atomic.Uint64 // the disk budget last read (Limits.DiskBudgetNow)
	copies atomic.Uint64 // stored copies admitted (AdmitStored's keys)
}

// New returns a Capacity with limits that counts the sandboxes usage
// lists (sandbox id -> what it holds, from runtime.Runtime's Promised) and
// reports execs to obs (nil: to no one).
func New(limits Limits, obs Observer, usage func(context.Context) (map[string]Held, error)) *Capacity {
	if obs == nil {
		obs = noObserver{}
	}
	c := &Capacity{limits: limits, obs: obs, usage: usage, pending: make(map[string]Held), execs: make(map[string]int)}
	c.disk.Store(limits.DiskBudget)
	return c
}

// Limits returns the limits c admits within, DiskBudget as last read.
func (c *Capacity) Limits() Limits {
	l := c.limits
	l.DiskBudget = c.disk.Load()
	return l
}

// diskBudget reads the disk budget (Limits.DiskBudgetNow) and returns it,
// or the one last read when it cannot be read.
func (c *Capacity) diskBudget() uint64 {
	if c.limits.DiskBudgetNow != nil {
		if b, err := c.limits.DiskBudgetNow(); err == nil {
			c.disk.Store(b)
			return b
		}
	}
	return c.disk.Load()
}

type noObserver struct{}

func (noObserver) ExecStarted()     {}
func (noObserver) ExecEnded(string) {}

// Usage is what the server holds against its limits.
type Usage struct {
	Sandboxes    uint64
	MemoryBytes  uint64
	DiskBytes    uint64
	Execs        uint64
	MaxSandboxes uint64
	MemoryBudget uint64
	DiskBudget   uint64
	MaxExecs     uint64
}

// Usage counts the sandboxes (running or stopped, creations admitted and
// those in creating included) and the memory and disk promised to them as
// AdmitSandbox does, and the execs running. creating maps sandbox ids of
// creations in progress to what they will hold. Fork standby members
// (Held.Standby), made or being made, are left out: they give way to any
// sandbox refused for room (lifecycle's giveWay), so the room they hold is
// room for a new sandbox, and a fleet's gateway that places by this count
// (cluster.Usage) must not refuse a sandbox the node would take.
func (c *Capacity) Usage(ctx context.Context, creating map[string]Held) (Usage, error) {
	existing, err := c.usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	c.createMu.Lock()
	all := c.held(existing)
	c.createMu.Unlock()
	for id, h := range creating {
		if _, ok := all[id]; !ok {
			all[id] = h
		}
	}
	var t tally
	for _, h := range all {
		if !h.Standby {
			t.add(h)
		}
	}
	_, execs := c.Running("")
	return Usage{Sandboxes: t.sandboxes, MemoryBytes: t.memory, DiskBytes: t.disk, Execs: uint64(max(execs, 0)),
		MaxSandboxes: uint64(max(c.limits.MaxSandboxes, 0)), MemoryBudget: c.limits.MemoryBudget,
		DiskBudget: c.diskBudget(), MaxExecs: uint64(max(c.limits.MaxExecs, 0))}, nil
}

// held returns existing with the pending admissions laid over it: a
// pending claim of a pool member counts for its new owner. The caller
// holds createMu.
func (c *Capacity) held(existing map[string]Held) map[string]Held {
	all := make(map[string]Held, len(existing)+len(c.pending))
	maps.Copy(all, existing)
	maps.Copy(all, c.pending)
	return all
}

// heldNow lists what the sandboxes and stored copies hold now, the
// pending admissions laid over them (held). The caller holds createMu.
func (c *Capacity) heldNow(ctx context.Context) (map[string]Held, error) {
	existing, err := c.usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	return c.held(existing), nil
}

// tally sums what sandboxes hold. The sums saturate at the largest uint64
// instead of wrapping (bounds.Add): caps come from callers and from
// labels, and a wrapped sum would admit what the limit cannot hold.
type tally struct{ sandboxes, memory, disk uint64 }

func (t *tally) add(h Held) {
	if !h.Stored {
		t.sandboxes++
	}
	if !h.Stored && !h.Hibernated {
		t.memory = addSaturating(t.memory, h.MemoryBytes)
	}
	t.disk = addSaturating(t.disk, h.DiskBytes)
}

// AdmitSandbox admits the creation of sandbox id, which will hold want
// (want.Pooled for a warm-pool member), or refuses it with a
// *apierr.FleetBusy naming the limit: the server's sandboxes, memory
// budget or disk budget, or want.Owner's per-principal caps. release must
// be called once the creation finished, failed or not. A sandbox id that
// exists already is admitted without counting: the creation returns it or
// fails with SANDBOX_EXISTS.
func (c *Capacity) AdmitSandbox(ctx context.Context, id string, want Held) (release func(), err error) {
	l := c.limits
	if l.MaxSandboxes <= 0 && l.MemoryBudget == 0 && l.DiskBudget == 0 && l.DiskBudgetNow == nil && !l.PerPrincipal.any() {
		return func() {}, nil
	}
	return c.admit(ctx, id, id, want)
}

// AdmitStored admits a stored copy of sandbox id — a snapshot, a fork's
// copy, an image committed from a snapshot — that principal owner takes
// and that may come to hold bytes of the pool alone, within the server's
// disk budget and owner's disk cap, counting the copies that exist
// (Held.Stored) with the sandboxes. It refuses with a *apierr.FleetBusy
// naming the limit, like AdmitSandbox; release must be called once the
// copy exists (it is then counted as it is) or has failed.
func (c *Capacity) AdmitStored(ctx context.Context, id, owner string, bytes uint64) (release func(), err error) {
	l := c.limits
	if l.DiskBudget == 0 && l.DiskBudgetNow == nil && l.PerPrincipal.DiskBytes == 0 {
		return func() {}, nil
	}
	// Pending under a key of its own, which no sandbox has: the sandbox
	// itself is counted, and so is every other copy pending.
	key := fmt.Sprintf("stored-copy-of/%s/%d", id, c.copies.Add(1))
	return c.admit(ctx, id, key, Held{Owner: owner, DiskBytes: bytes, Stored: true})
}

// admit is AdmitSandbox and AdmitStored: it admits want, held pending
// under key, for sandbox id (named in refusals).
func (c *Capacity) admit(ctx context.Context, id, key string, want Held) (release func(), err error) {
	l := c.limits
	c.createMu.Lock()
	defer c.createMu.Unlock()
	l.DiskBudget = c.diskBudget()
	existing, err := c.usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes and stored copies: %w", err)
	}
	all := c.held(existing)
	if _, ok := all[key]; ok {
		return func() {}, nil
	}
	var server tally
	for _, h := range all {
		server.add(h)
	}
	busy := func(r berthv1.CapacityResource, limit, inUse, requested uint64) error {
		return &apierr.FleetBusy{SandboxID: id, Resource: r, Limit: limit, InUse: inUse, Requested: requested, RetryDelay: l.RetryDelay}
	}
	switch {
	case !want.Stored && l.MaxSandboxes > 0 && server.sandboxes+1 > uint64(l.MaxSandboxes):
		return nil, busy(berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES, uint64(l.MaxSandboxes), server.sandboxes, 1)
	case l.MemoryBudget > 0 && addSaturating(server.memory, want.MemoryBytes) > l.MemoryBudget:
		return nil, busy(berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, l.MemoryBudget, server.memory, want.MemoryBytes)
	case l.DiskBudget > 0 && addSaturating(server.disk, want.DiskBytes) > l.DiskBudget:
		return nil, busy(berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, l.DiskBudget, server.disk, want.DiskBytes)
	}
	if err := c.checkPrincipal(key, all, want); err != nil {
		var b *apierr.FleetBusy
		if errors.As(err, &b) {
			b.SandboxID = id
		}
		return nil, err
	}
	return c.hold(key, want), nil
}

// AdmitWake admits the wake of hibernated sandbox id: the memory it is
// promised (its memory cap), which it did not hold while hibernated,
// within the server's memory budget and its owner's memory cap. It
// refuses with a *apierr.FleetBusy naming the limit (the sandbox stays
// hibernated); a sandbox that is not hibernated, or not listed, is
// admitted without counting. release must be called once the wake
// finished (the sandbox then counts its memory itself) or failed.
func (c *Capacity) AdmitWake(ctx context.Context, id string) (release func(), err error) {
	l := c.limits
	if l.MemoryBudget == 0 && l.PerPrincipal.MemoryBytes == 0 {
		return func() {}, nil
	}
	c.createMu.Lock()
	defer c.createMu.Unlock()
	all, err := c.heldNow(ctx)
	if err != nil {
		return nil, err
	}
	asleep, ok := all[id]
	if !ok || !asleep.Hibernated {
		return func() {}, nil
	}
	var server tally
	for _, h := range all {
		server.add(h)
	}
	if l.MemoryBudget > 0 && addSaturating(server.memory, asleep.MemoryBytes) > l.MemoryBudget {
		return nil, &apierr.FleetBusy{SandboxID: id, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, Limit: l.MemoryBudget,
			InUse: server.memory, Requested: asleep.MemoryBytes, RetryDelay: l.RetryDelay}
	}
	awake := asleep
	awake.Hibernated = false
	// Its own entry, hibernated, counts no memory: checked as a sandbox
	// of its owner's that it is, with its memory only.
	if err := c.checkPrincipal(id, all, Held{Owner: awake.Owner, Pooled: awake.Pooled, MemoryBytes: awake.MemoryBytes, Stored: true}); err != nil {
		return nil, err
	}
	return c.hold(id, awake), nil
}

// AdmitClaim admits principal owner's claim of warm-pool member id, which
// holds pooled, within owner's per-principal caps; the server's limits
// counted the member when it was made. It refuses with a
// *apierr.FleetBusy like AdmitSandbox; release must be called once the
// claim finished, failed or not.
func (c *Capacity) AdmitClaim(ctx context.Context, id, owner string, pooled Held) (release func(), err error) {
	if !c.limits.PerPrincipal.any() {
		return func() {}, nil
	}
	c.createMu.Lock()
	defer c.createMu.Unlock()
	all, err := c.heldNow(ctx)
	if err != nil {
		return nil, err
	}
	want := Held{Owner: owner, MemoryBytes: pooled.MemoryBytes, DiskBytes: pooled.DiskBytes}
	if err := c.checkPrincipal(id, all, want); err != nil {
		return nil, err
	}
	return c.hold(id, want), nil
}

// checkPrincipal refuses sandbox id, which will hold want, when it would
// take want.Owner past a per-principal cap, counting what all holds but id
// (a pool member being claimed). Unowned warm-pool members are checked
// against nothing. The caller holds createMu.
func (c *Capacity) checkPrincipal(id string, all map[string]Held, want Held) error {
	pl := c.limits.PerPrincipal
	if want.Pooled || !pl.any() {
		return nil
	}
	var owner, standby tally // standby: the part of owner's that her members hold
	for hid, h := range all {
		if hid != id && !h.Pooled && h.Owner == want.Owner {
			owner.add(h)
			if h.Standby {
				standby.add(h)
			}
		}
	}
	busy := func(r berthv1.CapacityResource, limit, inUse, requested, members uint64) error {
		return &apierr.FleetBusy{SandboxID: id, Resource: r, Limit: limit, InUse: inUse, Requested: requested,
			RetryDelay: c.limits.RetryDelay, Principal: want.Owner, Standby: members}
	}
	switch {
	case !want.Stored && pl.MaxSandboxes > 0 && owner.sandboxes+1 > uint64(pl.MaxSandboxes):
		return busy(berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES, uint64(pl.MaxSandboxes), owner.sandboxes, 1, standby.sandboxes)
	case pl.MemoryBytes > 0 && addSaturating(owner.memory, want.MemoryBytes) > pl.MemoryBytes:
		return busy(berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY, pl.MemoryBytes, owner.memory, want.MemoryBytes, standby.memory)
	case pl.DiskBytes > 0 && addSaturating(owner.disk, want.DiskBytes) > pl.DiskBytes:
		return busy(berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK, pl.DiskBytes, owner.disk, want.DiskBytes, standby.disk)
	}
	return nil
}

// hold records the admission of sandbox id holding h until the returned
// release is called (once; later calls do nothing). The caller holds
// createMu.
func (c *Capacity) hold(id string, h Held) (release func()) {
	c.pending[id] = h
	var once sync.Once
	return func() {
		once.Do(func() {
			c.createMu.Lock()
			delete(c.pending, id)
			c.createMu.Unlock()
		})
	}
}

// addSaturating returns a+b, or the largest uint64 when the sum would wrap
// (bounds.Add): a saturated sum exceeds every limit, so what overflows is
// refused.
func addSaturating(a, b uint64) uint64 {
	sum, ok := bounds.Add(a, b)
	if !ok {
		return math.MaxUint64
	}
	return sum
}

// ExecSlot is one admitted exec's place; release it once the exec ended.
// It also reports the exec's start and end to the observer, once each,
// whoever sees them: the caller's stream or the follower that holds the
// slot after the caller left.
type ExecSlot struct {
	c         *Capacity
	sandboxID string
	once      sync.Once

	mu      sync.Mutex
	started bool
	ended   bool
}

// Start reports that the exec started.
func (sl *ExecSlot) Start() {
	sl.mu.Lock()
	first := !sl.started
	sl.started = true
	sl.mu.Unlock()
	if first {
		sl.c.obs.ExecStarted()
	}
}

// End reports that the started exec ended with outcome (metrics.Outcome*).
func (sl *ExecSlot) End(outcome string) {
	sl.mu.Lock()
	report := sl.started && !sl.ended
	sl.ended = true
	sl.mu.Unlock()
	if report {
		sl.c.obs.ExecEnded(outcome)
	}
}

// AdmitExec admits a new exec in the sandbox or refuses it with a
// *apierr.FleetBusy.
func (c *Capacity) AdmitExec(sandboxID string) (*ExecSlot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limits.MaxExecs > 0 && c.total >= c.limits.MaxExecs {
		return nil, &apierr.FleetBusy{SandboxID: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS,
			Limit: uint64(c.limits.MaxExecs), InUse: uint64(c.total), Requested: 1, RetryDelay: c.limits.RetryDelay}
	}
	if n := c.execs[sandboxID]; c.limits.MaxExecsPerSandbox > 0 && n >= c.limits.MaxExecsPerSandbox {
		return nil, &apierr.FleetBusy{SandboxID: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS,
			Limit: uint64(c.limits.MaxExecsPerSandbox), InUse: uint64(n), Requested: 1, RetryDelay: c.limits.RetryDelay}
	}
	c.execs[sandboxID]++
	c.total++
	return &ExecSlot{c: c, sandboxID: sandboxID}, nil
}

// Release gives the slot back; it is idempotent and safe on nil.
func (sl *ExecSlot) Release() {
	if sl == nil {
		return
	}
	sl.End(metrics.OutcomeLost) // no-op once end reported the real outcome
	sl.once.Do(func() {
		c := sl.c
		c.mu.Lock()
		defer c.mu.Unlock()
		c.total--
		if c.execs[sl.sandboxID]--; c.execs[sl.sandboxID] <= 0 {
			delete(c.execs, sl.sandboxID)
		}
	})
}

// Running returns the number of execs holding a slot in the sandbox and in
// the whole server.
func (c *Capacity) Running(sandboxID string) (sandbox, server int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.execs[sandboxID], c.total
}
