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
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/bounds"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Budget is a byte budget shared by all Runs of a server: each Run reserves
// its caps before it starts and releases them when it returns. The zero
// value is not usable; create one with NewBudget.
type Budget struct {
	limit uint64
	mu    sync.Mutex
	used  uint64
}

// NewBudget returns a Budget of limit bytes; zero means no limit.
func NewBudget(limit uint64) *Budget { return &Budget{limit: limit} }

// Reserve takes n bytes of the budget and returns the function that gives
// them back (idempotent). When they do not fit, or their sum with what is
// held would not fit in 64 bits, ok is false and used is what other Runs
// hold.
func (b *Budget) Reserve(n uint64) (release func(), used uint64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sum, ok := bounds.Add(b.used, n); !ok || b.limit > 0 && sum > b.limit {
		return nil, b.used, false
	}
	b.used += n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.used -= n
			b.mu.Unlock()
		})
	}, b.used, true
}

// Limit returns the budget in bytes; zero means none.
func (b *Budget) Limit() uint64 { return b.limit }

// Used returns the bytes reserved now.
func (b *Budget) Used() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
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
}

// NewCollector returns a Collector that keeps the first stdoutCap bytes of
// stdout and stderrCap of stderr.
func NewCollector(stdoutCap, stderrCap uint64) *Collector {
	c := &Collector{}
	c.caps[berthv1.Stream_STREAM_STDOUT] = stdoutCap
	c.caps[berthv1.Stream_STREAM_STDERR] = stderrCap
	return c
}

// Output takes one output event. Bytes beyond a stream's cap are counted
// and discarded; an event of an unknown stream is ignored.
func (c *Collector) Output(o *berthv1.ExecOutput) { c.Write(o.GetStream(), o.GetData()) }

// Write takes the bytes of one output event of stream s, as Output does;
// it keeps a copy of them, so data may be reused when it returns.
func (c *Collector) Write(s berthv1.Stream, data []byte) {
	if s != berthv1.Stream_STREAM_STDOUT && s != berthv1.Stream_STREAM_STDERR {
		return
	}
	c.received[s] += uint64(len(data))
	room := c.caps[s] - uint64(len(c.kept[s]))
	if room == 0 {
		return
	}
	data = data[:min(uint64(len(data)), room)]
	c.kept[s] = appendCapped(c.kept[s], data, c.caps[s])
}

// growDoubling is the capacity up to which a kept buffer grows by
// doubling; past it, it grows once to its cap.
const growDoubling = 64 << 10

// appendCapped appends data to b, growing it at most to limit bytes of
// capacity, so that a buffer never takes more memory than its cap. It
// doubles small buffers and grows one past growDoubling to limit at once:
// doubling to the cap would leave as much again in garbage (the old
// arrays) until a collection, memory the budget does not count, while the
// cap is what the budget reserved for the stream anyway.
func appendCapped(b, data []byte, limit uint64) []byte {
	need := len(b) + len(data)
	if need > cap(b) {
		n := uint64(max(2*cap(b), need, 4096))
		if n > growDoubling {
			n = limit
		}
		grown := make([]byte, len(b), min(n, limit))
		copy(grown, b)
		b = grown
	}
	return append(b, data...)
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
