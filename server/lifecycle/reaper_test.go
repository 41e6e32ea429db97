package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeAgents answers probes from a table and records stops; a stop blocks
// while block is not nil.
type fakeAgents struct {
	mu       sync.Mutex
	activity map[string]Activity
	errs     map[string]error
	probes   map[string]int
	stopped  map[string]Reason
	stopErr  error
	block    chan struct{}
	paused   map[string]int // pauses asked, by sandbox
	// beforePause, when set, runs as a Pause begins: a request that
	// arrives between the reaper's idle verdict and the pause.
	beforePause func()
	// pauseCalls counts the Pause calls that returned.
	pauseCalls int
}

func newFakeAgents() *fakeAgents {
	return &fakeAgents{activity: map[string]Activity{}, errs: map[string]error{}, probes: map[string]int{}, stopped: map[string]Reason{}, paused: map[string]int{}}
}

func (f *fakeAgents) Probe(_ context.Context, id string) (Activity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probes[id]++
	return f.activity[id], f.errs[id]
}

func (f *fakeAgents) Stop(ctx context.Context, id string, reason Reason) error {
	f.mu.Lock()
	block, err := f.block, f.stopErr
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped[id] = reason
	return nil
}

func (f *fakeAgents) Pause(_ context.Context, id string, stillIdle func() bool) (bool, error) {
	f.mu.Lock()
	before := f.beforePause
	f.mu.Unlock()
	if before != nil {
		before()
	}
	idle := stillIdle()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pauseCalls++
	if !idle {
		return false, nil
	}
	f.paused[id]++
	return true, nil
}

func (f *fakeAgents) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeAgents) stoppedReason(id string) (Reason, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.stopped[id]
	return r, ok
}

// runReaper runs a reaper checking every 5ms until the test ends.
func runReaper(t *testing.T, f *fakeAgents) *Reaper {
	t.Helper()
	r := NewReaper(ReaperConfig{Interval: 5 * time.Millisecond, ProbeTimeout: time.Second}, f, f, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of its context's end")
		}
	})
	return r
}

// waitSweeps waits until the reaper has finished n more rounds: each of them
// would have acted on what the test set up.
func waitSweeps(t *testing.T, r *Reaper, n int64) {
	t.Helper()
	want := r.sweeps.Load() + n
	waitFor(t, 5*time.Second, fmt.Sprintf("%d reaper rounds", n), func() bool { return r.sweeps.Load() >= want })
}

// waitFor polls cond every millisecond for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReaperIdle(t *testing.T) {
	f := newFakeAgents()
	f.block = make(chan struct{})
	r := runReaper(t, f)
	start := time.Now()
	r.Track("a", Limits{CreatedAt: start, IdleTimeout: 50 * time.Millisecond, MaxLifetime: time.Hour})

	// Expired and being removed: visible as stopping until the stop ends.
	waitFor(t, 2*time.Second, "sandbox a stopping", func() bool { return r.Stopping("a") == ReasonIdle })
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("stopped after %v, before its 50ms idle timeout", took)
	}
	st, ok := r.Status("a")
	if !ok || st.Stopping != ReasonIdle || st.IdleDeadline.After(time.Now()) {
		t.Errorf("Status while stopping = %+v, %v; want stopping for idle-timeout with a past deadline", st, ok)
	}
	close(f.block)
	waitFor(t, 2*time.Second, "sandbox a forgotten", func() bool { _, ok := r.Status("a"); return !ok })
	if reason, ok := f.stoppedReason("a"); !ok || reason != ReasonIdle {
		t.Errorf("stop reason = %v, %v; want idle-timeout", reason, ok)
	}
}

// TestReaperPauseOnIdle: a sandbox whose idle action is to pause is
// paused once at its idle timeout, never removed, and does not idle out
// while paused; a resume restarts its idle clock, and a paused sandbox
// still ends at its maximum lifetime.
func TestReaperPauseOnIdle(t *testing.T) {
	f := newFakeAgents()
	r := runReaper(t, f)
	start := time.Now()
	r.Track("p", Limits{CreatedAt: start, IdleTimeout: 30 * time.Millisecond, MaxLifetime: time.Hour, PauseOnIdle: true})
	waitFor(t, 2*time.Second, "sandbox p paused", func() bool { st, _ := r.Status("p"); return st.Paused })
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Errorf("paused after %v, before its 30ms idle timeout", took)
	}
	waitSweeps(t, r, 10)
	f.mu.Lock()
	pauses := f.paused["p"]
	f.mu.Unlock()
	if _, stopped := f.stoppedReason("p"); stopped || pauses != 1 {
		t.Errorf("after 10 rounds paused: stopped %v, pauses %d; want not stopped, one pause", stopped, pauses)
	}
	st, ok := r.Status("p")
	if !ok || st.Stopping != ReasonNone || !st.IdleDeadline.IsZero() {
		t.Errorf("Status of a paused sandbox = %+v, %v; want tracked, not stopping, no idle deadline", st, ok)
	}
	// A resume: idle again from now, and paused again at its timeout.
	resumed := time.Now()
	r.SetPaused("p", false)
	waitFor(t, 2*time.Second, "sandbox p paused again", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.paused["p"] == 2
	})
	if took := time.Since(resumed); took < 30*time.Millisecond {
		t.Errorf("paused again %v after the resume, before its 30ms idle timeout", took)
	}
	// The maximum lifetime ends a paused sandbox.
	r.Track("p", Limits{CreatedAt: start, IdleTimeout: 30 * time.Millisecond, MaxLifetime: time.Millisecond, PauseOnIdle: true})
	waitFor(t, 2*time.Second, "paused sandbox p removed at its lifetime", func() bool { r, ok := f.stoppedReason("p"); return ok && r == ReasonLifetime })
}

func TestReaperRunningExecKeepsAlive(t *testing.T) {
	f := newFakeAgents()
	f.activity["busy"] = Activity{Running: 1}
	r := runReaper(t, f)
	r.Track("busy", Limits{CreatedAt: time.Now(), IdleTimeout: 20 * time.Millisecond})
	waitFor(t, 2*time.Second, "several probes", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.probes["busy"] >= 3
	})
	if _, ok := f.stoppedReason("busy"); ok || r.Stopping("busy") != ReasonNone {
		t.Fatal("a sandbox with a running exec was stopped")
	}
	// The exec ends: idle from its end on.
	end := time.Now()
	f.set(func() { f.activity["busy"] = Activity{Last: end} })
	waitFor(t, 2*time.Second, "busy stopped once idle", func() bool { _, ok := f.stoppedReason("busy"); return ok })
	if took := time.Since(end); took < 20*time.Millisecond {
		t.Errorf("stopped %v after the exec ended, before the 20ms idle timeout", took)
	}
}

func TestReaperRequestsKeepAlive(t *testing.T) {
	f := newFakeAgents()
	r := runReaper(t, f)
	r.Track("req", Limits{CreatedAt: time.Now(), IdleTimeout: 20 * time.Millisecond})
	end := r.Begin("req")
	// Rounds well past the 20 ms idle timeout: each would have stopped it.
	waitFor(t, 2*time.Second, "the idle timeout passed", func() bool { st, _ := r.Status("req"); return time.Now().After(st.IdleDeadline) })
	waitSweeps(t, r, 5)
	if _, ok := f.stoppedReason("req"); ok {
		t.Fatal("stopped while a request was in progress")
	}
	f.mu.Lock()
	probes := f.probes["req"]
	f.mu.Unlock()
	if probes != 0 {
		t.Errorf("probed %d times while a request was in progress, want 0", probes)
	}
	end()
	end() // idempotent
	waitFor(t, 2*time.Second, "stopped after the request", func() bool { _, ok := f.stoppedReason("req"); return ok })
}

func TestReaperHold(t *testing.T) {
	f := newFakeAgents()
	r := runReaper(t, f)
	start := time.Now()
	r.Track("held", Limits{CreatedAt: start, IdleTimeout: 10 * time.Millisecond})
	r.Hold("held", start.Add(150*time.Millisecond))
	waitFor(t, 2*time.Second, "held stopped", func() bool { _, ok := f.stoppedReason("held"); return ok })
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("stopped after %v, before its 150ms hold ended", took)
	}
	if r.Hold("unknown", time.Now()) {
		t.Error("Hold of an untracked id reported true")
	}
}

func TestReaperLifetime(t *testing.T) {
	f := newFakeAgents()
	f.activity["old"] = Activity{Running: 3}
	r := runReaper(t, f)
	created := time.Now()
	r.Track("old", Limits{CreatedAt: created, IdleTimeout: time.Hour, MaxLifetime: 40 * time.Millisecond})
	end := r.Begin("old") // busy does not matter
	defer end()
	waitFor(t, 2*time.Second, "old stopped", func() bool { _, ok := f.stoppedReason("old"); return ok })
	if reason, _ := f.stoppedReason("old"); reason != ReasonLifetime || time.Since(created) < 40*time.Millisecond {
		t.Errorf("stopped for %v after %v, want max-lifetime after 40ms", reason, time.Since(created))
	}
}

func TestReaperProbeErrors(t *testing.T) {
	f := newFakeAgents()
	f.errs["mute"] = errors.New("agent does not answer")
	f.errs["dead"] = ErrNotRunning
	f.errs["gone"] = ErrGone
	r := runReaper(t, f)
	for _, id := range []string{"mute", "dead", "gone"} {
		r.Track(id, Limits{CreatedAt: time.Now(), IdleTimeout: 10 * time.Millisecond})
	}
	waitFor(t, 2*time.Second, "gone forgotten", func() bool { _, ok := r.Status("gone"); return !ok })
	waitFor(t, 2*time.Second, "dead stopped", func() bool { _, ok := f.stoppedReason("dead"); return ok })
	waitFor(t, 2*time.Second, "mute stopped", func() bool { _, ok := f.stoppedReason("mute"); return ok })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.probes["mute"] < 3 {
		t.Errorf("mute stopped after %d failed probes, want at least 3", f.probes["mute"])
	}
	if _, ok := f.stopped["gone"]; ok {
		t.Error("a sandbox that is gone was stopped")
	}
}

func TestReaperStopRetried(t *testing.T) {
	f := newFakeAgents()
	f.stopErr = errors.New("containerd busy")
	r := runReaper(t, f)
	r.Track("x", Limits{CreatedAt: time.Now(), IdleTimeout: 10 * time.Millisecond})
	waitFor(t, 2*time.Second, "x stopping", func() bool { return r.Stopping("x") == ReasonIdle })
	// Rounds that each tried the stop and failed.
	waitSweeps(t, r, 3)
	if _, ok := r.Status("x"); !ok {
		t.Fatal("forgotten although its stop failed")
	}
	f.set(func() { f.stopErr = nil })
	waitFor(t, 2*time.Second, "x stopped on retry", func() bool { _, ok := f.stoppedReason("x"); return ok })
}

// fakeMaker makes members "image-N"; it fails while fail is set.
type fakeMaker struct {
	mu       sync.Mutex
	n        int
	fail     bool
	failures int // calls that failed
	// gate, when set, holds MakeStandby until closed; discarded are the
	// ids Discard was given.
	gate      chan struct{}
	waiting   int
	discarded []string
	// busy makes MakeStandby refuse for room (a *apierr.FleetBusy);
	// refused lists the parents it refused, in order.
	busy    bool
	refused []string
	// discardFails is how many Discard calls fail before they succeed.
	discardFails int
}

func (m *fakeMaker) MakePooled(_ context.Context, image string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		m.failures++
		return "", errors.New("no image")
	}
	m.n++
	return fmt.Sprintf("%s-%d", image, m.n), nil
}

func (m *fakeMaker) MakeStandby(ctx context.Context, parent string) (string, error) {
	m.mu.Lock()
	gate, busy := m.gate, m.busy
	if gate != nil {
		m.waiting++
	}
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if busy {
		m.mu.Lock()
		m.failures++
		m.refused = append(m.refused, parent)
		m.mu.Unlock()
		return "", &apierr.FleetBusy{SandboxID: "standby-of-" + parent, Principal: "alice"}
	}
	return m.MakePooled(ctx, "standby-of-"+parent)
}

func (m *fakeMaker) Discard(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.discardFails > 0 {
		m.discardFails--
		return errors.New("containerd: unavailable")
	}
	m.discarded = append(m.discarded, id)
	return nil
}

func (m *fakeMaker) discards() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.discarded)
}

func TestPoolStandby(t *testing.T) {
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Sizes: map[string]int{"img": 1}, Standby: 1, StandbyIdle: time.Hour, RetryDelay: 20 * time.Millisecond}, m, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, 2*time.Second, "image pool filled", func() bool { return p.Ready("img") == 1 })
	if id, ok := p.TakeStandby("sb-a"); ok {
		t.Fatalf("TakeStandby before any fork = %q; want none", id)
	}
	p.Want("sb-a", 1)
	waitFor(t, 2*time.Second, "standby member made", func() bool { return len(p.Members()) == 2 })
	id, ok := p.TakeStandby("sb-a")
	if !ok || !strings.HasPrefix(id, "standby-of-sb-a-") {
		t.Fatalf("TakeStandby(sb-a) = %q, %v; want a member made for sb-a", id, ok)
	}
	if _, ok := p.TakeStandby("sb-b"); ok {
		t.Error("TakeStandby of a parent that never forked succeeded")
	}
	if _, ok := p.Take("img"); !ok {
		t.Error("the image's member went with the standby one")
	}
	p.StandbyUsed("sb-a") // the fork made its child of it
	waitFor(t, 2*time.Second, "both refilled", func() bool { return len(p.Members()) == 2 })
	if p.ReturnStandby("sb-a", id) {
		t.Error("ReturnStandby past the size of 1 was accepted")
	}
	again := p.Forget("sb-a")
	if len(again) != 1 || !strings.HasPrefix(again[0], "standby-of-sb-a-") {
		t.Errorf("Forget(sb-a) = %q; want its one ready member", again)
	}
	if p.ReturnStandby("sb-a", id) {
		t.Error("ReturnStandby after Forget was accepted")
	}

	// A member made while its parent is forgotten is discarded.
	gate := make(chan struct{})
	m.mu.Lock()
	m.gate = gate
	m.mu.Unlock()
	p.Want("sb-c", 1)
	waitFor(t, 2*time.Second, "a make under way", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.waiting == 1 })
	p.Forget("sb-c")
	close(gate)
	waitFor(t, 2*time.Second, "the late member discarded", func() bool {
		d := m.discards()
		return len(d) == 1 && strings.HasPrefix(d[0], "standby-of-sb-c-")
	})
	if _, ok := p.TakeStandby("sb-c"); ok {
		t.Error("a forgotten parent's late member was kept")
	}
}

// TestPoolStandbyLent: a standby member handed out by TakeStandby still
// fills its parent's place until the fork returns it (ReturnStandby) or
// used it (StandbyUsed): a fork that fails before reaching the member —
// a caller who may not see the parent, or at its cap — makes no member
// and discards none, however often it is repeated.
func TestPoolStandbyLent(t *testing.T) {
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Standby: 1, StandbyIdle: time.Hour, RetryDelay: 20 * time.Millisecond}, m, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	p.Want("sb-a", 1)
	waitFor(t, 2*time.Second, "standby member made", func() bool { return p.Ready(standbyKey("sb-a")) == 1 })
	cancel()
	<-done

	for range 3 {
		id, ok := p.TakeStandby("sb-a")
		if !ok {
			t.Fatal("TakeStandby(sb-a) found no member")
		}
		if key, _ := p.next(); key != "" {
			t.Fatalf("next with sb-a's member handed out = %q, want nothing: the member still fills its place", key)
		}
		if !p.ReturnStandby("sb-a", id) {
			t.Fatalf("ReturnStandby(sb-a, %s) of the member handed out was refused", id)
		}
	}
	if d := m.discards(); len(d) != 0 {
		t.Errorf("discarded %q after forks that returned the member, want none", d)
	}
	if _, ok := p.TakeStandby("sb-a"); !ok {
		t.Fatal("TakeStandby(sb-a) found no member")
	}
	p.StandbyUsed("sb-a")
	if key, _ := p.next(); key != standbyKey("sb-a") {
		t.Errorf("next after sb-a's member was used = %q, want sb-a's key", key)
	}
	p.StandbyUsed("sb-a") // once too often: no member is owed
	if key, _ := p.next(); key != standbyKey("sb-a") {
		t.Errorf("next after a second StandbyUsed = %q, want sb-a's key", key)
	}
}

func TestPoolStandbyIdle(t *testing.T) {
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Standby: 2, StandbyIdle: 50 * time.Millisecond}, m, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	p.Want("sb-a", 2)
	// Idle past its time: both members made for it are discarded, and
	// none is made again.
	waitFor(t, 2*time.Second, "idle members discarded", func() bool { return len(m.discards()) == 2 })
	if got := p.Members(); len(got) != 0 {
		t.Errorf("Members after the idle time = %q; want none", got)
	}
	disabled := NewPool(PoolConfig{}, m, discard)
	disabled.Want("sb-a", 1)
	if got, _ := disabled.next(); got != "" {
		t.Errorf("next of a pool without standby members after Want = %q; want nothing", got)
	}
}

// TestPoolStandbyCount: a parent gets as many members as its largest
// fork asked for since it was last forgotten, at most PoolConfig.Standby;
// a member given back past that count is refused.
func TestPoolStandbyCount(t *testing.T) {
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Standby: 3, StandbyIdle: time.Hour}, m, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	p.Want("sb-a", 1)
	waitFor(t, 2*time.Second, "one member", func() bool { return p.Ready(standbyKey("sb-a")) == 1 })
	p.Want("sb-a", 10)
	waitFor(t, 2*time.Second, "three members (the cap)", func() bool { return p.Ready(standbyKey("sb-a")) == 3 })
	p.Want("sb-a", 1) // a smaller fork keeps the larger count
	var taken []string
	for range 3 {
		id, ok := p.TakeStandby("sb-a")
		if !ok {
			t.Fatalf("TakeStandby after %d of 3 members: none", len(taken))
		}
		taken = append(taken, id)
	}
	for range taken {
		p.StandbyUsed("sb-a")
	}
	waitFor(t, 2*time.Second, "three members again", func() bool { return p.Ready(standbyKey("sb-a")) == 3 })
	if p.ReturnStandby("sb-a", taken[0]) {
		t.Error("ReturnStandby past the wanted 3 was accepted")
	}
	if got := p.Ready(standbyKey("sb-a")); got != 3 {
		t.Errorf("ready members of sb-a = %d, want 3", got)
	}
}

// TestPoolStandbyYield: a standby member gives way to a sandbox refused
// for room (YieldStandby) — a ready one of a parent the caller names, or
// one being made, whose making is canceled — and its parent gets none
// again until a sandbox is deleted (Freed); a member refused for room is
// not retried on a timer either.
func TestPoolStandbyYield(t *testing.T) {
	ctx := context.Background()
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Standby: 1, StandbyIdle: time.Hour, RetryDelay: 10 * time.Millisecond}, m, discard)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { p.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	p.Want("sb-a", 1)
	p.Want("sb-b", 1)
	waitFor(t, 2*time.Second, "both members made", func() bool {
		return p.Ready(standbyKey("sb-a")) == 1 && p.Ready(standbyKey("sb-b")) == 1
	})
	onlyA := func(parent string) bool { return parent == "sb-a" }
	id, ok := p.YieldStandby(ctx, onlyA)
	if !ok || !strings.HasPrefix(id, "standby-of-sb-a-") {
		t.Fatalf("YieldStandby(sb-a) = %q, %v; want sb-a's member", id, ok)
	}
	if id, ok := p.YieldStandby(ctx, onlyA); ok {
		t.Fatalf("second YieldStandby(sb-a) = %q; want none: sb-a had one member", id)
	}
	if key, _ := p.next(); key != "" {
		t.Fatalf("next after sb-a's member gave way = %q, want nothing until a sandbox is deleted", key)
	}
	if p.Ready(standbyKey("sb-b")) != 1 {
		t.Error("sb-b's member went with sb-a's")
	}
	p.Freed()
	waitFor(t, 2*time.Second, "sb-a's member made again after a delete", func() bool { return p.Ready(standbyKey("sb-a")) == 1 })

	// One being made gives way: its making is canceled, and YieldStandby
	// reports true with no id.
	gate := make(chan struct{})
	m.mu.Lock()
	m.gate = gate
	m.mu.Unlock()
	p.Want("sb-c", 1)
	waitFor(t, 2*time.Second, "sb-c's member being made", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.waiting == 1 })
	if id, ok := p.YieldStandby(ctx, func(parent string) bool { return parent == "sb-c" }); !ok || id != "" {
		t.Fatalf("YieldStandby(sb-c) while it is made = %q, %v; want \"\", true", id, ok)
	}
	if key, _ := p.next(); key != "" {
		t.Fatalf("next after sb-c's making gave way = %q, want nothing", key)
	}
	if _, ok := p.TakeStandby("sb-c"); ok {
		t.Error("the canceled member of sb-c was kept")
	}

	// Refused for room: not retried after RetryDelay, only after Freed.
	m.mu.Lock()
	m.gate, m.busy = nil, true
	m.mu.Unlock()
	p.Want("sb-d", 1)
	waitFor(t, 2*time.Second, "sb-d's member refused", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.failures == 1 })
	if key, _ := p.next(); key != "" {
		t.Errorf("next after sb-d's member was refused for room = %q, want nothing (no retry on a timer)", key)
	}
	m.mu.Lock()
	m.busy = false
	m.mu.Unlock()
	p.Freed()
	waitFor(t, 2*time.Second, "sb-c's and sb-d's members made after a delete", func() bool {
		return p.Ready(standbyKey("sb-c")) == 1 && p.Ready(standbyKey("sb-d")) == 1
	})
}

// TestPoolRemoveRetried: a member whose removal failed (a standby
// member that gave way, say) is not left behind: out of the pool it would
// hold its parent's owner's room, unlisted, until berthd restarts. Run
// removes it again every RetryDelay until the removal succeeds.
func TestPoolRemoveRetried(t *testing.T) {
	ctx := context.Background()
	m := &fakeMaker{}
	p := runStandbyPool(t, m)
	p.Want("sb-a", 1)
	waitFor(t, 2*time.Second, "sb-a's member made", func() bool { return p.Ready(standbyKey("sb-a")) == 1 })
	id, ok := p.YieldStandby(ctx, func(string) bool { return true })
	if !ok || id == "" {
		t.Fatalf("YieldStandby = %q, %v; want sb-a's member", id, ok)
	}
	m.mu.Lock()
	m.discardFails = 2
	m.mu.Unlock()
	p.Remove(ctx, id)
	if got := p.Orphans(); !slices.Equal(got, []string{id}) {
		t.Errorf("Orphans after a failed removal = %q, want [%s]", got, id)
	}
	waitFor(t, 2*time.Second, "the member removed on a later try", func() bool { return slices.Equal(m.discards(), []string{id}) })
	if got := p.Orphans(); len(got) != 0 {
		t.Errorf("Orphans after the removal succeeded = %q, want none", got)
	}
	m.mu.Lock()
	left := m.discardFails
	m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d failing removals left untried, want 0", left)
	}
}

// runStandbyPool runs a pool of one standby member per parent made by
// m until the test ends.
func runStandbyPool(t *testing.T, m *fakeMaker) *Pool {
	p := NewPool(PoolConfig{Standby: 1, StandbyIdle: time.Hour, RetryDelay: 10 * time.Millisecond}, m, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// TestPoolStandbyRetryBounded: a delete (Freed) retries one parent
// whose member was refused for room, the one refused longest ago, not
// every such parent: each retry is an admission (a containerd listing
// under the admission lock every create waits for), and a tenant with
// many forked parents at its cap must not make every delete cost that
// many. A retry that makes its member lets the next parent's be tried.
func TestPoolStandbyRetryBounded(t *testing.T) {
	ctx := context.Background()
	m := &fakeMaker{busy: true}
	p := NewPool(PoolConfig{Standby: 1, StandbyIdle: time.Hour, RetryDelay: 10 * time.Millisecond}, m, discard)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { p.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	parents := []string{"sb-a", "sb-b", "sb-c", "sb-d"}
	for _, parent := range parents {
		p.Want(parent, 1)
	}
	refused := func() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.refused) }
	// Settled: every refusal recorded and nothing wanted that may be tried.
	settled := func(n int) func() bool {
		return func() bool {
			key, _ := p.next()
			return key == "" && refused() >= n
		}
	}
	waitFor(t, 2*time.Second, "each parent's member refused once", settled(len(parents)))
	retried := map[string]bool{}
	for i := range parents {
		p.Freed()
		waitFor(t, 2*time.Second, "a retry after a delete", settled(len(parents)+i+1))
		m.mu.Lock()
		n, last := len(m.refused), m.refused[len(m.refused)-1]
		m.mu.Unlock()
		if n != len(parents)+i+1 {
			t.Fatalf("delete %d: %d refusals in all, want %d (one retry per delete)", i+1, n, len(parents)+i+1)
		}
		retried[last] = true
	}
	if len(retried) != len(parents) {
		t.Errorf("four deletes retried %v, want each parent once (the one refused longest ago first)", retried)
	}
	// Room again: one delete lets every member be made, one after another.
	m.mu.Lock()
	m.busy = false
	m.mu.Unlock()
	p.Freed()
	waitFor(t, 2*time.Second, "every member made after a delete with room", func() bool {
		for _, parent := range parents {
			if p.Ready(standbyKey(parent)) != 1 {
				return false
			}
		}
		return true
	})
}

func TestPool(t *testing.T) {
	m := &fakeMaker{}
	p := NewPool(PoolConfig{Sizes: map[string]int{"img": 2}, RetryDelay: 20 * time.Millisecond}, m, discard)
	if !p.Adopt("img", "img-old") || p.Adopt("other", "x") {
		t.Fatal("Adopt: want room for img, none for an image without a pool")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, 2*time.Second, "pool filled", func() bool { return p.Ready("img") == 2 })
	if id, ok := p.Take("img"); !ok || id != "img-old" {
		t.Errorf("Take = %q, %v; want the oldest member img-old", id, ok)
	}
	if _, ok := p.Take("other"); ok {
		t.Error("Take from an image without a pool succeeded")
	}
	waitFor(t, 2*time.Second, "pool refilled", func() bool { return p.Ready("img") == 2 })

	m.mu.Lock()
	m.fail = true
	m.mu.Unlock()
	p.Take("img")
	// Two failed refills (RetryDelay apart): neither may count as ready.
	waitFor(t, 2*time.Second, "two failed creations", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.failures >= 2 })
	if p.Ready("img") != 1 {
		t.Fatalf("ready = %d while creation fails, want 1", p.Ready("img"))
	}
	m.mu.Lock()
	m.fail = false
	m.mu.Unlock()
	waitFor(t, 2*time.Second, "pool refilled after failures", func() bool { return p.Ready("img") == 2 })
}

// TestReaperRequestBetweenVerdictAndRemoval starts a request after the
// sandbox was found idle and marked stopping, before its removal began:
// the sandbox is in use again, so it is not removed and no longer
// stopping. A maximum lifetime, a hard stop, is not lifted that way.
func TestReaperRequestBetweenVerdictAndRemoval(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
		reason Reason
		kept   bool
	}{
		{"idle", Limits{CreatedAt: time.Now(), IdleTimeout: time.Millisecond, MaxLifetime: time.Hour}, ReasonIdle, true},
		{"lifetime", Limits{CreatedAt: time.Now().Add(-time.Hour), IdleTimeout: time.Hour, MaxLifetime: time.Minute}, ReasonLifetime, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAgents()
			r := NewReaper(ReaperConfig{}, f, f, discard)
			now := time.Now()
			r.now = func() time.Time { return now }
			r.Track("sb", tc.limits)
			now = now.Add(time.Second) // idle for a second, past its timeout
			// The verdict: what sweep does before its removals.
			r.mu.Lock()
			e := r.sandboxes["sb"]
			if tc.reason == ReasonLifetime {
				r.expire("sb", e, ReasonLifetime, now)
			}
			r.mu.Unlock()
			if tc.reason == ReasonIdle {
				r.settle(context.Background(), "sb", Activity{}, nil)
			}
			if got := r.Stopping("sb"); got != tc.reason {
				t.Fatalf("after the verdict Stopping = %v, want %v", got, tc.reason)
			}
			// A request arrives; then the removal step runs.
			end := r.Begin("sb")
			defer end()
			r.remove(context.Background(), "sb")
			_, stopped := f.stoppedReason("sb")
			if stopped == tc.kept {
				t.Errorf("removed = %v with a request in progress since the verdict, want %v", stopped, !tc.kept)
			}
			if st, ok := r.Status("sb"); tc.kept && (!ok || st.Stopping != ReasonNone) {
				t.Errorf("Status = %+v, %v after the request kept it; want tracked and not stopping", st, ok)
			}
		})
	}
}

// TestReaperPauseRechecksIdle: a request that begins after the reaper
// found a sandbox idle and before its pause keeps it running: the pause
// asks again (stillIdle) where the request cannot slip past, so no
// request finds its agent frozen under it.
func TestReaperPauseRechecksIdle(t *testing.T) {
	f := newFakeAgents()
	r := runReaper(t, f)
	var end func()
	f.set(func() {
		f.beforePause = func() {
			e := r.Begin("p")
			f.set(func() { end = e })
		}
	})
	r.Track("p", Limits{CreatedAt: time.Now(), IdleTimeout: 30 * time.Millisecond, MaxLifetime: time.Hour, PauseOnIdle: true})
	waitFor(t, 2*time.Second, "the reaper's pause of p asked and answered", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return end != nil && f.pauseCalls > 0
	})
	f.set(func() { f.beforePause = nil })
	var pauses int
	f.set(func() { pauses = f.paused["p"] })
	if st, _ := r.Status("p"); st.Paused || pauses != 0 {
		t.Errorf("a request began before the pause: paused %v, %d pauses; want kept running", st.Paused, pauses)
	}
	f.set(func() { end() })
}
