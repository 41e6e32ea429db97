package ring_test

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-sandbox/berth/agent/ring"
)

type ev struct {
	seq  uint64
	data string
}

func stamp(e *ev, seq uint64) { e.seq = seq }

// drain reads everything available after c.
func drain(l *ring.Log[*ev], c *ring.Cursor) (got []string, gaps []ring.Gap, done bool) {
	buf := make([]*ev, 0, 2)
	for {
		evs, gap, d, wake := l.Read(c, buf[:0])
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

func TestAppendRead(t *testing.T) {
	l := ring.New(1<<20, 0, stamp)
	var c ring.Cursor
	for i, s := range []string{"a", "bb", "ccc"} {
		e := &ev{data: s}
		if got, want := l.Append(e, len(s)), uint64(i+1); got != want || e.seq != want {
			t.Fatalf("Append(%q) = %d (stamped %d), want %d", s, got, e.seq, want)
		}
	}
	got, gaps, done := drain(l, &c)
	if diff := cmp.Diff([]string{"a", "bb", "ccc"}, got); diff != "" || gaps != nil || done {
		t.Fatalf("drain: events diff (-want +got):\n%s gaps %v done %v", diff, gaps, done)
	}
	if c.Seq != 3 {
		t.Errorf("cursor seq = %d, want 3", c.Seq)
	}
	l.Close()
	if _, _, done := drain(l, &c); !done {
		t.Errorf("drain after Close: done = false, want true")
	}
}

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
			l := ring.New(tt.limit, tt.overhead, stamp)
			for _, n := range tt.sizes {
				l.Append(&ev{data: string(make([]byte, n))}, n)
			}
			c, err := l.Seek(tt.since)
			if err != nil {
				t.Fatalf("Seek(%d): %v", tt.since, err)
			}
			got, gaps, _ := drain(l, &c)
			if diff := cmp.Diff(tt.wantGaps, gaps); diff != "" {
				t.Errorf("gaps diff (-want +got):\n%s", diff)
			}
			if len(got) != tt.wantLeft {
				t.Errorf("got %d events after the gap, want %d", len(got), tt.wantLeft)
			}
			if c.Seq != uint64(len(tt.sizes)) {
				t.Errorf("cursor seq = %d, want %d", c.Seq, len(tt.sizes))
			}
		})
	}
}

func TestSeekBeyondEnd(t *testing.T) {
	l := ring.New(100, 0, stamp)
	l.Append(&ev{}, 1)
	if _, err := l.Seek(2); err == nil {
		t.Errorf("Seek(2) with 1 event: err = nil, want an error")
	}
}

// TestReaderBehind checks that a live reader that falls behind learns the
// exact bytes it lost, across many sheds, and that lost + read = appended.
func TestReaderBehind(t *testing.T) {
	l := ring.New(64, 0, stamp)
	var c ring.Cursor
	var appended, read, lost uint64
	for i := range 1000 {
		n := i%7 + 1
		l.Append(&ev{data: string(make([]byte, n))}, n)
		appended += uint64(n)
		if i%50 == 0 {
			got, gaps, _ := drain(l, &c)
			for _, s := range got {
				read += uint64(len(s))
			}
			for _, g := range gaps {
				lost += g.Bytes
			}
		}
	}
	got, gaps, _ := drain(l, &c)
	for _, s := range got {
		read += uint64(len(s))
	}
	for _, g := range gaps {
		lost += g.Bytes
	}
	if read+lost != appended {
		t.Errorf("read %d + lost %d = %d, want appended %d", read, lost, read+lost, appended)
	}
}

// TestWake checks that a waiting reader is woken by Append and Close.
func TestWake(t *testing.T) {
	l := ring.New(100, 0, stamp)
	var c ring.Cursor
	buf := make([]*ev, 0, 4)
	_, _, _, wake := l.Read(&c, buf)
	if wake == nil {
		t.Fatal("Read on an empty log: wake = nil, want a channel")
	}
	var wg sync.WaitGroup
	wg.Go(func() { l.Append(&ev{data: "x"}, 1) })
	<-wake
	wg.Wait()
	evs, _, _, _ := l.Read(&c, buf)
	if len(evs) != 1 {
		t.Fatalf("Read after wake = %d events, want 1", len(evs))
	}
	_, _, _, wake = l.Read(&c, buf)
	wg.Go(l.Close)
	<-wake
	wg.Wait()
	if _, _, done, _ := l.Read(&c, buf); !done {
		t.Errorf("Read after Close: done = false, want true")
	}
}
