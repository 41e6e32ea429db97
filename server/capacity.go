package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// capacity admits new sandboxes and execs within the configured limits, and
// refuses the rest with FLEET_BUSY before anything starts.
//
// Sandboxes are counted from containerd (every berth container in the
// namespace, stopped ones included, plus creations admitted and not yet
// finished), so the count survives a berthd restart. Execs are counted in
// memory: an exec holds its slot from its start until berthd sees it exit,
// also after its caller went away (a follower keeps watching it), or until
// its runtime dies. Execs started by an earlier berthd process are not
// counted.
type capacity struct {
	maxSandboxes       int
	maxExecsPerSandbox int
	maxExecs           int
	memoryBudget       uint64
	retryDelay         time.Duration
	obs                Observer
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

func newCapacity(cfg Config, usage func(context.Context) (map[string]uint64, error)) *capacity {
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	return &capacity{
		maxSandboxes:       cfg.MaxSandboxes,
		maxExecsPerSandbox: cfg.MaxExecsPerSandbox,
		maxExecs:           cfg.MaxExecs,
		memoryBudget:       cfg.MemoryBudgetBytes,
		retryDelay:         cfg.BusyRetryDelay,
		obs:                cfg.Observer,
		usage:              usage,
		pending:            make(map[string]uint64),
		execs:              make(map[string]int),
	}
}

// fleetBusyError refuses new work for lack of capacity; nothing started.
type fleetBusyError struct {
	sandboxID  string
	resource   berthv1.CapacityResource
	limit      uint64
	inUse      uint64
	requested  uint64
	retryDelay time.Duration
}

func (e *fleetBusyError) Error() string {
	var what string
	switch e.resource {
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES:
		what = fmt.Sprintf("the server holds %d of at most %d sandboxes", e.inUse, e.limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS:
		what = fmt.Sprintf("sandbox %s runs %d of at most %d execs at once", e.sandboxID, e.inUse, e.limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS:
		what = fmt.Sprintf("the server runs %d of at most %d execs at once", e.inUse, e.limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY:
		what = fmt.Sprintf("sandboxes are promised %d bytes of memory; %d more would exceed the budget of %d bytes", e.inUse, e.requested, e.limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_RUN_OUTPUT:
		what = fmt.Sprintf("Runs in progress hold %d bytes for their output; this Run's caps of %d bytes would exceed the server's budget of %d bytes", e.inUse, e.requested, e.limit)
	}
	return fmt.Sprintf("no capacity for sandbox %s: %s; nothing was started, retry after %v", e.sandboxID, what, e.retryDelay)
}

func (e *fleetBusyError) detail() *berthv1.FleetBusy {
	return &berthv1.FleetBusy{
		SandboxId:     e.sandboxID,
		Resource:      e.resource,
		Limit:         e.limit,
		InUse:         e.inUse,
		Requested:     e.requested,
		RetryDelay:    durationProto(e.retryDelay),
		ServerVersion: Version,
		Admitted:      berthv1.Admitted_ADMITTED_NOT_STARTED,
	}
}

// admitSandbox admits the creation of sandbox id with memBytes of memory
// (zero: no cap, which the memory budget does not count). release must be
// called once the creation finished, failed or not. A sandbox id that
// exists already is admitted without counting: the creation returns it or
// fails with SANDBOX_EXISTS.
func (c *capacity) admitSandbox(ctx context.Context, id string, memBytes uint64) (release func(), err error) {
	if c.maxSandboxes <= 0 && c.memoryBudget == 0 {
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
	if c.maxSandboxes > 0 && count+1 > uint64(c.maxSandboxes) {
		return nil, &fleetBusyError{sandboxID: id, resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES,
			limit: uint64(c.maxSandboxes), inUse: count, requested: 1, retryDelay: c.retryDelay}
	}
	if c.memoryBudget > 0 && addSaturating(mem, memBytes) > c.memoryBudget {
		return nil, &fleetBusyError{sandboxID: id, resource: berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY,
			limit: c.memoryBudget, inUse: mem, requested: memBytes, retryDelay: c.retryDelay}
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

// execSlot is one admitted exec's place; release it once the exec ended.
// It also reports the exec's start and end to the observer, once each,
// whoever sees them: the caller's stream or the follower that holds the
// slot after the caller left.
type execSlot struct {
	c         *capacity
	sandboxID string
	once      sync.Once

	mu      sync.Mutex
	started bool
	ended   bool
}

// start reports that the exec started.
func (sl *execSlot) start() {
	sl.mu.Lock()
	first := !sl.started
	sl.started = true
	sl.mu.Unlock()
	if first {
		sl.c.obs.ExecStarted()
	}
}

// end reports that the started exec ended with outcome (metrics.Outcome*).
func (sl *execSlot) end(outcome string) {
	sl.mu.Lock()
	report := sl.started && !sl.ended
	sl.ended = true
	sl.mu.Unlock()
	if report {
		sl.c.obs.ExecEnded(outcome)
	}
}

// admitExec admits a new exec in the sandbox or refuses it with a
// *fleetBusyError.
func (c *capacity) admitExec(sandboxID string) (*execSlot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxExecs > 0 && c.total >= c.maxExecs {
		return nil, &fleetBusyError{sandboxID: sandboxID, resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS,
			limit: uint64(c.maxExecs), inUse: uint64(c.total), requested: 1, retryDelay: c.retryDelay}
	}
	if n := c.execs[sandboxID]; c.maxExecsPerSandbox > 0 && n >= c.maxExecsPerSandbox {
		return nil, &fleetBusyError{sandboxID: sandboxID, resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS,
			limit: uint64(c.maxExecsPerSandbox), inUse: uint64(n), requested: 1, retryDelay: c.retryDelay}
	}
	c.execs[sandboxID]++
	c.total++
	return &execSlot{c: c, sandboxID: sandboxID}, nil
}

// release gives the slot back; it is idempotent and safe on nil.
func (sl *execSlot) release() {
	if sl == nil {
		return
	}
	sl.end(metrics.OutcomeLost) // no-op once end reported the real outcome
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

// running returns the number of execs holding a slot in the sandbox and in
// the whole server.
func (c *capacity) running(sandboxID string) (sandbox, server int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.execs[sandboxID], c.total
}
