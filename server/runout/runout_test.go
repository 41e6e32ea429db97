package runout_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

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
				c.Output(context.Background(), e)
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
		c.Output(context.Background(), &berthv1.ExecOutput{Stream: stdout, Data: chunk})
		c.Output(context.Background(), &berthv1.ExecOutput{Stream: stderr, Data: chunk})
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
					c.Output(context.Background(), ev)
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
	b := runout.NewBudget(100, 0, 0)
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
		b := runout.NewBudget(limit, 0, 0)
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

// TestSlabAdmission: a Run is admitted holding its first slabs, not its
// caps (issue 23): 1,000 Runs with the default caps (2 MiB + 1 MiB) fit a
// 1 GiB budget at once, where reserving the caps admitted 341.
func TestSlabAdmission(t *testing.T) {
	b := runout.NewBudget(1<<30, 0, 0)
	slabs := runout.Slabs(2<<20, 1<<20)
	if slabs != 128<<10 {
		t.Errorf("Slabs(2 MiB, 1 MiB) = %d, want 128 KiB", slabs)
	}
	if got := runout.Slabs(100, 10); got != 110 {
		t.Errorf("Slabs(100, 10) = %d, want the caps 110", got)
	}
	for i := range 1000 {
		l, used, ok := b.Lease(slabs)
		if !ok {
			t.Fatalf("Run %d refused with %d bytes held, want 1,000 admitted", i+1, used)
		}
		defer l.Release()
	}
	if got := b.Used(); got != 1000*slabs {
		t.Errorf("used = %d, want %d", got, 1000*slabs)
	}
}

// TestCollectorGrowsLease: a collector's buffer past its first slab grows
// its lease to what the buffer holds, here at once to the cap, and no
// more; the lease gives it all back.
func TestCollectorGrowsLease(t *testing.T) {
	b := runout.NewBudget(4<<20, 0, 0)
	l, _, ok := b.Lease(runout.Slabs(1<<20, 1<<10))
	if !ok {
		t.Fatal("lease refused")
	}
	c := runout.NewCollector(1<<20, 1<<10)
	c.HoldIn(l)
	ctx := context.Background()
	for range 16 {
		if err := c.Write(ctx, stdout, make([]byte, 4<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Held(); got != 64<<10+1<<10 {
		t.Errorf("held after 64 KiB of stdout = %d, want the first slabs %d", got, 64<<10+1<<10)
	}
	if err := c.Write(ctx, stdout, make([]byte, 2<<20)); err != nil {
		t.Fatal(err)
	}
	if got := l.Held(); got != 1<<20+1<<10 {
		t.Errorf("held after 2 MiB more = %d, want the caps %d", got, 1<<20+1<<10)
	}
	l.Release()
	if got := b.Used(); got != 0 {
		t.Errorf("used after release = %d, want 0", got)
	}
}

// TestCollectorBackpressure: a Write whose buffer needs budget others hold
// waits until they give it back, then keeps every byte.
func TestCollectorBackpressure(t *testing.T) {
	b := runout.NewBudget(1<<20+128<<10, time.Minute, 0)
	other, _, _ := b.Lease(1 << 20)
	l, _, ok := b.Lease(runout.Slabs(1<<20, 0))
	if !ok {
		t.Fatal("lease refused")
	}
	c := runout.NewCollector(1<<20, 0)
	c.HoldIn(l)
	done := make(chan error, 1)
	go func() { done <- c.Write(context.Background(), stdout, bytes.Repeat([]byte("x"), 100<<10)) }()
	waitingFor(t, b, done, "Write past the first slab with the budget held elsewhere")
	other.Release()
	ended(t, done, "Write after the budget was given back")
	resp, err := c.Response("r", &berthv1.ExecResult{StdoutBytes: 100 << 10})
	if err != nil || len(resp.GetStdout()) != 100<<10 {
		t.Fatalf("Response = %d bytes, %v; want all 100 KiB", len(resp.GetStdout()), err)
	}
}

// TestLeaseAllWaiting: when every lease holding budget waits for more,
// none can give any back: the last to wait fails at once, typed, and its
// release lets the other on.
func TestLeaseAllWaiting(t *testing.T) {
	b := runout.NewBudget(100, time.Minute, 0)
	l1, _, _ := b.Lease(50)
	l2, _, _ := b.Lease(50)
	done := make(chan error, 1)
	go func() { done <- l1.Grow(context.Background(), 20) }()
	waitingFor(t, b, done, "l1.Grow past the budget")
	start := time.Now()
	err := l2.Grow(context.Background(), 20)
	var ex *runout.ExhaustedError
	if !errors.As(err, &ex) || !ex.AllWaiting {
		t.Fatalf("l2.Grow with l1 holding and waiting = %v, want an all-waiting ExhaustedError", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("all-waiting refusal took %v, want at once", waited)
	}
	if !errors.Is(err, runout.ErrBudgetExhausted) || ex.Limit != 100 || ex.Used != 100 || ex.Held != 50 || ex.Requested != 20 {
		t.Errorf("error = %+v, want ErrBudgetExhausted with limit 100, used 100, held 50, requested 20", ex)
	}
	l2.Release()
	ended(t, done, "l1.Grow after l2 released")
	if got := b.Used(); got != 70 {
		t.Errorf("used = %d, want 70", got)
	}
}

// TestLeaseWindow: a lease's first Grow charges it the Budget's window
// besides, whether or not that fits (its Run's output its transport may
// hold), until its release; others cannot take those bytes.
func TestLeaseWindow(t *testing.T) {
	b := runout.NewBudget(100, time.Minute, 30)
	held, _, _ := b.Lease(60)
	l, _, _ := b.Lease(10)
	done := make(chan error, 1)
	go func() { done <- l.Grow(context.Background(), 40) }()
	waitingFor(t, b, done, "Grow past the budget")
	if got := b.Used(); got != 100 {
		t.Errorf("used while a lease waits = %d, want 100 (60 + 10 + a window of 30)", got)
	}
	if _, used, ok := b.Lease(10); ok || used != 100 {
		t.Errorf("Lease(10) with 70 held and a window of 30 = ok %v used %d, want refused with 100", ok, used)
	}
	held.Release()
	ended(t, done, "Grow after the budget was given back")
	if got := b.Used(); got != 80 {
		t.Errorf("used after the grow = %d, want 80 (10 + 40 + the window's 30)", got)
	}
	if err := l.Grow(context.Background(), 10); err != nil {
		t.Fatalf("second Grow(10) with 20 free: %v", err)
	}
	if got := b.Used(); got != 90 {
		t.Errorf("used after a second grow = %d, want 90 (the window charged once)", got)
	}
	l.Release()
	if got := b.Used(); got != 0 {
		t.Errorf("used after release = %d, want 0", got)
	}
}

// TestLeaseWaitBounded: a lease that does not get its slab within the
// budget's wait, or before its caller's context ends, fails typed.
func TestLeaseWaitBounded(t *testing.T) {
	b := runout.NewBudget(100, 100*time.Millisecond, 0)
	idle, _, _ := b.Lease(90) // holds, never waits, never releases in time
	defer idle.Release()
	l, _, _ := b.Lease(10)
	start := time.Now()
	err := l.Grow(context.Background(), 20)
	var ex *runout.ExhaustedError
	if !errors.As(err, &ex) || ex.AllWaiting || ex.Err != nil {
		t.Fatalf("Grow = %v, want an ExhaustedError after the wait", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond || ex.Waited < 100*time.Millisecond {
		t.Errorf("failed after %v (error says %v), want after the 100 ms wait", waited, ex.Waited)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Grow(ctx, 20); !errors.Is(err, context.Canceled) || !errors.Is(err, runout.ErrBudgetExhausted) {
		t.Errorf("Grow with a canceled context = %v, want context.Canceled and ErrBudgetExhausted", err)
	}
	if got := b.Used(); got != 100 {
		t.Errorf("used = %d, want 100 (nothing taken by the failed grows)", got)
	}
}

// TestCollectorReleaseAfterFree: a grown buffer's budget stays counted
// after its Run ended until the garbage collector freed it (the response
// is sent from it, and until a collection it is in the heap all the same),
// and a lease waiting for budget gets it once it is freed: the Budget runs
// the collection. The first slabs come back at once.
func TestCollectorReleaseAfterFree(t *testing.T) {
	b := runout.NewBudget(2<<20+64<<10, time.Minute, 0)
	func() {
		l, _, _ := b.Lease(runout.Slabs(2<<20, 1<<10))
		c := runout.NewCollector(2<<20, 1<<10)
		c.HoldIn(l)
		if err := c.Write(context.Background(), stdout, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}()
	if got := b.Used(); got != 2<<20 {
		t.Errorf("used right after the Run = %d, want its grown 2 MiB buffer still counted (the stderr slab back)", got)
	}
	l2, _, ok := b.Lease(64 << 10)
	if !ok {
		t.Fatal("a first slab refused with the budget's rest free")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l2.Grow(ctx, 1<<20); err != nil {
		t.Fatalf("Grow waiting for the freed buffer's budget: %v", err)
	}
	l2.Release()
	if got := b.Used(); got != 0 {
		t.Errorf("used at the end = %d, want 0", got)
	}
}

// TestLeaseWaitsForFreedBuffers: a Run admitted while an ended Run's grown
// buffer is still counted (not freed yet) is not refused: admission runs
// the collection and takes the bytes it frees.
func TestLeaseWaitsForFreedBuffers(t *testing.T) {
	b := runout.NewBudget(2<<20, time.Minute, 0)
	func() {
		l, _, _ := b.Lease(runout.Slabs(2<<20, 0))
		c := runout.NewCollector(2<<20, 0)
		c.HoldIn(l)
		if err := c.Write(context.Background(), stdout, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}()
	if _, used, ok := b.Lease(64 << 10); !ok {
		t.Fatalf("a first slab refused with %d bytes used, all by an ended Run's buffer", used)
	}
	if _, _, ok := b.Lease(4 << 20); ok {
		t.Error("4 MiB admitted into 2 MiB")
	}
}

// waitingFor waits until one lease of b waits for budget, failing if done
// (the waiter's end) comes first or 10 s pass.
func waitingFor(t *testing.T, b *runout.Budget, done <-chan error, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.Waiting() != 1; time.Sleep(time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("%s returned %v, want it to wait for budget", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not waiting for budget after 10 s", what)
		}
	}
}

// ended waits up to 10 s for done and fails unless it is nil.
func ended(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waiting after 10 s", what)
	}
}
