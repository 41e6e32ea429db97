// Package ring is the per-exec event log of berth-agent: an append-only
// sequence of events numbered 1, 2, 3, ... that keeps only the newest events
// within a byte budget. Any number of readers follow it at once, each with its
// own Cursor; a reader whose cursor fell behind the oldest retained event is
// told which sequence numbers and how many bytes it lost (see Seek for the
// one case where the byte count is a lower bound), and then continues with
// what is retained.
package ring

import (
	"fmt"
	"sync"
)

// Log is a bounded event log of values of type T. The zero value is not
// usable; create one with New. All methods are safe for concurrent use.
type Log[T any] struct {
	limit    uint64
	overhead uint64
	stamp    func(v T, seq uint64)

	mu sync.Mutex
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
	// (at most maxShed of them) so that a cursor created by Seek behind the
	// retained events still learns how many bytes it lost. shedSizes[shedHead]
	// is the size of event shedFirst.
	shedSizes []uint32
	shedHead  int
	shedFirst uint64
	maxShed   int
	closed    bool
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

// Cursor is a reader's position in a Log: the last sequence number it has
// consumed (0 before the first event) and the cumulative data size through
// it. The zero Cursor starts at the beginning.
type Cursor struct {
	// Seq is the last sequence number consumed.
	Seq uint64
	// bytes is the cumulative data size through Seq, in bytes.
	bytes uint64
}

// Gap describes events that were shed before a reader consumed them: the
// sequence numbers First..Last inclusive, holding Bytes bytes of data. A
// zero Gap (Last == 0) means nothing was lost.
type Gap struct {
	First, Last uint64
	Bytes       uint64
}

// New returns an empty Log that keeps the newest events whose charge fits in
// limit bytes, where an event of n data bytes is charged n+overhead bytes.
// The newest event is always kept, even when it alone exceeds limit. stamp,
// when not nil, is called under the Log's lock with each appended value and
// its sequence number before any reader can see the value.
func New[T any](limit, overhead uint64, stamp func(v T, seq uint64)) *Log[T] {
	// The shed index costs 4 bytes per event; bound it to a quarter of the
	// budget, and to at least a few thousand events for tiny budgets.
	maxShed := max(int(limit/16), 4096)
	return &Log[T]{limit: limit, overhead: overhead, stamp: stamp, first: 1, next: 1, shedFirst: 1, maxShed: maxShed}
}

// Append adds v, holding n bytes of data (n < 4 GiB), as the next event and returns its
// sequence number. It sheds the oldest events while the budget is exceeded.
// Append after Close panics: the writer owns the Log's end.
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
	l.size += uint64(n) + l.overhead
	for l.size > l.limit && len(l.events)-l.head > 1 {
		l.shed()
	}
	l.compact()
	l.wakeLocked()
	return seq
}

// shed drops the oldest retained event.
func (l *Log[T]) shed() {
	e := &l.events[l.head]
	l.size -= e.len + l.overhead
	l.shedBytes = e.end
	l.rememberShed(e.len)
	*e = entry[T]{}
	l.head++
	l.first++
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
	l.wakeLocked()
}

func (l *Log[T]) wakeLocked() {
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

// Seek returns a cursor positioned after sequence number since, for a reader
// that has consumed events 1..since elsewhere. It fails when since is beyond
// the newest event. When events after since were shed and the shed index no
// longer remembers all of them, the first Read reports a Gap whose Bytes
// counts only the lost events the index remembers.
func (l *Log[T]) Seek(since uint64) (Cursor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if since >= l.next {
		return Cursor{}, fmt.Errorf("sequence number %d is beyond the last event %d", since, l.next-1)
	}
	switch {
	case since == 0:
		return Cursor{}, nil
	case since >= l.first:
		return Cursor{Seq: since, bytes: l.events[l.head+int(since-l.first)].end}, nil
	}
	// since was shed: subtract the sizes of the shed events after it from
	// the cumulative size through first-1. Events older than the index are
	// not subtracted, so they are reported lost with zero bytes rather than
	// a guessed size.
	bytes := l.shedBytes
	from := max(since+1, l.shedFirst)
	for s := from; s < l.first; s++ {
		bytes -= uint64(l.shedSizes[l.shedHead+int(s-l.shedFirst)])
	}
	return Cursor{Seq: since, bytes: bytes}, nil
}

// Read appends to out the events after c, oldest first, until out is full
// (out must have spare capacity),
// advances c past them and returns out. When events between c and the oldest
// retained event were shed, it reports them as gap (and c moves past them).
// done is true when the Log is closed and c has consumed every event. When
// nothing is returned and the log is not done, wake is closed by the next
// Append or Close; otherwise wake is nil.
func (l *Log[T]) Read(c *Cursor, out []T) (events []T, gap Gap, done bool, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.Seq+1 < l.first {
		gap = Gap{First: c.Seq + 1, Last: l.first - 1, Bytes: l.shedBytes - c.bytes}
		c.Seq = l.first - 1
		c.bytes = l.shedBytes
	}
	if c.Seq+1 < l.next {
		i := l.head + int(c.Seq+1-l.first)
		for ; i < len(l.events) && len(out) < cap(out); i++ {
			out = append(out, l.events[i].v)
			c.Seq++
			c.bytes = l.events[i].end
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
