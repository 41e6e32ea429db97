package agentreach

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestAgentError: transport failures of an agent call are Unreachable
// (the request may have taken effect), the agent's own verdicts pass
// unchanged, and context ends stay context ends.
func TestAgentError(t *testing.T) {
	verdict := rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid, "cwd /x: no such directory", nil)
	if got := AgentError("sb", verdict); got != verdict {
		t.Errorf("AgentError(agent verdict) = %v, want it unchanged", got)
	}
	var u *apierr.Unreachable
	err := AgentError("sb", status.Error(codes.Unavailable, "connection reset"))
	if !errors.As(err, &u) {
		t.Fatalf("AgentError(UNAVAILABLE) = %v, want *apierr.Unreachable", err)
	}
	for _, w := range []string{"sandbox sb", "connection reset", "the request reached the agent, whether it took effect is unknown"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q lacks %q", err, w)
		}
	}
	if got := AgentError("sb", status.Error(codes.Canceled, "x")); !errors.Is(got, context.Canceled) {
		t.Errorf("AgentError(CANCELED) = %v, want context.Canceled", got)
	}
	if got := AgentError("sb", status.Error(codes.Internal, "raw")); rpcstatus.Reason(got) != "" || !strings.Contains(got.Error(), "agent of sandbox sb") {
		t.Errorf("AgentError(INTERNAL without reason) = %v, want it wrapped for the boundary to treat as internal", got)
	}
}

// fakeProbe serves a Watch scripted readings: each check takes the next.
type fakeProbe struct {
	readings []reading
	at       int // the reading served; 0 at newWatch
	full     int // full samples read (progress, states)
}

type reading struct {
	stopped   bool
	agentCPU  time.Duration
	cgroupCPU time.Duration
	frames    uint64
	states    string // of the agent's and its launchers' threads
	unread    int
	gone      bool // berthd holds no connection to the agent
}

func (f *fakeProbe) r() reading          { return f.readings[f.at] }
func (f *fakeProbe) stopped() bool       { return f.r().stopped }
func (f *fakeProbe) states() []byte      { f.full++; return []byte(f.r().states) }
func (f *fakeProbe) unread() (int, bool) { return f.r().unread, !f.r().gone }
func (f *fakeProbe) progress() progress  { f.full++; return f.baseline() }

// baseline serves every counter: agentProbe's serves those of a full
// sample when one was read within sampleTTL.
func (f *fakeProbe) baseline() progress {
	r := f.r()
	return progress{agentCPU: r.agentCPU, cgroupCPU: r.cgroupCPU, frames: r.frames}
}

// TestWatchBusy: the busy-or-unreachable decision over scripted readings
// of the agent, its launchers, its cgroup and its connection, one per
// connect budget. A sandbox that makes any progress — CPU time in its
// cgroup, a thread running, runnable or in D state, frames sent — is busy;
// bytes found unread once, by an agent idle because a loaded berthd sent
// it nothing until just then, are no neglect (the flake of
// TestBusyAgentIsNotUnreachable, issue 21): only bytes that lay unread
// from one check to the next with no work between are.
func TestWatchBusy(t *testing.T) {
	const budget, limit = 150 * time.Millisecond, time.Second
	idle := reading{agentCPU: time.Second, cgroupCPU: 2 * time.Second, states: "SSSS"}
	with := func(r reading, change func(*reading)) reading { change(&r); return r }
	for _, tc := range []struct {
		name     string
		readings []reading // [0] when the wait begins, then one per check
		want     []bool    // Busy at each check
		cause    berthv1.UnreachableCause
		says     string
	}{
		{"idle agent leaves bytes unread for a budget", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100 })},
			[]bool{false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, "did no work meanwhile"},
		{"bytes written just before a check to an idle agent", []reading{idle, with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 200 })},
			[]bool{true, false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, "did no work meanwhile"},
		{"nothing unread: berthd has not sent yet", []reading{idle, idle, idle},
			[]bool{true, true}, 0, ""},
		{"only the cgroup's processes used CPU", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100; r.cgroupCPU += time.Millisecond }),
			with(idle, func(r *reading) { r.unread = 100; r.cgroupCPU += time.Millisecond })},
			[]bool{true, false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_BUSY, "kept working"},
		{"an agent thread waits in D state", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100; r.states = "SSDS" })},
			[]bool{true}, 0, ""},
		{"an agent thread waits for a CPU", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100; r.states = "SRSS" })},
			[]bool{true}, 0, ""},
		{"the agent used CPU", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100; r.agentCPU++ })},
			[]bool{true}, 0, ""},
		{"the agent sent frames", []reading{with(idle, func(r *reading) { r.unread = 100 }), with(idle, func(r *reading) { r.unread = 100; r.frames++ })},
			[]bool{true}, 0, ""},
		{"a counter that could not be read is no progress", []reading{with(idle, func(r *reading) { r.unread = 100; r.cgroupCPU = -1 }), with(idle, func(r *reading) { r.unread = 100 })},
			[]bool{false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, "did no work meanwhile"},
		{"stopped agent", []reading{idle, with(idle, func(r *reading) { r.stopped = true; r.states = "TTTT"; r.cgroupCPU++ })},
			[]bool{false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, "its process is stopped"},
		{"connection gone", []reading{idle, with(idle, func(r *reading) { r.gone = true })},
			[]bool{false}, berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, "did no work meanwhile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakeProbe{readings: tc.readings}
			began := time.Unix(1000, 0)
			w := newWatch(p, budget, limit, began)
			for i, want := range tc.want {
				p.at = i + 1
				if got := w.check(began.Add(time.Duration(i+1) * budget)); got != want {
					t.Fatalf("check %d: Busy = %v, want %v", i+1, got, want)
				}
			}
			if tc.says == "" {
				return
			}
			if cause, what := w.Verdict("did not answer"); cause != tc.cause || !strings.Contains(what, tc.says) {
				t.Errorf("Verdict = %v %q, want %v saying %q", cause, what, tc.cause, tc.says)
			}
		})
	}
	// A sandbox that works is waited for up to the limit, then AGENT_BUSY.
	working := []reading{idle}
	for i := 1; i <= 8; i++ {
		working = append(working, with(idle, func(r *reading) { r.unread = 100; r.cgroupCPU += time.Duration(i) }))
	}
	p := &fakeProbe{readings: working}
	began := time.Unix(1000, 0)
	w := newWatch(p, budget, limit, began)
	for i := 1; i < len(working); i++ {
		p.at = i
		now := began.Add(time.Duration(i) * budget)
		if got, want := w.check(now), now.Sub(began) < limit; got != want {
			t.Fatalf("check at %v of a working sandbox: Busy = %v, want %v (limit %v)", now.Sub(began), got, want, limit)
		}
	}
	if cause, _ := w.Verdict("did not answer"); cause != berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_BUSY {
		t.Errorf("Verdict past the limit = %v, want AGENT_BUSY", cause)
	}
}

// TestWatchCheckReadsCheapFirst: a check of a sandbox whose cgroup used CPU
// or whose agent sent frames since the last check finds it busy from
// those counters alone and reads no full sample (every thread's state,
// the launchers' CPU: some hundred /proc files); one that did neither
// reads it. Reading it at every check cost berthd 1.6 ms of CPU an exec
// when hundreds of concurrent Runs waited past the connect budget on a
// loaded host (issue 23).
func TestWatchCheckReadsCheapFirst(t *testing.T) {
	const budget, limit = 150 * time.Millisecond, time.Minute
	idle := reading{agentCPU: time.Second, cgroupCPU: 2 * time.Second, states: "SSSS", unread: 100}
	cgroupWorked, sent, threadRuns := idle, idle, idle
	cgroupWorked.cgroupCPU++
	sent.frames++
	threadRuns.states = "SRSS"
	for _, tc := range []struct {
		name     string
		next     reading
		wantFull int
	}{
		{"the cgroup used CPU", cgroupWorked, 0},
		{"the agent sent frames", sent, 0},
		{"no counter moved, a thread runs", threadRuns, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakeProbe{readings: []reading{idle, tc.next}}
			began := time.Unix(1000, 0)
			w := newWatch(p, budget, limit, began)
			p.at = 1
			if !w.check(began.Add(budget)) {
				t.Fatalf("check of a working sandbox: Busy = false, want true")
			}
			if p.full != tc.wantFull {
				t.Errorf("full readings (progress, states) = %d, want %d", p.full, tc.wantFull)
			}
		})
	}
}

// TestProcSamplerShares: Watches of one agent share what is read of its
// processes within sampleTTL (hundreds wait on one agent in a burst, and
// each reading is some hundred /proc files), and read afresh after it.
func TestProcSamplerShares(t *testing.T) {
	var ps procSampler
	pid := uint32(os.Getpid())
	first := ps.sample(pid)
	if first.progress.agentCPU <= 0 || first.progress.cgroupCPU <= 0 || len(first.states) == 0 {
		t.Fatalf("sample of this process = %+v, want its CPU, its cgroup's and its threads' states", first)
	}
	if again := ps.sample(pid); !again.at.Equal(first.at) {
		t.Errorf("a second sample at once was read again (at %v, first at %v), want the first shared", again.at, first.at)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ps.sample(pid).at.Equal(first.at) {
		if time.Now().After(deadline) {
			t.Fatalf("the sample of %v was still served 5 s later, want a fresh one after %v", first.at, sampleTTL)
		}
		time.Sleep(sampleTTL)
	}
}

// TestBaselineReadsCgroupAlone: the reading a Watch starts from, which
// every exec takes (twice) and almost never uses, is the agent cgroup's CPU
// alone — it counts the agent's and its launchers' CPU too — not the some
// hundred /proc files of a full sample (issue 23: they were half of
// berthd's CPU in an exec round trip). A full sample within sampleTTL
// serves it, and it does not stand in for a full sample.
func TestBaselineReadsCgroupAlone(t *testing.T) {
	var ps procSampler
	pid := uint32(os.Getpid())
	b := ps.baseline(pid)
	if b.cgroupCPU <= 0 || b.agentCPU != -1 {
		t.Fatalf("baseline of this process = %+v, want its cgroup's CPU alone (agentCPU -1, unread)", b)
	}
	if full := ps.sample(pid); full.progress.agentCPU <= 0 || len(full.states) == 0 {
		t.Fatalf("sample after a baseline = %+v, want a full one (agent CPU and thread states)", full)
	}
	if again := ps.baseline(pid); again.agentCPU <= 0 {
		t.Errorf("baseline right after a full sample = %+v, want the full sample's", again)
	}
	var none procSampler
	if b := none.baseline(0); b.cgroupCPU != -1 || b.agentCPU != -1 {
		t.Errorf("baseline of pid 0 = %+v, want both counters unknown", b)
	}
}

// TestSamplerKeepsCgroupFiles: the sampler finds an agent's cgroup files
// once and reads them for the baselines that follow; files that cannot be
// read (the cgroup is gone) are found afresh.
func TestSamplerKeepsCgroupFiles(t *testing.T) {
	var ps procSampler
	pid := uint32(os.Getpid())
	if b := ps.baseline(pid); b.cgroupCPU <= 0 {
		t.Fatalf("baseline = %+v, want the cgroup's CPU", b)
	}
	kept, ok := ps.cgroups[pid]
	if !ok {
		t.Fatal("no cgroup files kept after a baseline")
	}
	ps.cgroups[pid] = procfs.CgroupCPUFiles{} // unreadable
	if cpu, err := ps.cgroupCPU(pid); err != nil || cpu <= 0 {
		t.Fatalf("cgroupCPU with unreadable kept files = %v, %v; want them found afresh", cpu, err)
	}
	if ps.cgroups[pid] != kept {
		t.Errorf("kept files = %+v after a failed read, want %+v found again", ps.cgroups[pid], kept)
	}
	// Execs seconds apart: the agent's sample is forgotten, its files
	// are not (they were dropped with any sample a second old).
	ps.store(pid+1, procSample{at: time.Now().Add(2 * time.Second)})
	if _, ok := ps.last[pid]; ok {
		t.Fatal("a sample 2 s older than the newest was kept")
	}
	if ps.cgroups[pid] != kept {
		t.Errorf("cgroup files after the agent's sample aged out = %+v, want %+v kept", ps.cgroups[pid], kept)
	}
}

// BenchmarkWatchBaseline is what starting a Watch costs berthd (per exec):
// one sampler, as berthd keeps, with every exec more than sampleTTL after
// the last, so that no sample is shared.
func BenchmarkWatchBaseline(b *testing.B) {
	pid := uint32(os.Getpid())
	var ps procSampler
	for b.Loop() {
		ps.mu.Lock()
		clear(ps.last)
		ps.mu.Unlock()
		ps.baseline(pid)
	}
}

// TestWatchPaused: a paused sandbox's agent, frozen with bytes unread and
// no work done (it looks stopped or hung), is waited for past the busy
// limit for as long as it is paused; once resumed, the usual rules apply.
func TestWatchPaused(t *testing.T) {
	const budget, limit = 150 * time.Millisecond, time.Second
	frozen := reading{agentCPU: time.Second, cgroupCPU: 2 * time.Second, states: "DDDD", unread: 100}
	readings := []reading{frozen}
	for range 20 {
		readings = append(readings, frozen)
	}
	readings = append(readings, reading{agentCPU: time.Second, cgroupCPU: 2 * time.Second, states: "SSSS", unread: 100})
	p := &fakeProbe{readings: readings}
	began := time.Unix(1000, 0)
	w := newWatch(p, budget, limit, began)
	paused := true
	w.paused = func() bool { return paused }
	for i := 1; i <= 20; i++ { // 3 s: three times the busy limit
		p.at = i
		if !w.check(began.Add(time.Duration(i) * budget)) {
			t.Fatalf("check %d of a paused sandbox: Busy = false, want it waited for", i)
		}
	}
	paused = false
	p.at = 21
	if w.check(began.Add(21 * budget)) {
		t.Errorf("resumed agent idle with bytes unread since the last check: Busy = true, want false")
	}
}

// TestWakeRefused: a call that asked not to resume a paused sandbox gets
// FAILED_PRECONDITION SANDBOX_PAUSED, and nothing is resumed; one that did
// not ask resumes it.
func TestWakeRefused(t *testing.T) {
	f := &fakeFreezer{}
	r := &Reacher{freezer: f, log: slog.New(slog.DiscardHandler)}
	r.SetPaused("sb", true)
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs(resume.Header, "true"))
	err := r.wake(metadata.NewIncomingContext(resume.Keep(in), metadata.MD{}), "sb", "e1", false)
	var refused *apierr.Refused
	if !errors.As(err, &refused) || refused.Code != codes.FailedPrecondition || refused.Reason != rpcstatus.ReasonSandboxPaused || f.resumes != 0 || !r.Paused("sb") {
		t.Fatalf("wake with berth-no-resume (kept past the auth seal): %v, %d resumes, paused %v; want SANDBOX_PAUSED, none, paused", err, f.resumes, r.Paused("sb"))
	}
	if err := r.wake(context.Background(), "sb", "e1", false); err != nil || f.resumes != 1 || r.Paused("sb") {
		t.Fatalf("wake: %v, %d resumes, paused %v; want resumed once", err, f.resumes, r.Paused("sb"))
	}
	if err := r.wake(context.Background(), "sb", "e1", false); err != nil || f.resumes != 1 {
		t.Errorf("wake of a running sandbox: %v, %d resumes; want nothing done", err, f.resumes)
	}
}

type fakeFreezer struct{ pauses, resumes int }

func (f *fakeFreezer) Pause(context.Context, string) error  { f.pauses++; return nil }
func (f *fakeFreezer) Resume(context.Context, string) error { f.resumes++; return nil }

func (f *fakeFreezer) Hibernate(context.Context, string, runtime.KeepMemory) (runtime.Hibernation, error) {
	return runtime.Hibernation{}, nil
}

// blockingFreezer pauses only once release is closed, telling entered
// when its Pause began: a pause that containerd has done (the task is
// frozen) and berthd has not yet recorded.
type blockingFreezer struct {
	fakeFreezer
	entered, release chan struct{}
}

func (f *blockingFreezer) Pause(ctx context.Context, id string) error {
	close(f.entered)
	<-f.release
	return f.fakeFreezer.Pause(ctx, id)
}

// TestWakeWaitsForPause: a call that reaches a sandbox while a pause of it
// is under way (the idle reaper's) waits for the pause and resumes it. It
// checked the recorded state alone and went on to the frozen agent, where
// its exec hung until its deadline (TestIdleActionPause, once at load 30).
func TestWakeWaitsForPause(t *testing.T) {
	f := &blockingFreezer{entered: make(chan struct{}), release: make(chan struct{})}
	r := &Reacher{freezer: f, log: slog.New(slog.DiscardHandler)}
	paused := make(chan error, 1)
	go func() { paused <- r.Pause(context.Background(), "sb") }()
	<-f.entered
	woke := make(chan error, 1)
	go func() { woke <- r.wake(context.Background(), "sb", "e1", false) }()
	// Blocked on the pause lock (the pause's hold and wake's wait): a
	// wake that did not wait returns instead.
	for {
		r.pauses.mu.Lock()
		l := r.pauses.locks["sb"]
		waiting := l != nil && l.refs == 2
		r.pauses.mu.Unlock()
		if waiting {
			break
		}
		select {
		case err := <-woke:
			t.Fatalf("wake during a pause returned %v at once, with %d resumes; want it to wait for the pause and resume", err, f.resumes)
		case <-time.After(time.Millisecond):
		}
	}
	close(f.release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil || f.resumes != 1 || r.Paused("sb") {
		t.Errorf("wake after the pause: %v, %d resumes, paused %v; want resumed once", err, f.resumes, r.Paused("sb"))
	}
}

// TestPauseIf: the idle reaper's pause asks ok under the pause lock and
// pauses only when it still says so.
func TestPauseIf(t *testing.T) {
	f := &fakeFreezer{}
	r := &Reacher{freezer: f, log: slog.New(slog.DiscardHandler)}
	if paused, err := r.PauseIf(context.Background(), "sb", func() bool { return false }); paused || err != nil || f.pauses != 0 || r.Paused("sb") {
		t.Errorf("PauseIf(not idle) = %v, %v with %d pauses; want nothing done", paused, err, f.pauses)
	}
	var locked bool
	if paused, err := r.PauseIf(context.Background(), "sb", func() bool { r.pauses.mu.Lock(); _, locked = r.pauses.locks["sb"]; r.pauses.mu.Unlock(); return true }); !paused || err != nil || f.pauses != 1 || !r.Paused("sb") {
		t.Errorf("PauseIf(idle) = %v, %v with %d pauses; want paused once", paused, err, f.pauses)
	}
	if !locked {
		t.Error("PauseIf asked ok without holding the sandbox's pause lock")
	}
}
