// Package ring is the per-exec event log of berth-agent: an append-only
// sequence of events numbered 1, 2, 3, ... that retains the newest events
// within a byte budget, with flow control toward the writer.
//
// Any number of readers follow a Log at once, each with its own position.
// An event is only ever shed once every attached reader has read it: when
// the slowest attached reader is a log's budget behind, Append waits until it
// reads on (a writer feeding a Log from a pipe then stops reading the pipe,
// and the process writing into it blocks, as on a FIFO). With no reader
// attached a Log either sheds its oldest events (the default) or, in block
// mode, keeps what nobody has read and makes Append wait. A reader whose
// position fell behind the oldest retained event is told which sequence
// numbers and how many bytes it lost (see Follow for the one case where the
// byte count is a lower bound), and then continues with what is retained.
//
// Logs may share a Pool: a byte budget over all of them (one sandbox's
// retained output). Over the budget, an Append sheds what readers no longer
// need: events of ended (closed) Logs first, then its own, then other Logs'.
package ring

import (
	"fmt"
	"math"
	"sync"
)

// Pool is a byte budget shared by Logs. The zero value is not usable; create
// one with NewPool. All of its Logs share one lock.
type Pool struct {
	limit uint64

	mu   sync.Mutex
	used uint64 // bytes charged by the retained events of every Log
	logs []poolMember
	// space is closed and cleared when a reader advances, a reader detaches
	// or a Log leaves the pool, to wake Appends waiting for room. It is made
	// only when an Append waits.
	space    chan struct{}
	waiters  int  // Appends waiting for space
	released bool // Appends never wait again (Release)
}

// poolMember is the part of a Log the pool needs to shed from it without
// knowing its type.
type poolMember interface {
	isClosed() bool
	// shedSafe sheds the oldest event when every reader is done with it and
	// reports whether it did.
	shedSafe() bool
}

// NewPool returns a Pool whose Logs together retain at most limit bytes of
// charged events, beyond what attached readers have not read yet. Zero
// means no limit.
func NewPool(limit uint64) *Pool {
	if limit == 0 {
		limit = math.MaxUint64
	}
	return &Pool{limit: limit}
}

// Used returns the bytes charged by the events the pool's Logs retain.
func (p *Pool) Used() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Waiters returns how many Appends wait for readers right now.
func (p *Pool) Waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiters
}

// Limit returns the pool's budget in bytes (math.MaxUint64: none).
func (p *Pool) Limit() uint64 { return p.limit }

// Release makes every Append of the pool's Logs return without waiting from
// now on, shedding instead: for shutting down, when no reader will read.
func (p *Pool) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.released = true
	p.wakeWriters()
}

func (p *Pool) wakeWriters() {
	if p.space != nil {
		close(p.space)
		p.space = nil
	}
}

// makeRoom sheds, while the pool is over its budget, events no reader needs:
// those of closed Logs first (oldest Log first), then self's, then those of
// other open Logs. The caller holds p.mu.
func (p *Pool) makeRoom(self poolMember) {
	if p.used <= p.limit {
		return
	}
	for _, m := range p.logs {
		for p.used > p.limit && m.isClosed() && m.shedSafe() {
		}
	}
	for p.used > p.limit && self.shedSafe() {
	}
	for _, m := range p.logs {
		for p.used > p.limit && m != self && m.shedSafe() {
		}
	}
}

func (p *Pool) remove(m poolMember) {
	for i, x := range p.logs {
		if x == m {
			p.logs = append(p.logs[:i], p.logs[i+1:]...)
			return
		}
	}
}

// Config configures a Log.
type Config[T any] struct {
	// Limit is the most bytes the Log retains; an event of n data bytes is
	// charged n+Overhead. The newest event is always kept, even when it
	// alone exceeds Limit: a writer whose events may be larger than
	// MaxEventBytes cuts them to it, or the Log holds more than Limit.
	// Zero means no limit.
	Limit    uint64
	Overhead uint64
	// Block makes Append wait, while no reader is attached, once the events
	// no reader has read fill Limit; by default they are shed instead.
	Block bool
	// Pool is the budget the Log shares with others; nil gives the Log a
	// pool of its own without a limit.
	Pool *Pool
	// Stamp, when not nil, is called under the Log's lock with each
	// appended value and its sequence number before any reader can see it.
	Stamp func(v T, seq uint64)
}

// Log is a bounded event log of values of type T. The zero value is not
// usable; create one with New. All methods are safe for concurrent use.
type Log[T any] struct {
	limit    uint64
	overhead uint64
	block    bool
	stamp    func(v T, seq uint64)
	pool     *Pool
	mu       *sync.Mutex // the pool's

	// events is a FIFO of the retained events; events[head] has sequence
	// number first. Popped slots are zeroed so that shed values are freed.
	events []entry[T]
	head   int
	first  uint64 // sequence number of the oldest retained event
	next   uint64 // sequence number of the next appended event
	size   uint64 // budget charged by the retained events, in bytes
	// shedBytes is the total data size of the events shed so far, in bytes:
	// the cumulative data size through sequence number first-1.
	shedBytes uint64
	// shedSizes remembers the data sizes of the most recently shed events,
	// (at most maxShed of them) so that a reader placed by Follow behind the
	// retained events still learns how many bytes it lost.
	// shedSizes[shedHead] is the size of event shedFirst.
	shedSizes []uint32
	shedHead  int
	shedFirst uint64
	maxShed   int
	closed    bool
	dropped   bool // retains only what attached readers still need (Drop)

	// readers are the attached readers; read is the highest sequence
	// number any reader has consumed (block mode keeps what is above it).
	readers []*Reader[T]
	read    uint64
	// wake is closed and cleared by the next Append or Close. It is made
	// only when a reader asks to wait, so that appends with no one waiting
	// allocate nothing.
	wake chan struct{}
}

type entry[T any] struct {
	v   T
	len uint64 // data size in bytes
	end uint64 // cumulative data size through this event, in bytes
}

// Gap describes events that were shed before a reader consumed them: the
// sequence numbers First..Last inclusive, holding Bytes bytes of data. A
// zero Gap (Last == 0) means nothing was lost.
type Gap struct {
	First, Last uint64
	Bytes       uint64
}

// New returns an empty Log configured by cfg, a member of cfg.Pool.
func New[T any](cfg Config[T]) *Log[T] {
	limit := cfg.Limit
	if limit == 0 {
		limit = math.MaxUint64
	}
	pool := cfg.Pool
	if pool == nil {
		pool = NewPool(0)
	}
	// The shed index costs 4 bytes per event; bound it to a quarter of the
	// budget, and to at least a few thousand events for tiny budgets.
	maxShed := 4096
	if limit/16 > uint64(maxShed) {
		maxShed = int(min(limit/16, 1<<20))
	}
	l := &Log[T]{limit: limit, overhead: cfg.Overhead, block: cfg.Block, stamp: cfg.Stamp, pool: pool, mu: &pool.mu,
		first: 1, next: 1, shedFirst: 1, maxShed: maxShed}
	pool.mu.Lock()
	pool.logs = append(pool.logs, l)
	pool.mu.Unlock()
	return l
}

// Append adds v, holding n bytes of data (n < 4 GiB), as the next event,
// which readers can read at once, and returns its sequence number. It then
// sheds what no reader needs until the Log and its pool are within their
// budgets, and waits while that is not possible because an attached reader
// (or, in block mode with no reader attached, nobody) has not read this
// Log's older events yet: when the Log is over its own limit, or the pool is
// over its budget. Append after Close panics: the writer owns the Log's end.
func (l *Log[T]) Append(v T, n int) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		panic("ring: Append after Close")
	}
	seq := l.next
	l.next++
	if l.stamp != nil {
		l.stamp(v, seq)
	}
	end := l.shedBytes + uint64(n)
	if len(l.events) > l.head {
		end = l.events[len(l.events)-1].end + uint64(n)
	}
	l.events = append(l.events, entry[T]{v: v, len: uint64(n), end: end})
	l.charge(uint64(n) + l.overhead)
	l.wakeReaders()
	for {
		for l.size > l.limit && len(l.events)-l.head > 1 && l.shedSafe() {
		}
		l.pool.makeRoom(l)
		l.trimDropped()
		if !l.mustWait() {
			return seq
		}
		if l.pool.space == nil {
			l.pool.space = make(chan struct{})
		}
		space := l.pool.space
		l.pool.waiters++
		l.mu.Unlock()
		<-space
		l.mu.Lock()
		l.pool.waiters--
	}
}

// mustWait reports whether the writer has to wait for readers: the Log is
// over its limit, or the pool over its budget, with older events that a
// reader still needs.
func (l *Log[T]) mustWait() bool {
	if l.pool.released || l.dropped {
		return false
	}
	overOwn := l.size > l.limit && len(l.events)-l.head > 1
	overPool := l.pool.used > l.pool.limit && len(l.events)-l.head > 1
	return (overOwn || overPool) && !l.safe(l.first)
}

// safe reports whether the event seq may be shed: every attached reader
// has consumed it, and in block mode with no reader attached, some reader
// has.
func (l *Log[T]) safe(seq uint64) bool {
	if len(l.readers) == 0 {
		return !l.block || l.dropped || seq <= l.read
	}
	for _, r := range l.readers {
		if r.seq < seq {
			return false
		}
	}
	return true
}

func (l *Log[T]) charge(n uint64) {
	l.size += n
	l.pool.used += n
}

func (l *Log[T]) isClosed() bool { return l.closed }

// shedSafe sheds the oldest retained event if no reader needs it. The
// caller holds the lock.
func (l *Log[T]) shedSafe() bool {
	if len(l.events) == l.head || !l.safe(l.first) {
		return false
	}
	l.shed()
	return true
}

// trimDropped sheds what no reader needs from a dropped Log, and takes it
// out of its pool once it retains nothing.
func (l *Log[T]) trimDropped() {
	if !l.dropped {
		return
	}
	for l.shedSafe() {
	}
	if len(l.events) == l.head {
		l.pool.remove(l)
	}
}

// shed drops the oldest retained event.
func (l *Log[T]) shed() {
	e := &l.events[l.head]
	l.size -= e.len + l.overhead
	l.pool.used -= e.len + l.overhead
	l.shedBytes = e.end
	l.rememberShed(e.len)
	*e = entry[T]{}
	l.head++
	l.first++
	l.compact()
}

func (l *Log[T]) rememberShed(n uint64) {
	if len(l.shedSizes)-l.shedHead >= l.maxShed {
		l.shedSizes[l.shedHead] = 0
		l.shedHead++
		l.shedFirst++
	}
	l.shedSizes = append(l.shedSizes, uint32(n))
	if l.shedHead > 0 && l.shedHead >= len(l.shedSizes)/2 {
		l.shedSizes = append(l.shedSizes[:0], l.shedSizes[l.shedHead:]...)
		l.shedHead = 0
	}
}

// compact moves the retained events to the front of the slice once at least
// half of it is popped slots, so that memory stays proportional to what is
// retained and appends stay amortized O(1).
func (l *Log[T]) compact() {
	if l.head == 0 || l.head < len(l.events)/2 {
		return
	}
	n := copy(l.events, l.events[l.head:])
	clear(l.events[n:])
	l.events = l.events[:n]
	l.head = 0
}

// Close marks the end of the log: readers that have consumed every event see
// done. Close is idempotent.
func (l *Log[T]) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.wakeReaders()
}

// Drop ends the Log's retention: from now on it retains only what its
// attached readers have not read yet (they still get every event), and it
// leaves its pool once that is read. Drop is idempotent.
func (l *Log[T]) Drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped {
		return
	}
	l.dropped = true
	l.trimDropped()
	l.pool.wakeWriters()
}

func (l *Log[T]) wakeReaders() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// LastSeq returns the sequence number of the newest event, 0 when none was
// appended.
func (l *Log[T]) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

// MaxEventBytes returns the most data bytes an event may hold for the Log
// to retain it within Limit: Limit minus Overhead, at least 1 (with a Limit
// of Overhead or less no event fits, and each is retained alone), and
// math.MaxUint64 without a limit.
func (l *Log[T]) MaxEventBytes() uint64 {
	switch {
	case l.limit == math.MaxUint64:
		return math.MaxUint64
	case l.limit <= l.overhead:
		return 1
	}
	return l.limit - l.overhead
}

// RetainedBytes returns the bytes the Log's retained events are charged.
func (l *Log[T]) RetainedBytes() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// Reader is one reader's position in a Log: the last sequence number it has
// consumed and the cumulative data size through it. An attached Reader holds
// back the Log's shedding (and so its writer) until it has read; Close
// detaches it.
type Reader[T any] struct {
	l        *Log[T]
	seq      uint64 // the last sequence number consumed
	bytes    uint64 // cumulative data size through seq, in bytes
	attached bool
}

// Follow returns a reader positioned after sequence number since, for a
// reader that has consumed events 1..since elsewhere, attached to the Log
// until Close. It fails when since is beyond the newest event. When events
// after since were shed and the shed index no longer remembers all of them,
// the first Read reports a Gap whose Bytes counts only the lost events the
// index remembers.
func (l *Log[T]) Follow(since uint64) (*Reader[T], error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if since >= l.next {
		return nil, fmt.Errorf("sequence number %d is beyond the last event %d", since, l.next-1)
	}
	r := &Reader[T]{l: l, seq: since, attached: true}
	switch {
	case since == 0:
	case since >= l.first:
		r.bytes = l.events[l.head+int(since-l.first)].end
	default:
		// since was shed: subtract the sizes of the shed events after it
		// from the cumulative size through first-1. Events older than the
		// index are not subtracted, so they are reported lost with zero
		// bytes rather than a guessed size.
		r.bytes = l.shedBytes
		from := max(since+1, l.shedFirst)
		for s := from; s < l.first; s++ {
			r.bytes -= uint64(l.shedSizes[l.shedHead+int(s-l.shedFirst)])
		}
	}
	l.read = max(l.read, since)
	l.readers = append(l.readers, r)
	// In block mode, events up to since count as read now.
	l.pool.wakeWriters()
	return r, nil
}

// Seq returns the last sequence number the reader consumed.
func (r *Reader[T]) Seq() uint64 {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	return r.seq
}

// Close detaches the reader: the Log no longer waits for it. It is
// idempotent; Read keeps working on a closed reader, without holding back
// the writer.
func (r *Reader[T]) Close() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !r.attached {
		return
	}
	r.attached = false
	for i, x := range l.readers {
		if x == r {
			l.readers = append(l.readers[:i], l.readers[i+1:]...)
			break
		}
	}
	l.trimDropped()
	l.pool.wakeWriters()
}

// Read appends to out the events after the reader's position, oldest first,
// until out is full (out must have spare capacity), advances past them and
// returns out. When events between the position and the oldest retained
// event were shed, it reports them as gap (and moves past them). done is
// true when the Log is closed and every event was consumed. When nothing is
// returned and the log is not done, wake is closed by the next Append or
// Close; otherwise wake is nil.
func (r *Reader[T]) Read(out []T) (events []T, gap Gap, done bool, wake <-chan struct{}) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	before := r.seq
	defer func() {
		if r.seq != before {
			l.read = max(l.read, r.seq)
			l.trimDropped()
			l.pool.wakeWriters()
		}
	}()
	if r.seq+1 < l.first {
		gap = Gap{First: r.seq + 1, Last: l.first - 1, Bytes: l.shedBytes - r.bytes}
		r.seq = l.first - 1
		r.bytes = l.shedBytes
	}
	if r.seq+1 < l.next {
		i := l.head + int(r.seq+1-l.first)
		for ; i < len(l.events) && len(out) < cap(out); i++ {
			out = append(out, l.events[i].v)
			r.seq++
			r.bytes = l.events[i].end
		}
		return out, gap, false, nil
	}
	if gap.Last != 0 {
		return out, gap, false, nil
	}
	if l.closed {
		return out, gap, true, nil
	}
	if l.wake == nil {
		l.wake = make(chan struct{})
	}
	return out, gap, false, l.wake
}
