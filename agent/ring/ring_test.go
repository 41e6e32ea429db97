package ring_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-sandbox/berth/agent/ring"
)

type ev struct {
	seq  uint64
	data string
}

func stamp(e *ev, seq uint64) { e.seq = seq }

func newLog(limit, overhead uint64) *ring.Log[*ev] {
	return ring.New(ring.Config[*ev]{Limit: limit, Overhead: overhead, Stamp: stamp})
}

func add(l *ring.Log[*ev], n int) uint64 {
	return l.Append(&ev{data: string(make([]byte, n))}, n)
}

// drain reads everything available to r.
func drain(r *ring.Reader[*ev]) (got []string, gaps []ring.Gap, done bool) {
	buf := make([]*ev, 0, 2)
	for {
		evs, gap, d, wake := r.Read(buf[:0])
		if gap.Last != 0 {
			gaps = append(gaps, gap)
		}
		for _, e := range evs {
			got = append(got, e.data)
		}
		if len(evs) == 0 && gap.Last == 0 {
			return got, gaps, d || wake == nil
		}
	}
}

// detached returns a reader after since that does not hold the writer back.
func detached(t *testing.T, l *ring.Log[*ev], since uint64) *ring.Reader[*ev] {
	t.Helper()
	r, err := l.Follow(since)
	if err != nil {
		t.Fatalf("Follow(%d): %v", since, err)
	}
	r.Close()
	return r
}

// writeAsync appends n events of size bytes to l in a goroutine, then
// closes l when end is set; the channel is closed when it is done.
func writeAsync(l *ring.Log[*ev], n, size int, end bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			add(l, size)
		}
		if end {
			l.Close()
		}
	}()
	return done
}

// readToEnd reads r, batch events at a time, until the log is done, and
// returns how many events it read; it fails on a gap.
func readToEnd(t *testing.T, r *ring.Reader[*ev], batch int) int {
	t.Helper()
	var read int
	buf := make([]*ev, 0, batch)
	for {
		evs, gap, done, wake := r.Read(buf[:0])
		if gap.Last != 0 {
			t.Fatalf("reader got a gap %+v", gap)
		}
		read += len(evs)
		if done {
			return read
		}
		if wake != nil {
			<-wake
		}
	}
}

// awaitWaiters waits, at most 10 s, until n Appends of pool wait.
func awaitWaiters(t *testing.T, pool *ring.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for pool.Waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d Appends wait, want %d", pool.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAppendRead(t *testing.T) {
	l := newLog(1<<20, 0)
	r := detached(t, l, 0)
	for i, s := range []string{"a", "bb", "ccc"} {
		e := &ev{data: s}
		if got, want := l.Append(e, len(s)), uint64(i+1); got != want || e.seq != want {
			t.Fatalf("Append(%q) = %d (stamped %d), want %d", s, got, e.seq, want)
		}
	}
	got, gaps, done := drain(r)
	if diff := cmp.Diff([]string{"a", "bb", "ccc"}, got); diff != "" || gaps != nil || done {
		t.Fatalf("drain: events diff (-want +got):\n%s gaps %v done %v", diff, gaps, done)
	}
	if r.Seq() != 3 {
		t.Errorf("reader seq = %d, want 3", r.Seq())
	}
	l.Close()
	if _, _, done := drain(r); !done {
		t.Errorf("drain after Close: done = false, want true")
	}
}

// TestShedding checks what a log with no reader attached keeps, and what a
// reader that follows it later is told it lost.
func TestShedding(t *testing.T) {
	tests := []struct {
		name     string
		limit    uint64
		overhead uint64
		sizes    []int
		since    uint64
		wantGaps []ring.Gap
		wantLeft int // events retained after the gap
	}{
		{"fits", 100, 0, []int{10, 20, 30}, 0, nil, 3},
		{"sheds oldest", 49, 0, []int{10, 20, 30}, 0, []ring.Gap{{First: 1, Last: 2, Bytes: 30}}, 1},
		{"overhead counts", 100, 40, []int{1, 1, 1}, 0, []ring.Gap{{First: 1, Last: 1, Bytes: 1}}, 2},
		{"newest kept alone", 5, 0, []int{3, 100}, 0, []ring.Gap{{First: 1, Last: 1, Bytes: 3}}, 1},
		{"since inside shed range", 50, 0, []int{10, 20, 30, 5}, 1, []ring.Gap{{First: 2, Last: 2, Bytes: 20}}, 2},
		{"since at first retained", 50, 0, []int{10, 20, 30, 5}, 2, nil, 2},
		{"since at last", 50, 0, []int{10, 20, 30, 5}, 4, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLog(tt.limit, tt.overhead)
			for _, n := range tt.sizes {
				add(l, n)
			}
			r := detached(t, l, tt.since)
			got, gaps, _ := drain(r)
			if diff := cmp.Diff(tt.wantGaps, gaps); diff != "" {
				t.Errorf("gaps diff (-want +got):\n%s", diff)
			}
			if len(got) != tt.wantLeft {
				t.Errorf("got %d events after the gap, want %d", len(got), tt.wantLeft)
			}
			if r.Seq() != uint64(len(tt.sizes)) {
				t.Errorf("reader seq = %d, want %d", r.Seq(), len(tt.sizes))
			}
		})
	}
}

// TestMaxEventBytes checks the event size that fits a Log's limit, and
// that events of that size keep a Log with no reader within its limit.
func TestMaxEventBytes(t *testing.T) {
	tests := []struct {
		limit, overhead, want uint64
	}{
		{4096, 160, 3936},
		{100, 0, 100},
		{161, 160, 1},
		{160, 160, 1}, // no event fits: at least a byte
		{10, 160, 1},
		{0, 160, math.MaxUint64}, // no limit
	}
	for _, tt := range tests {
		l := newLog(tt.limit, tt.overhead)
		if got := l.MaxEventBytes(); got != tt.want {
			t.Errorf("limit %d, overhead %d: MaxEventBytes = %d, want %d", tt.limit, tt.overhead, got, tt.want)
		}
	}
	l := newLog(4096, 160)
	for _, n := range []int{3936, 1, 3936, 2000, 3936, 3936} {
		add(l, n)
		if got := l.RetainedBytes(); got > 4096 {
			t.Fatalf("after an event of %d bytes: retained %d, over the limit of 4096", n, got)
		}
	}
}

func TestFollowBeyondEnd(t *testing.T) {
	l := newLog(100, 0)
	add(l, 1)
	if _, err := l.Follow(2); err == nil {
		t.Errorf("Follow(2) with 1 event: err = nil, want an error")
	}
}

// TestReaderBehind checks that a detached reader that falls behind learns
// the exact bytes it lost, across many sheds, and that lost + read =
// appended.
func TestReaderBehind(t *testing.T) {
	l := newLog(64, 0)
	r := detached(t, l, 0)
	var appended, read, lost uint64
	count := func() {
		got, gaps, _ := drain(r)
		for _, s := range got {
			read += uint64(len(s))
		}
		for _, g := range gaps {
			lost += g.Bytes
		}
	}
	for i := range 1000 {
		n := i%7 + 1
		add(l, n)
		appended += uint64(n)
		if i%50 == 0 {
			count()
		}
	}
	count()
	if read+lost != appended {
		t.Errorf("read %d + lost %d = %d, want appended %d", read, lost, read+lost, appended)
	}
	if lost == 0 {
		t.Errorf("lost nothing; want the detached reader to have fallen behind")
	}
}

// TestAttachedReaderHoldsWriter checks flow control: with a reader
// attached, Append waits once the log is a budget ahead of it, and the
// reader gets every event, however slowly it reads.
func TestAttachedReaderHoldsWriter(t *testing.T) {
	pool := ring.NewPool(0)
	l := ring.New(ring.Config[*ev]{Limit: 30, Pool: pool, Stamp: stamp})
	r, err := l.Follow(0)
	if err != nil {
		t.Fatal(err)
	}
	const events = 200
	done := writeAsync(l, events, 10, true)
	// The writer stops: the log holds what fits plus the event it waits
	// behind, all unread.
	awaitWaiters(t, pool, 1)
	if got := l.RetainedBytes(); got > 40 {
		t.Errorf("retained %d bytes while waiting, want at most the limit 30 + one event", got)
	}
	read := readToEnd(t, r, 1) // one event per Read: a slow reader
	<-done
	if read != events {
		t.Errorf("read %d events, want %d", read, events)
	}
}

// TestDetachedDoesNotWait checks that with no reader attached the default
// log sheds instead of waiting, and that closing the last reader releases a
// waiting writer.
func TestDetachedDoesNotWait(t *testing.T) {
	pool := ring.NewPool(0)
	l := ring.New(ring.Config[*ev]{Limit: 30, Pool: pool, Stamp: stamp})
	for range 100 {
		add(l, 10) // returns: nobody to wait for
	}
	r, err := l.Follow(l.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	done := writeAsync(l, 10, 10, false)
	awaitWaiters(t, pool, 1)
	r.Close()
	<-done
}

// TestBlockMode checks a log that keeps unread events with no reader
// attached: the writer waits until a reader attaches and reads, and that
// reader loses nothing.
func TestBlockMode(t *testing.T) {
	pool := ring.NewPool(0)
	l := ring.New(ring.Config[*ev]{Limit: 30, Block: true, Pool: pool, Stamp: stamp})
	const events = 50
	done := writeAsync(l, events, 10, true)
	awaitWaiters(t, pool, 1)
	r, err := l.Follow(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	read := readToEnd(t, r, 4)
	<-done
	if read != events {
		t.Errorf("read %d events, want %d", read, events)
	}
}

// TestPool checks the shared budget: it holds across logs, the events of
// closed logs go first, and a log whose reader is behind waits while the
// pool is full.
func TestPool(t *testing.T) {
	pool := ring.NewPool(100)
	ended := ring.New(ring.Config[*ev]{Pool: pool, Stamp: stamp})
	running := ring.New(ring.Config[*ev]{Pool: pool, Stamp: stamp})
	for range 4 {
		add(ended, 10)
		add(running, 10)
	}
	ended.Close()
	if got := pool.Used(); got != 80 {
		t.Fatalf("pool used = %d, want 80", got)
	}
	// 40 more bytes, 20 over the budget: the ended log's oldest go first.
	for range 4 {
		add(running, 10)
	}
	if got, want := ended.RetainedBytes(), uint64(20); got != want {
		t.Errorf("ended log retains %d bytes, want %d", got, want)
	}
	if got, want := running.RetainedBytes(), uint64(80); got != want {
		t.Errorf("running log retains %d bytes, want %d", got, want)
	}
	// Then the rest of the ended log, then the running log's own oldest.
	for range 6 {
		add(running, 10)
	}
	if got, want := ended.RetainedBytes(), uint64(0); got != want {
		t.Errorf("ended log retains %d bytes, want %d", got, want)
	}
	if got, want := pool.Used(), uint64(100); got != want {
		t.Errorf("pool used = %d, want %d", got, want)
	}

	// An attached reader that has read nothing holds its log's events: the
	// writer waits for it once the pool is full.
	slow := ring.New(ring.Config[*ev]{Pool: pool, Stamp: stamp})
	r, err := slow.Follow(0)
	if err != nil {
		t.Fatal(err)
	}
	done := writeAsync(slow, 20, 10, false)
	awaitWaiters(t, pool, 1)
	if got := slow.RetainedBytes(); got > 110 {
		t.Errorf("slow log retains %d bytes while waiting, want at most the pool's 100 + one event", got)
	}
	got, gaps, _ := drain(r)
	<-done
	got2, gaps2, _ := drain(r)
	if n := len(got) + len(got2); n != 20 || gaps != nil || gaps2 != nil {
		t.Errorf("slow reader read %d events with gaps %v %v, want 20 and no gap", n, gaps, gaps2)
	}
	r.Close()
}

// TestRelease checks that Release frees waiting writers.
func TestRelease(t *testing.T) {
	pool := ring.NewPool(0)
	l := ring.New(ring.Config[*ev]{Limit: 10, Pool: pool, Stamp: stamp})
	if _, err := l.Follow(0); err != nil {
		t.Fatal(err)
	}
	done := writeAsync(l, 10, 10, false)
	awaitWaiters(t, pool, 1)
	pool.Release()
	<-done
}

// TestDrop checks that a dropped log keeps what its attached reader has not
// read, frees the rest at once, and frees everything once read.
func TestDrop(t *testing.T) {
	pool := ring.NewPool(0)
	l := ring.New(ring.Config[*ev]{Pool: pool, Stamp: stamp})
	r, err := l.Follow(0)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		add(l, 10)
	}
	buf := make([]*ev, 0, 1)
	r.Read(buf) // one of four
	l.Close()
	l.Drop()
	if got := pool.Used(); got != 30 {
		t.Errorf("pool used after Drop = %d, want the 30 unread bytes", got)
	}
	got, gaps, done := drain(r)
	if len(got) != 3 || gaps != nil || !done {
		t.Errorf("reader of a dropped log got %d events, gaps %v, done %v; want 3, none, true", len(got), gaps, done)
	}
	if got := pool.Used(); got != 0 {
		t.Errorf("pool used once read = %d, want 0", got)
	}
	if _, err := l.Follow(0); err != nil {
		t.Fatal(err)
	}
	if _, gaps, _ := drain(detached(t, l, 0)); len(gaps) != 1 {
		t.Errorf("a later reader got gaps %v, want one for everything", gaps)
	}
}

// TestWake checks that a waiting reader is woken by Append and Close.
func TestWake(t *testing.T) {
	l := newLog(100, 0)
	r := detached(t, l, 0)
	buf := make([]*ev, 0, 4)
	_, _, _, wake := r.Read(buf)
	if wake == nil {
		t.Fatal("Read on an empty log: wake = nil, want a channel")
	}
	var wg sync.WaitGroup
	wg.Go(func() { l.Append(&ev{data: "x"}, 1) })
	<-wake
	wg.Wait()
	evs, _, _, _ := r.Read(buf)
	if len(evs) != 1 {
		t.Fatalf("Read after wake = %d events, want 1", len(evs))
	}
	_, _, _, wake = r.Read(buf)
	wg.Go(l.Close)
	<-wake
	wg.Wait()
	if _, _, done, _ := r.Read(buf); !done {
		t.Errorf("Read after Close: done = false, want true")
	}
}
