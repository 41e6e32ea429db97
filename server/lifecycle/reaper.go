package lifecycle

// The Reaper stops sandboxes that stayed idle past their idle timeout or
// reached their maximum lifetime, and the Pool (pool.go) keeps pre-created
// sandboxes ready to hand out. Both run in one owner goroutine each (Run)
// that returns when its context ends; neither touches containerd itself —
// the Manager passes in what they need as small interfaces.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Reason says why the Reaper stops a sandbox.
type Reason int

const (
	// ReasonNone means the sandbox is not being stopped.
	ReasonNone Reason = iota
	// ReasonIdle means no exec ran and no request named the sandbox for its
	// idle timeout.
	ReasonIdle
	// ReasonLifetime means the sandbox reached its maximum lifetime.
	ReasonLifetime
)

// String returns the reason's token as logged and recorded in labels.
func (r Reason) String() string {
	switch r {
	case ReasonIdle:
		return "idle-timeout"
	case ReasonLifetime:
		return "max-lifetime"
	default:
		return ""
	}
}

// ParseReason returns the Reason whose String is s, ReasonNone otherwise.
func ParseReason(s string) Reason {
	switch s {
	case ReasonIdle.String():
		return ReasonIdle
	case ReasonLifetime.String():
		return ReasonLifetime
	}
	return ReasonNone
}

// Activity is what a sandbox's agent reports about its execs.
type Activity struct {
	// Running is the number of execs whose process runs.
	Running uint32
	// Last is when an exec last started, ended or was streamed; zero when
	// never.
	Last time.Time
}

// ErrGone from Prober.Probe means the sandbox no longer exists; the Reaper
// forgets it.
var ErrGone = errors.New("sandbox gone")

// ErrNotRunning from Prober.Probe means the sandbox has no running task:
// nothing can run in it, so it is idle.
var ErrNotRunning = errors.New("sandbox task not running")

// Prober asks a sandbox's agent about exec activity.
type Prober interface {
	Probe(ctx context.Context, id string) (Activity, error)
}

// ErrPaused from Prober.Probe means the sandbox is paused: its agent
// cannot answer, and the idle timeout does not run while it is.
var ErrPaused = errors.New("sandbox paused")

// Stopper stops and removes an expired sandbox, or pauses an idle one
// whose idle action is to pause.
type Stopper interface {
	Stop(ctx context.Context, id string, reason Reason) error
	// Pause pauses (or hibernates) idle sandbox id when stillIdle, asked
	// where no request can begin unseen before the pause, still reports
	// true; it reports whether it did.
	Pause(ctx context.Context, id string, stillIdle func() bool) (bool, error)
}

// Limits are a sandbox's timeouts.
type Limits struct {
	// CreatedAt starts the maximum lifetime.
	CreatedAt time.Time
	// IdleTimeout is how long the sandbox may stay idle; zero never.
	IdleTimeout time.Duration
	// MaxLifetime is how long the sandbox may live; zero forever.
	MaxLifetime time.Duration
	// HoldUntil keeps the idle timeout off until then.
	HoldUntil time.Time
	// PauseOnIdle makes the idle timeout pause the sandbox instead of
	// removing it (IDLE_ACTION_PAUSE).
	PauseOnIdle bool
}

// Status is what the Reaper knows of a sandbox now.
type Status struct {
	// LastActivity is the last activity seen: a request, or what the agent
	// reported.
	LastActivity time.Time
	// IdleDeadline is when the idle timeout would stop the sandbox: the
	// later of LastActivity + IdleTimeout and the hold; zero without an
	// idle timeout.
	IdleDeadline time.Time
	// ExpiresAt is CreatedAt + MaxLifetime; zero without a maximum.
	ExpiresAt time.Time
	// Stopping is why the sandbox is being stopped; ReasonNone when not.
	Stopping Reason
	// Busy is true while a request naming the sandbox is in progress.
	Busy bool
	// Paused is true while the sandbox is paused: its idle timeout does
	// not run.
	Paused bool
}

// ReaperConfig configures a Reaper. Zero fields take the defaults given.
type ReaperConfig struct {
	// Interval is how often deadlines are checked. An expiry is acted on at
	// most Interval (plus a probe) late. Default 1s.
	Interval time.Duration
	// ProbeTimeout bounds one agent probe. Default 2s.
	ProbeTimeout time.Duration
	// ProbeFailures is how many probes in a row may fail before an
	// unanswering sandbox counts as idle. Default 3.
	ProbeFailures int
	// StopTimeout bounds one removal. Default 1m.
	StopTimeout time.Duration
	// Parallel bounds concurrent probes and removals. Default 4.
	Parallel int
}

func (c *ReaperConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 2 * time.Second
	}
	if c.ProbeFailures <= 0 {
		c.ProbeFailures = 3
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = time.Minute
	}
	if c.Parallel <= 0 {
		c.Parallel = 4
	}
}

// Reaper tracks the activity of running sandboxes and stops those whose
// idle timeout or maximum lifetime expired. A sandbox is idle when no
// request naming it is in progress (Begin), none arrived (Touch) and its
// agent reported no running exec and no exec activity for its idle timeout.
// Its methods are safe for concurrent use.
type Reaper struct {
	cfg   ReaperConfig
	probe Prober
	stop  Stopper
	log   *slog.Logger
	now   func() time.Time

	mu        sync.Mutex
	sandboxes map[string]*entry
	// sweeps counts finished rounds: what a test waits for to know that
	// the reaper looked and did nothing.
	sweeps atomic.Int64
}

type entry struct {
	limits       Limits
	lastActivity time.Time
	inflight     int
	failures     int // probes failed in a row
	stopping     Reason
	paused       bool
}

// NewReaper returns a Reaper that asks probe about activity and stop to
// remove expired sandboxes. Call Run to start it.
func NewReaper(cfg ReaperConfig, probe Prober, stop Stopper, log *slog.Logger) *Reaper {
	cfg.setDefaults()
	return &Reaper{cfg: cfg, probe: probe, stop: stop, log: log, now: time.Now, sandboxes: make(map[string]*entry)}
}

// Track starts watching sandbox id; its idle clock starts now. Tracking an
// id again replaces its limits and keeps its activity.
func (r *Reaper) Track(id string, l Limits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.sandboxes[id]; ok {
		e.limits = l
		return
	}
	r.sandboxes[id] = &entry{limits: l, lastActivity: r.now()}
}

// Forget stops watching sandbox id.
func (r *Reaper) Forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sandboxes, id)
}

// SetPaused records that sandbox id was paused or resumed: a paused
// sandbox does not idle out, and a resume counts as activity.
func (r *Reaper) SetPaused(id string, paused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.sandboxes[id]; ok {
		e.paused = paused
		e.lastActivity = r.now()
		e.failures = 0
	}
}

// Touch records activity in sandbox id now.
func (r *Reaper) Touch(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.sandboxes[id]; ok {
		e.lastActivity = r.now()
	}
}

// Begin records a request naming sandbox id that lasts until the returned
// function is called: the sandbox is not idle meanwhile. The end function
// records activity again and may be called more than once.
func (r *Reaper) Begin(id string) (end func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return func() {}
	}
	e.inflight++
	e.lastActivity = r.now()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			e.inflight--
			e.lastActivity = r.now()
		})
	}
}

// Hold keeps the idle timeout from stopping sandbox id before until, and
// records activity now. It reports false when id is not tracked.
func (r *Reaper) Hold(id string, until time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return false
	}
	e.lastActivity = r.now()
	if until.After(e.limits.HoldUntil) {
		e.limits.HoldUntil = until
	}
	return true
}

// Status returns what the Reaper knows of sandbox id, and false when it
// does not track it.
func (r *Reaper) Status(id string) (Status, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok {
		return Status{}, false
	}
	st := Status{LastActivity: e.lastActivity, Stopping: e.stopping, Busy: e.inflight > 0, Paused: e.paused}
	if !e.paused {
		st.IdleDeadline = e.idleDeadline()
	}
	if e.stopping == ReasonIdle && e.limits.PauseOnIdle {
		st.Stopping = ReasonNone // being paused, not stopped
	}
	if e.limits.MaxLifetime > 0 {
		st.ExpiresAt = e.limits.CreatedAt.Add(e.limits.MaxLifetime)
	}
	return st, true
}

// Stopping reports why sandbox id is being stopped, ReasonNone when it is
// not (or not tracked).
func (r *Reaper) Stopping(id string) Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.sandboxes[id]; ok && !(e.stopping == ReasonIdle && e.limits.PauseOnIdle) {
		return e.stopping
	}
	return ReasonNone
}

func (e *entry) idleDeadline() time.Time {
	if e.limits.IdleTimeout <= 0 {
		return time.Time{}
	}
	d := e.lastActivity.Add(e.limits.IdleTimeout)
	if e.limits.HoldUntil.After(d) {
		d = e.limits.HoldUntil
	}
	return d
}

// idleAt reports whether the entry is idle-expired at now. The caller holds
// r.mu.
func (e *entry) idleAt(now time.Time) bool {
	d := e.idleDeadline()
	return !d.IsZero() && !e.paused && e.inflight == 0 && !now.Before(d)
}

// Run checks deadlines every Interval until ctx ends. Each round is bounded:
// at most Parallel probes or removals at once, each under its timeout.
// Sandboxes are left running when Run returns.
func (r *Reaper) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.sweep(ctx)
		}
	}
}

// sweep is one round: probe the idle candidates, then stop what expired.
func (r *Reaper) sweep(ctx context.Context) {
	now := r.now()
	var probe []string
	r.mu.Lock()
	for id, e := range r.sandboxes {
		switch {
		case e.stopping != ReasonNone:
			// A removal that failed before: retried below.
		case e.limits.MaxLifetime > 0 && !now.Before(e.limits.CreatedAt.Add(e.limits.MaxLifetime)):
			r.expire(id, e, ReasonLifetime, now)
		case e.idleAt(now):
			probe = append(probe, id)
		}
	}
	r.mu.Unlock()

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.Parallel)
	for _, id := range probe {
		g.Go(func() error {
			pctx, cancel := context.WithTimeout(gctx, r.cfg.ProbeTimeout)
			act, err := r.probe.Probe(pctx, id)
			cancel()
			r.settle(ctx, id, act, err)
			return nil
		})
	}
	g.Wait()

	var stop []string
	r.mu.Lock()
	for id, e := range r.sandboxes {
		if e.stopping != ReasonNone {
			stop = append(stop, id)
		}
	}
	r.mu.Unlock()
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.Parallel)
	for _, id := range stop {
		g.Go(func() error {
			r.remove(gctx, id)
			return nil
		})
	}
	g.Wait()
	r.sweeps.Add(1)
}

// settle applies a probe's answer and marks the sandbox idle-expired when
// it still is.
func (r *Reaper) settle(ctx context.Context, id string, act Activity, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sandboxes[id]
	if !ok || e.stopping != ReasonNone {
		return
	}
	now := r.now()
	switch {
	case errors.Is(err, ErrGone):
		delete(r.sandboxes, id)
		return
	case errors.Is(err, ErrPaused):
		e.failures, e.paused = 0, true
		return
	case errors.Is(err, ErrNotRunning):
		e.failures = 0
	case err != nil:
		e.failures++
		if ctx.Err() != nil || e.failures < r.cfg.ProbeFailures {
			r.log.Debug("idle check: agent did not answer", slog.String("sandbox_id", id), slog.Int("failures", e.failures), slog.Any("error", err))
			return
		}
		r.log.Warn("idle check: agent did not answer repeatedly; counting the sandbox as idle", slog.String("sandbox_id", id), slog.Int("failures", e.failures), slog.Any("error", err))
	default:
		e.failures = 0
		if act.Running > 0 {
			e.lastActivity = now
			return
		}
		if act.Last.After(e.lastActivity) {
			e.lastActivity = act.Last
		}
	}
	if e.idleAt(now) {
		r.expire(id, e, ReasonIdle, now)
	}
}

// expire marks e stopping for reason and logs it. The caller holds r.mu.
func (r *Reaper) expire(id string, e *entry, reason Reason, now time.Time) {
	e.stopping = reason
	attrs := []any{slog.String("sandbox_id", id), slog.String("reason", reason.String())}
	switch reason {
	case ReasonIdle:
		attrs = append(attrs, slog.Duration("idle_timeout", e.limits.IdleTimeout), slog.Duration("idle_for", now.Sub(e.lastActivity).Round(time.Millisecond)))
	case ReasonLifetime:
		attrs = append(attrs, slog.Duration("max_lifetime", e.limits.MaxLifetime), slog.Duration("age", now.Sub(e.limits.CreatedAt).Round(time.Millisecond)))
	}
	if reason == ReasonIdle && e.limits.PauseOnIdle {
		r.log.Info("sandbox idle; pausing it", attrs...)
		return
	}
	r.log.Info("sandbox expired; stopping it", attrs...)
}

// remove stops one expired sandbox and forgets it; a failure is logged and
// retried next round. An idle verdict is checked again first: a request
// that began since (Begin, Touch, Hold) makes the sandbox active again, and
// it is kept. Once the check passed the removal is under way, and requests
// arriving later find the sandbox going (NOT_FOUND, or RUNTIME_REPLACED for
// a running exec).
func (r *Reaper) remove(ctx context.Context, id string) {
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if !ok || e.stopping == ReasonNone {
		r.mu.Unlock()
		return
	}
	reason := e.stopping
	if now := r.now(); reason == ReasonIdle && !e.idleAt(now) {
		e.stopping = ReasonNone
		requests, idleFor := e.inflight, now.Sub(e.lastActivity).Round(time.Millisecond)
		r.mu.Unlock()
		r.log.Info("expired sandbox in use again before its removal; keeping it", slog.String("sandbox_id", id),
			slog.Int("requests", requests), slog.Duration("idle_for", idleFor))
		return
	}
	pause := reason == ReasonIdle && e.limits.PauseOnIdle
	r.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, r.cfg.StopTimeout)
	defer cancel()
	if pause {
		r.pauseIdle(sctx, id)
		return
	}
	if err := r.stop.Stop(sctx, id, reason); err != nil {
		if ctx.Err() == nil {
			r.log.Error("stop expired sandbox; retrying", slog.String("sandbox_id", id), slog.String("reason", reason.String()), slog.Any("error", err))
		}
		return
	}
	r.Forget(id)
	r.log.Info("expired sandbox removed", slog.String("sandbox_id", id), slog.String("reason", reason.String()))
}

// pauseIdle pauses an idle sandbox whose idle action is to pause it; a
// failure is logged and retried next round.
func (r *Reaper) pauseIdle(ctx context.Context, id string) {
	stillIdle := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		e, ok := r.sandboxes[id]
		return ok && e.idleAt(r.now())
	}
	paused, err := r.stop.Pause(ctx, id, stillIdle)
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	if ok {
		e.stopping = ReasonNone
		if paused && err == nil {
			e.paused = true
		}
	}
	r.mu.Unlock()
	switch {
	case err != nil:
		r.log.Error("pause idle sandbox; retrying", slog.String("sandbox_id", id), slog.Any("error", err))
	case !paused:
		r.log.Info("idle sandbox in use again before its pause; keeping it running", slog.String("sandbox_id", id))
	default:
		r.log.Info("idle sandbox paused", slog.String("sandbox_id", id))
	}
}
