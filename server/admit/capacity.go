// Package admit admits new sandboxes and execs within berthd's limits
// (server.Config: MaxSandboxes, MemoryBudgetBytes, MaxExecs,
// MaxExecsPerSandbox) and refuses the rest with *apierr.FleetBusy
// (RESOURCE_EXHAUSTED FLEET_BUSY) before anything starts.
package admit

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

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
	// RetryDelay is the retry delay a refusal suggests.
	RetryDelay time.Duration
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
	// usage lists the sandboxes that exist with their memory caps.
	usage func(context.Context) (map[string]uint64, error)

	// createMu serializes sandbox admission, so that two creations cannot
	// both take the last place.
	createMu sync.Mutex
	pending  map[string]uint64 // admitted creations: sandbox id -> memory bytes

	mu    sync.Mutex
	execs map[string]int // running execs per sandbox
	total int
}

// New returns a Capacity with limits that counts the sandboxes usage
// lists (sandbox id -> memory cap in bytes, as runtime.Runtime's
// MemoryPromised) and reports execs to obs (nil: to no one).
func New(limits Limits, obs Observer, usage func(context.Context) (map[string]uint64, error)) *Capacity {
	if obs == nil {
		obs = noObserver{}
	}
	return &Capacity{limits: limits, obs: obs, usage: usage, pending: make(map[string]uint64), execs: make(map[string]int)}
}

type noObserver struct{}

func (noObserver) ExecStarted()     {}
func (noObserver) ExecEnded(string) {}

// Usage is what the server holds against its limits.
type Usage struct {
	Sandboxes    uint64
	MemoryBytes  uint64
	Execs        uint64
	MaxSandboxes uint64
	MemoryBudget uint64
	MaxExecs     uint64
}

// Usage counts the sandboxes (running or stopped, creations admitted and
// those in creating included) and the memory promised to them as
// AdmitSandbox does, and the execs running. creating maps sandbox ids of
// creations in progress to their memory caps.
func (c *Capacity) Usage(ctx context.Context, creating map[string]uint64) (Usage, error) {
	existing, err := c.usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{MaxSandboxes: uint64(max(c.limits.MaxSandboxes, 0)), MemoryBudget: c.limits.MemoryBudget, MaxExecs: uint64(max(c.limits.MaxExecs, 0))}
	for _, m := range existing {
		u.Sandboxes++
		u.MemoryBytes = addSaturating(u.MemoryBytes, m)
	}
	counted := func(id string, m uint64) {
		if _, ok := existing[id]; !ok {
			existing[id] = m
			u.Sandboxes++
			u.MemoryBytes = addSaturating(u.MemoryBytes, m)
		}
	}
	c.createMu.Lock()
	for id, m := range c.pending {
		counted(id, m)
	}
	c.createMu.Unlock()
	for id, m := range creating {
		counted(id, m)
	}
	_, execs := c.Running("")
	u.Execs = uint64(max(execs, 0))
	return u, nil
}

// AdmitSandbox admits the creation of sandbox id with memBytes of memory
// (zero: no cap, which the memory budget does not count). release must be
// called once the creation finished, failed or not. A sandbox id that
// exists already is admitted without counting: the creation returns it or
// fails with SANDBOX_EXISTS.
func (c *Capacity) AdmitSandbox(ctx context.Context, id string, memBytes uint64) (release func(), err error) {
	if c.limits.MaxSandboxes <= 0 && c.limits.MemoryBudget == 0 {
		return func() {}, nil
	}
	c.createMu.Lock()
	defer c.createMu.Unlock()
	existing, err := c.usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	if _, ok := existing[id]; ok {
		return func() {}, nil
	}
	if _, ok := c.pending[id]; ok {
		return func() {}, nil
	}
	count := uint64(len(existing))
	var mem uint64
	for _, m := range existing {
		mem = addSaturating(mem, m)
	}
	for pid, m := range c.pending {
		if _, ok := existing[pid]; !ok {
			count++
			mem = addSaturating(mem, m)
		}
	}
	if c.limits.MaxSandboxes > 0 && count+1 > uint64(c.limits.MaxSandboxes) {
		return nil, &apierr.FleetBusy{SandboxID: id, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES,
			Limit: uint64(c.limits.MaxSandboxes), InUse: count, Requested: 1, RetryDelay: c.limits.RetryDelay}
	}
	if c.limits.MemoryBudget > 0 && addSaturating(mem, memBytes) > c.limits.MemoryBudget {
		return nil, &apierr.FleetBusy{SandboxID: id, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY,
			Limit: c.limits.MemoryBudget, InUse: mem, Requested: memBytes, RetryDelay: c.limits.RetryDelay}
	}
	c.pending[id] = memBytes
	var once sync.Once
	return func() {
		once.Do(func() {
			c.createMu.Lock()
			delete(c.pending, id)
			c.createMu.Unlock()
		})
	}, nil
}

// addSaturating returns a+b, or the largest uint64 when the sum would wrap:
// memory caps come from callers and from labels, and a wrapped sum would
// admit what the budget cannot hold.
func addSaturating(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
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
