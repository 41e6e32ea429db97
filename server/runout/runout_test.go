package runout_test

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runout"
)

func out(s berthv1.Stream, data string) *berthv1.ExecOutput {
	return &berthv1.ExecOutput{Stream: s, Data: []byte(data)}
}

const (
	stdout = berthv1.Stream_STREAM_STDOUT
	stderr = berthv1.Stream_STREAM_STDERR
)

func TestCollector(t *testing.T) {
	tests := []struct {
		name          string
		caps          [2]uint64
		events        []*berthv1.ExecOutput
		dropAt        int // the event before which events were dropped; 0: none
		result        *berthv1.ExecResult
		wantOut       string
		wantErr       string
		wantLost      bool
		wantTotal     uint64
		wantTruncated bool
	}{
		{name: "within caps", caps: [2]uint64{10, 10}, events: []*berthv1.ExecOutput{out(stdout, "abc"), out(stderr, "x"), out(stdout, "de")},
			result: &berthv1.ExecResult{StdoutBytes: 5, StderrBytes: 1}, wantOut: "abcde", wantErr: "x", wantTotal: 5},
		{name: "head kept", caps: [2]uint64{4, 10}, events: []*berthv1.ExecOutput{out(stdout, "abc"), out(stdout, "def")},
			result: &berthv1.ExecResult{StdoutBytes: 6, StdoutTruncated: true}, wantOut: "abcd", wantTotal: 6, wantTruncated: true},
		{name: "agent sends beyond the cap", caps: [2]uint64{2, 10}, events: []*berthv1.ExecOutput{out(stdout, "abcdef")},
			result: &berthv1.ExecResult{StdoutBytes: 6}, wantOut: "ab", wantTotal: 6, wantTruncated: true},
		{name: "agent undercounts", caps: [2]uint64{10, 10}, events: []*berthv1.ExecOutput{out(stdout, "abcdef")},
			result: &berthv1.ExecResult{StdoutBytes: 2}, wantOut: "abcdef", wantTotal: 6},
		{name: "bytes missing", caps: [2]uint64{10, 10}, events: []*berthv1.ExecOutput{out(stdout, "abc")},
			result: &berthv1.ExecResult{StdoutBytes: 5}, wantLost: true},
		{name: "dropped within the head", caps: [2]uint64{4, 10}, events: []*berthv1.ExecOutput{out(stdout, "ab"), out(stdout, "cd")}, dropAt: 2,
			result: &berthv1.ExecResult{StdoutBytes: 8, StdoutTruncated: true}, wantLost: true},
		{name: "dropped after the head", caps: [2]uint64{2, 0}, events: []*berthv1.ExecOutput{out(stdout, "ab"), out(stdout, "cd")}, dropAt: 2,
			result: &berthv1.ExecResult{StdoutBytes: 8, StdoutTruncated: true}, wantOut: "ab", wantTotal: 8, wantTruncated: true},
		{name: "dropped but the stream arrived whole", caps: [2]uint64{10, 10}, events: []*berthv1.ExecOutput{out(stdout, "ab")}, dropAt: 1,
			result: &berthv1.ExecResult{StdoutBytes: 2}, wantOut: "ab", wantTotal: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := runout.NewCollector(tt.caps[0], tt.caps[1])
			for i, e := range tt.events {
				if tt.dropAt == i+1 {
					c.Dropped(&berthv1.ExecDropped{FirstSeq: 1, LastSeq: 1, LostBytes: 3})
				}
				c.Output(e)
			}
			resp, err := c.Response("ex", tt.result)
			if tt.wantLost {
				var lost *runout.LostError
				if !errors.As(err, &lost) || !errors.Is(err, runout.ErrOutputLost) {
					t.Fatalf("Response: err = %v, want a *LostError", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Response: %v", err)
			}
			if got := string(resp.GetStdout()); got != tt.wantOut {
				t.Errorf("stdout = %q, want %q", got, tt.wantOut)
			}
			if got := string(resp.GetStderr()); got != tt.wantErr {
				t.Errorf("stderr = %q, want %q", got, tt.wantErr)
			}
			if got := resp.GetResult().GetStdoutBytes(); got != tt.wantTotal {
				t.Errorf("stdout_bytes = %d, want %d", got, tt.wantTotal)
			}
			if got := resp.GetResult().GetStdoutTruncated(); got != tt.wantTruncated {
				t.Errorf("stdout_truncated = %v, want %v", got, tt.wantTruncated)
			}
			if got := uint64(cap(resp.GetStdout())); got > tt.caps[0] {
				t.Errorf("stdout buffer capacity %d exceeds its cap %d", got, tt.caps[0])
			}
		})
	}
}

// TestCollectorBoundsMemory feeds far more than the caps, as a hostile agent
// would: the collector keeps the caps' worth.
func TestCollectorBoundsMemory(t *testing.T) {
	c := runout.NewCollector(1<<20, 1<<10)
	chunk := bytes.Repeat([]byte{'z'}, 256<<10)
	for range 4096 { // 1 GiB
		c.Output(&berthv1.ExecOutput{Stream: stdout, Data: chunk})
		c.Output(&berthv1.ExecOutput{Stream: stderr, Data: chunk})
	}
	resp, err := c.Response("ex", &berthv1.ExecResult{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cap(resp.GetStdout()); got != 1<<20 {
		t.Errorf("stdout capacity = %d, want 1 MiB", got)
	}
	if got := resp.GetResult().GetStdoutBytes(); got != 1<<30 {
		t.Errorf("stdout_bytes = %d, want 1 GiB (what arrived)", got)
	}
	if !resp.GetResult().GetStdoutTruncated() || !resp.GetResult().GetStderrTruncated() {
		t.Errorf("truncated = %v/%v, want true/true", resp.GetResult().GetStdoutTruncated(), resp.GetResult().GetStderrTruncated())
	}
}

// TestCollectorAllocates collects streams of various sizes in the agent's
// 32 KiB events: what a Collector allocates for them, Response included,
// is at most its caps plus collectorSlack, so the budget, which reserves
// the caps, counts what a Run's buffers cost (issue 21: buffers grown by
// doubling left as much again in garbage).
func TestCollectorAllocates(t *testing.T) {
	const collectorSlack = 256 << 10
	chunk := bytes.Repeat([]byte{'z'}, 32<<10)
	for _, tt := range []struct {
		name      string
		caps      [2]uint64
		out, errs int // bytes written to stdout and stderr
	}{
		{"full caps", [2]uint64{63 << 20, 1 << 20}, 63 << 20, 1 << 20},
		{"the defaults, half used", [2]uint64{2 << 20, 1 << 20}, 1 << 20, 512 << 10},
		{"beyond the caps", [2]uint64{8 << 20, 1 << 20}, 32 << 20, 4 << 20},
		{"small", [2]uint64{2 << 20, 1 << 20}, 64 << 10, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			c := runout.NewCollector(tt.caps[0], tt.caps[1])
			for _, s := range []struct {
				stream berthv1.Stream
				n      int
			}{{stdout, tt.out}, {stderr, tt.errs}} {
				ev := &berthv1.ExecOutput{Stream: s.stream, Data: chunk}
				for n := 0; n < s.n; n += len(chunk) {
					c.Output(ev)
				}
			}
			resp, err := c.Response("ex", &berthv1.ExecResult{})
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(resp.GetStdout()), min(tt.out, int(tt.caps[0])); got != want {
				t.Fatalf("stdout = %d bytes, want %d", got, want)
			}
			got := after.TotalAlloc - before.TotalAlloc
			if want := tt.caps[0] + tt.caps[1] + collectorSlack; got > want {
				t.Errorf("collecting %d + %d bytes with caps %d + %d allocated %d bytes, want at most the caps + %d (%d)",
					tt.out, tt.errs, tt.caps[0], tt.caps[1], got, collectorSlack, want)
			}
			t.Logf("%d + %d bytes collected with caps %d + %d: %d bytes allocated", tt.out, tt.errs, tt.caps[0], tt.caps[1], got)
		})
	}
}

func TestBudget(t *testing.T) {
	b := runout.NewBudget(100)
	r1, _, ok := b.Reserve(60)
	if !ok {
		t.Fatal("Reserve(60) of 100: not ok")
	}
	if _, used, ok := b.Reserve(50); ok || used != 60 {
		t.Errorf("Reserve(50) with 60 used = ok %v used %d, want refused with 60", ok, used)
	}
	r1()
	r1() // idempotent
	if got := b.Used(); got != 0 {
		t.Errorf("used after release = %d, want 0", got)
	}
	if _, _, ok := b.Reserve(100); !ok {
		t.Errorf("Reserve(100) of 100 free: refused")
	}
}

// TestBudgetNoWrap: a reservation whose sum with what is held wraps past
// 2^64 is refused, with or without a limit.
func TestBudgetNoWrap(t *testing.T) {
	for _, limit := range []uint64{0, 1 << 30} {
		b := runout.NewBudget(limit)
		if _, _, ok := b.Reserve(1 << 20); !ok {
			t.Fatalf("limit %d: Reserve(1 MiB) refused", limit)
		}
		if _, used, ok := b.Reserve(math.MaxUint64); ok || used != 1<<20 {
			t.Errorf("limit %d: Reserve(2^64-1) with 1 MiB held = ok %v used %d, want refused with 1 MiB", limit, ok, used)
		}
		if got := b.Used(); got != 1<<20 {
			t.Errorf("limit %d: used = %d, want 1 MiB", limit, got)
		}
	}
}
