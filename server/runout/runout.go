// Package runout collects the output of a Run in berthd: per-stream buffers
// that keep the head of each stream up to its cap whatever the agent sends,
// a check that what was collected is all the agent's result says there was,
// and the server-wide byte budget that bounds the memory all Runs may hold.
//
// The agent is reachable by the sandbox's workload, so nothing it sends is
// trusted: a Collector never holds more than its caps, and a stream that
// arrives short (an ExecDropped, or fewer bytes than the result counts) is an
// error, never a result that looks complete.
package runout

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/bounds"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Budget is a byte budget shared by all Runs of a server. A Run takes a
// Lease of a first slab of its output buffers when it is admitted
// (Collector.Slabs) and grows it as its output fills them, waiting for
// budget that others give back (backpressure: berthd stops reading that
// Run's output, and the agent's flow control holds the process), so that
// what Runs hold follows what they print, not their caps. The zero value
// is not usable; create one with NewBudget.
type Budget struct {
	limit uint64
	wait  time.Duration
	// window is what a lease is charged from its first Grow on: the
	// bytes its transport may hold of its Run's output (NewBudget).
	window uint64

	mu     sync.Mutex
	used   uint64
	leases int // leases holding budget
	// waiting counts the leases waiting in Grow since the last release;
	// a release wakes them all (wake is closed, gen moves on) and they
	// count again only if they wait again.
	waiting int
	gen     uint64
	wake    chan struct{}
	// collecting is what ended Runs' large buffers hold until the garbage
	// collector frees them (Lease.ReleaseLater); collector is true while
	// a goroutine runs collections for the leases waiting.
	collecting uint64
	collector  bool
	admitting  int // Lease calls waiting for collecting bytes
}

// NewBudget returns a Budget of limit bytes (zero: no limit) whose Grow
// waits at most wait for budget (zero: 30 s). window is the bytes a
// lease is charged besides from its first Grow until its release, whether
// or not they fit: what the transport may buffer of a Run's output that
// berthd has not read (a stream's HTTP/2 window, wire.StreamWindow, which
// grpc-go lets the agent fill whatever the connection's window), full
// while the Run waits for budget. A Run whose output fits its first slabs
// reads it as it comes and is not charged; one that outgrows them is, so
// that the buffers the others may take leave room for what its transport
// holds (issue 23: twelve Runs of 63 MiB, ten of them waiting with 4 MiB
// each in gRPC's buffers, took 40 MiB more than the budget).
func NewBudget(limit uint64, wait time.Duration, window uint64) *Budget {
	if wait <= 0 {
		wait = 30 * time.Second
	}
	return &Budget{limit: limit, wait: wait, window: window, wake: make(chan struct{})}
}

// Reserve takes n bytes of the budget and returns the function that gives
// them back (idempotent). When they do not fit, or their sum with what is
// held would not fit in 64 bits, ok is false and used is what other Runs
// hold.
func (b *Budget) Reserve(n uint64) (release func(), used uint64, ok bool) {
	l, used, ok := b.Lease(n)
	if !ok {
		return nil, used, false
	}
	return l.Release, used, true
}

// Lease takes n bytes of the budget at once, as Reserve does, and returns
// them as a Lease that may grow. When they fit only once ended Runs'
// buffers are freed (Lease.ReleaseLater), it runs a collection and waits
// for them, at most admitWait; it never waits for Runs in progress.
func (b *Budget) Lease(n uint64) (l *Lease, used uint64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var timeout <-chan time.Time
	for !b.fits(n) {
		if b.collecting == 0 || !b.fitsWithout(b.collecting, n) {
			return nil, b.used, false
		}
		if timeout == nil {
			t := time.NewTimer(admitWait)
			defer t.Stop()
			timeout = t.C
		}
		b.admitting++
		if !b.collector {
			b.collector = true
			go b.collect()
		}
		wake := b.wake
		b.mu.Unlock()
		expired := false
		select {
		case <-wake:
		case <-timeout:
			expired = true
		}
		b.mu.Lock()
		b.admitting--
		if expired && !b.fits(n) {
			return nil, b.used, false
		}
	}
	b.used += n
	b.leases++
	return &Lease{b: b, held: n, windowMax: b.window}, b.used, true
}

// admitWait bounds how long Lease waits for ended Runs' buffers to be
// freed.
const admitWait = 2 * time.Second

// fitsWithout reports whether n more bytes would fit were freed bytes
// not held; the caller holds mu.
func (b *Budget) fitsWithout(freed, n uint64) bool {
	sum, ok := bounds.Add(b.used-freed, n)
	return ok && (b.limit == 0 || sum <= b.limit)
}

// fits reports whether n more bytes fit; the caller holds mu.
func (b *Budget) fits(n uint64) bool {
	sum, ok := bounds.Add(b.used, n)
	return ok && (b.limit == 0 || sum <= b.limit)
}

// Limit returns the budget in bytes; zero means none.
func (b *Budget) Limit() uint64 { return b.limit }

// Used returns the bytes reserved now.
func (b *Budget) Used() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Waiting returns the number of leases waiting for budget now.
func (b *Budget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// Lease is one Run's share of a Budget.
type Lease struct {
	b      *Budget
	held   uint64 // guarded by b.mu
	window uint64 // the window once charged (Grow); guarded by b.mu
	// windowMax is the most a window charge of this lease is
	// (LimitWindow); guarded by b.mu.
	windowMax uint64
	released  bool // guarded by b.mu
}

// ErrBudgetExhausted is wrapped by Lease.Grow's error when the budget had
// no room for a Run's next slab.
var ErrBudgetExhausted = errors.New("run output budget exhausted")

// ExhaustedError says why a Lease could not grow.
type ExhaustedError struct {
	// Limit is the budget, Used what all Runs held, Held what this Run
	// held and Requested the slab it asked for, in bytes.
	Limit, Used, Held, Requested uint64
	// Waited is how long it waited for budget.
	Waited time.Duration
	// AllWaiting is true when every Run holding budget was waiting for
	// more, so none could have given any back: waiting on would have
	// held them all forever.
	AllWaiting bool
	// Err is the caller's context's error, when that ended the wait.
	Err error
}

func (e *ExhaustedError) Error() string {
	why := fmt.Sprintf("no room within %v", e.Waited.Round(time.Millisecond))
	switch {
	case e.Err != nil:
		why = fmt.Sprintf("the call ended after %v (%v)", e.Waited.Round(time.Millisecond), e.Err)
	case e.AllWaiting:
		why = "every Run holding it was waiting for more"
	}
	return fmt.Sprintf("the Run output budget of %d bytes (%d held, %d by this Run) had no room for %d more bytes: %s",
		e.Limit, e.Used, e.Held, e.Requested, why)
}

func (e *ExhaustedError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrBudgetExhausted, e.Err}
	}
	return []error{ErrBudgetExhausted}
}

// Grow takes n more bytes for the lease, waiting while they do not fit
// until other leases give budget back. The first Grow charges the lease
// the Budget's window besides, at once and until its release (NewBudget):
// those bytes are held whether or not they fit. It fails with an
// *ExhaustedError when they do not fit within the Budget's wait, when ctx
// ends, or at once when every lease holding budget is waiting (none would
// give any back).
func (l *Lease) Grow(ctx context.Context, n uint64) error {
	b := l.b
	start := time.Now()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	b.mu.Lock()
	for {
		fail := func(all bool, err error) error {
			e := &ExhaustedError{Limit: b.limit, Used: b.used, Held: l.held, Requested: n, Waited: time.Since(start), AllWaiting: all, Err: err}
			b.mu.Unlock()
			return e
		}
		if l.released {
			return fail(false, errors.New("lease released"))
		}
		if l.window == 0 {
			// Not taken with bounds: the window is far below 2^64
			// minus any limit.
			l.window = min(b.window, l.windowMax)
			b.used += l.window
		}
		if b.fits(n) {
			b.used += n
			l.held += n
			b.mu.Unlock()
			return nil
		}
		if b.waiting+1 >= b.leases && b.collecting == 0 {
			return fail(true, nil)
		}
		if b.collecting > 0 && !b.collector {
			b.collector = true
			go b.collect()
		}
		if timer == nil {
			timer = time.NewTimer(b.wait)
		}
		b.waiting++
		gen, wake := b.gen, b.wake
		b.mu.Unlock()
		var err error
		timedOut := false
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		case <-timer.C:
			timedOut = true
		}
		b.mu.Lock()
		if b.gen == gen {
			b.waiting--
		}
		if err != nil || timedOut {
			return fail(false, err)
		}
	}
}

// LimitWindow makes the window charge of the lease's first Grow at most n
// bytes (NewBudget): for a Run that can be sent no more than n bytes it
// keeps. Past its caps a Run's output is discarded as it comes, and the
// agent sends nothing past them, so its stream holds no more than that
// (an agent the workload took over may still fill the Budget's window).
func (l *Lease) LimitWindow(n uint64) {
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	l.windowMax = min(l.windowMax, n)
}

// Held returns the bytes the lease holds.
func (l *Lease) Held() uint64 {
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	return l.held
}

// Release gives the lease's bytes back and wakes the leases waiting for
// budget; it is idempotent.
func (l *Lease) Release() { l.ReleaseLater(0) }

// ReleaseLater ends the lease as Release does but keeps later of its bytes
// (at most what it holds) counted until the returned function gives them
// back: for buffers still in memory until the garbage collector frees
// them. While later bytes are pending and leases wait for budget, the
// Budget runs collections (runtime.GC) so that they come back. The
// returned function is idempotent.
func (l *Lease) ReleaseLater(later uint64) (giveBack func()) {
	b := l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.released {
		return func() {}
	}
	later = min(later, l.held)
	l.released = true
	b.used -= l.held - later + l.window
	l.window = 0
	b.collecting += later
	l.held = 0
	b.leases--
	b.wakeAll()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.used -= later
			b.collecting -= later
			b.wakeAll()
		})
	}
}

// wakeAll wakes every lease waiting in Grow; the caller holds mu.
func (b *Budget) wakeAll() {
	b.waiting = 0
	b.gen++
	close(b.wake)
	b.wake = make(chan struct{})
}

// collect runs garbage collections while bytes of ended leases are pending
// (ReleaseLater) and leases wait for budget, so that their buffers are
// freed and the bytes come back; after a collection that took d it waits
// at least d before the next, half of one CPU at most. Each collection
// also returns the freed pages to the system (debug.FreeOSMemory): the
// runtime places small objects in the lowest free pages, inside a freed
// buffer's, so the next large buffer may take new pages while the freed
// ones stay resident until the runtime's scavenger gets to them (one
// TestRunOverflow run in five peaked 34 MiB higher with runtime.GC).
func (b *Budget) collect() {
	for {
		b.mu.Lock()
		if b.collecting == 0 || b.waiting == 0 && b.admitting == 0 {
			b.collector = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		start := time.Now()
		debug.FreeOSMemory()
		time.Sleep(max(time.Since(start), 10*time.Millisecond))
	}
}

// ErrOutputLost is wrapped by Collector.Result's error when the output that
// arrived is less than the result says was written within the caps.
var ErrOutputLost = errors.New("run output lost")

// LostError says which stream of a Run arrived incomplete.
type LostError struct {
	Stream berthv1.Stream
	// Want is how many bytes of the stream should have arrived (the
	// stream's total within its cap), Got how many did.
	Want, Got uint64
	// Dropped is the sequence range the agent reported shed, if any.
	Dropped *berthv1.ExecDropped
}

func (e *LostError) Error() string {
	name := "stdout"
	if e.Stream == berthv1.Stream_STREAM_STDERR {
		name = "stderr"
	}
	msg := fmt.Sprintf("%s arrived incomplete: %d of the %d bytes within its cap", name, e.Got, e.Want)
	if e.Got >= e.Want {
		msg = fmt.Sprintf("%s may have lost bytes within its cap of which %d arrived", name, e.Got)
	}
	if d := e.Dropped; d != nil {
		msg += fmt.Sprintf("; the agent dropped events %d..%d (%d bytes)", d.GetFirstSeq(), d.GetLastSeq(), d.GetLostBytes())
	}
	return msg
}

func (e *LostError) Unwrap() error { return ErrOutputLost }

// Collector gathers one Run's output: at most StdoutCap and StderrCap bytes,
// the first ones of each stream.
type Collector struct {
	caps     [3]uint64 // by berthv1.Stream
	kept     [3][]byte
	received [3]uint64
	dropped  *berthv1.ExecDropped
	// tainted marks the streams whose head was not complete when events
	// were dropped: what was lost may have belonged to them.
	tainted [3]bool
	// lease, when set, holds the buffers' capacity: reserved by stream.
	lease    *Lease
	reserved [3]uint64
}

// SlabBytes is the first slab of each stream's buffer, which a Run holds
// of the Budget from its admission (Slabs); a stream's buffer grows past
// it only as its output does.
const SlabBytes = growDoubling

// Slabs returns the bytes of the Budget a Run with these caps takes when
// it is admitted: each stream's first slab, at most its cap.
func Slabs(stdoutCap, stderrCap uint64) uint64 {
	return min(stdoutCap, SlabBytes) + min(stderrCap, SlabBytes)
}

// NewCollector returns a Collector that keeps the first stdoutCap bytes of
// stdout and stderrCap of stderr.
func NewCollector(stdoutCap, stderrCap uint64) *Collector {
	c := &Collector{}
	c.caps[berthv1.Stream_STREAM_STDOUT] = stdoutCap
	c.caps[berthv1.Stream_STREAM_STDERR] = stderrCap
	return c
}

// HoldIn makes the collector hold its buffers within l, which holds their
// first slabs (Slabs of the caps) already: a buffer that must grow past
// what l holds for it grows l first, waiting for budget (Lease.Grow).
func (c *Collector) HoldIn(l *Lease) {
	c.lease = l
	for _, s := range []berthv1.Stream{berthv1.Stream_STREAM_STDOUT, berthv1.Stream_STREAM_STDERR} {
		c.reserved[s] = min(c.caps[s], SlabBytes)
	}
	// Once a stream outgrew its first slab, what the Run's transport may
	// hold is at most what it keeps past the first slabs. Not taken with
	// bounds: caps are checked against Config.RunMaxOutputBytes first.
	c.lease.LimitWindow(c.caps[berthv1.Stream_STREAM_STDOUT] + c.caps[berthv1.Stream_STREAM_STDERR] -
		c.reserved[berthv1.Stream_STREAM_STDOUT] - c.reserved[berthv1.Stream_STREAM_STDERR])
}

// Release ends the collector's lease (HoldIn): the first slabs come back
// at once, the bytes of a buffer grown past its first slab only once the
// garbage collector has freed it (Lease.ReleaseLater, runtime.AddCleanup),
// so that the Budget never counts as free memory that is still taken: a
// Run's response is sent from its buffers after its handler returned, and
// an ended Run's buffer stays in the heap until a collection. Without a
// lease it does nothing.
func (c *Collector) Release() {
	if c.lease == nil {
		return
	}
	var later uint64
	for _, s := range []berthv1.Stream{berthv1.Stream_STREAM_STDOUT, berthv1.Stream_STREAM_STDERR} {
		if c.reserved[s] > SlabBytes && cap(c.kept[s]) > 0 {
			later += c.reserved[s]
		}
	}
	giveBack := c.lease.ReleaseLater(later)
	if later == 0 {
		return
	}
	// Each grown buffer counts itself off when it is freed; the bytes
	// come back once all are.
	p := &pendingBuffers{giveBack: giveBack}
	for _, s := range []berthv1.Stream{berthv1.Stream_STREAM_STDOUT, berthv1.Stream_STREAM_STDERR} {
		if b := c.kept[s]; c.reserved[s] > SlabBytes && cap(b) > 0 {
			p.left.Add(1)
			runtime.AddCleanup(&b[:cap(b)][0], (*pendingBuffers).freed, p)
		}
	}
}

// pendingBuffers gives an ended Run's budget back once its grown buffers
// are freed.
type pendingBuffers struct {
	left     atomic.Int32
	giveBack func()
}

func (p *pendingBuffers) freed() {
	if p.left.Add(-1) == 0 {
		p.giveBack()
	}
}

// Output takes one output event, as Write does; an event of an unknown
// stream is ignored.
func (c *Collector) Output(ctx context.Context, o *berthv1.ExecOutput) error {
	return c.Write(ctx, o.GetStream(), o.GetData())
}

// Write takes the bytes of one output event of stream s; it keeps a copy
// of them, so data may be reused when it returns. Bytes beyond a stream's
// cap are counted and discarded. When the stream's buffer must grow past
// what the collector's Lease holds for it, Write waits for the Budget
// (Lease.Grow) and fails with its *ExhaustedError, having kept nothing of
// data, when there is none.
func (c *Collector) Write(ctx context.Context, s berthv1.Stream, data []byte) error {
	if s != berthv1.Stream_STREAM_STDOUT && s != berthv1.Stream_STREAM_STDERR {
		return nil
	}
	room := c.caps[s] - uint64(len(c.kept[s]))
	take := data[:min(uint64(len(data)), room)]
	if len(take) > 0 {
		b := c.kept[s]
		if need := len(b) + len(take); need > cap(b) {
			n := grownCap(cap(b), need, c.caps[s])
			if c.lease != nil && n > c.reserved[s] {
				if err := c.lease.Grow(ctx, n-c.reserved[s]); err != nil {
					return err
				}
				c.reserved[s] = n
			}
			grown := make([]byte, len(b), n)
			copy(grown, b)
			b = grown
		}
		c.kept[s] = append(b, take...)
	}
	c.received[s] += uint64(len(data))
	return nil
}

// growDoubling is the capacity up to which a kept buffer grows by
// doubling; past it, it grows once to its cap.
const growDoubling = 64 << 10

// grownCap returns the capacity a buffer of capacity have grows to for
// need bytes, at most limit bytes, so that a buffer never takes more
// memory than its cap. It doubles small buffers and grows one past
// growDoubling to limit at once: doubling to the cap would leave as much
// again in garbage (the old arrays) until a collection, memory the budget
// does not count.
func grownCap(have, need int, limit uint64) uint64 {
	n := uint64(max(2*have, need, 4096))
	if n > growDoubling {
		n = limit
	}
	return min(n, limit)
}

// Dropped notes an ExecDropped event. The lost events may have belonged to
// any stream whose head was not complete yet; such a stream is lost unless
// all of its bytes arrive after all.
func (c *Collector) Dropped(d *berthv1.ExecDropped) {
	if c.dropped == nil {
		c.dropped = d
	}
	for _, s := range []berthv1.Stream{berthv1.Stream_STREAM_STDOUT, berthv1.Stream_STREAM_STDERR} {
		if uint64(len(c.kept[s])) < c.caps[s] {
			c.tainted[s] = true
		}
	}
}

// Response builds the RunResponse for res, the agent's result, or fails
// with a *LostError when a stream arrived short of what res says was
// written within its cap. Byte counts and truncation are berthd's own: a
// stream counts at least what arrived, and is truncated when it exceeded
// its cap by the agent's count or by what arrived.
func (c *Collector) Response(execID string, res *berthv1.ExecResult) (*berthv1.RunResponse, error) {
	res = proto.CloneOf(res)
	if res == nil {
		res = &berthv1.ExecResult{}
	}
	for _, s := range []berthv1.Stream{berthv1.Stream_STREAM_STDOUT, berthv1.Stream_STREAM_STDERR} {
		total := &res.StdoutBytes
		truncated := &res.StdoutTruncated
		if s == berthv1.Stream_STREAM_STDERR {
			total, truncated = &res.StderrBytes, &res.StderrTruncated
		}
		*total = max(*total, c.received[s])
		kept := uint64(len(c.kept[s]))
		want := min(*total, c.caps[s])
		if kept < want || c.tainted[s] && c.received[s] < *total {
			return nil, &LostError{Stream: s, Want: want, Got: kept, Dropped: c.dropped}
		}
		*truncated = *total > c.caps[s]
	}
	return &berthv1.RunResponse{
		ExecId: execID,
		Result: res,
		Stdout: c.kept[berthv1.Stream_STREAM_STDOUT],
		Stderr: c.kept[berthv1.Stream_STREAM_STDERR],
	}, nil
}
