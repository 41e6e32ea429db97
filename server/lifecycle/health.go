package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Health checks, in a fleet node's terms (cluster.Health): whether the
// node can create sandboxes.
const (
	// healthProbeInterval is how often containerd is asked whether it
	// answers.
	healthProbeInterval = time.Second
	// healthProbeBudget bounds one probe: a containerd that does not
	// answer within it (stopped, hung) counts as unavailable.
	healthProbeBudget = 2 * time.Second
	// healthFaultHold is how long a fault seen by creates (a full pool,
	// agents that do not start) keeps the node unhealthy when no create
	// succeeds meanwhile; then the node is healthy again, for the next
	// create to find out.
	healthFaultHold = 30 * time.Second
	// poolMinFree is the least free space of the sandboxes' pool, in
	// bytes, or 1% of the pool when that is more, below which the node
	// counts as full (NO_SPACE) before a create fails there.
	poolMinFree = 64 << 20
	// launchFailuresUnhealthy is the number of creates in a row whose
	// agent did not start that make the node unhealthy.
	launchFailuresUnhealthy = 3
)

// health is the node's health as its probes and creates found it. Its
// methods are safe for concurrent use; onChange runs (outside its lock)
// after each change.
type health struct {
	onChange func(cluster.Health)

	mu       sync.Mutex
	cur      cluster.Health
	until    time.Time // when a fault seen by creates lapses
	launches int       // creates in a row whose agent did not start
}

func (h *health) get() cluster.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// set makes the node's health reason (healthy when empty) with message,
// as of now, and reports the change.
func (h *health) set(now time.Time, reason, message string) {
	h.mu.Lock()
	prev := h.cur
	if reason != prev.Reason {
		h.cur = cluster.Health{Reason: reason, Message: message, Since: now}
		if reason == "" {
			h.until = time.Time{} // a hold ends with the fault
		}
	} else {
		h.cur.Message = message
	}
	cur := h.cur
	h.mu.Unlock()
	if cur.Reason != prev.Reason && h.onChange != nil {
		h.onChange(cur)
	}
}

// probed takes the answer of a containerd probe at now: an error makes the
// node unhealthy (CONTAINERD_UNAVAILABLE), an answer clears that, and a
// fault seen by creates that outlived healthFaultHold.
func (h *health) probed(now time.Time, err error) {
	if err != nil {
		h.set(now, cluster.HealthContainerd, fmt.Sprintf("containerd does not answer: %v", err))
		return
	}
	h.mu.Lock()
	cur, until := h.cur, h.until
	h.mu.Unlock()
	if cur.Reason == cluster.HealthContainerd || (!cur.Healthy() && now.After(until)) {
		h.set(now, "", "")
	}
}

// created takes the outcome of a create at now. launched says whether
// the sandbox's task started, so that err is its agent's (or nil).
func (h *health) created(now time.Time, launched bool, err error) {
	var (
		unavailable *runtime.UnavailableError
		poolFull    *runtime.PoolFullError
	)
	switch {
	case err == nil:
		h.mu.Lock()
		h.launches = 0
		cur := h.cur
		h.mu.Unlock()
		if cur.Reason == cluster.HealthNoSpace || cur.Reason == cluster.HealthAgentLaunch {
			h.set(now, "", "")
		}
	case errors.As(err, &unavailable):
		h.set(now, cluster.HealthContainerd, fmt.Sprintf("containerd does not answer: %v", err))
	case errors.As(err, &poolFull):
		h.hold(now, cluster.HealthNoSpace, err.Error())
	case launched && errors.Is(err, apierr.ErrUnreachable):
		h.mu.Lock()
		h.launches++
		n := h.launches
		h.mu.Unlock()
		if n >= launchFailuresUnhealthy {
			h.hold(now, cluster.HealthAgentLaunch, fmt.Sprintf("the agents of the last %d creates did not start; the last: %v", n, err))
		}
	}
}

// poolSpace takes the pool's space as a probe read it at now: less than
// poolMinFree (or 1%) left makes the node unhealthy (NO_SPACE) until a
// probe finds room again.
func (h *health) poolSpace(now time.Time, ps runtime.PoolSpace) {
	if floor := max(poolMinFree, ps.SizeBytes/100); ps.FreeBytes < floor {
		// Until a probe or two later, however long the probes take.
		h.holdFor(now, 2*healthProbeInterval+healthProbeBudget, cluster.HealthNoSpace,
			fmt.Sprintf("%s has %d bytes free of %d, below the %d it must keep", ps.Pool, ps.FreeBytes, ps.SizeBytes, floor))
	}
}

// hold makes the node unhealthy for reason until healthFaultHold from now,
// unless containerd's own fault is what it is.
func (h *health) hold(now time.Time, reason, message string) {
	h.holdFor(now, healthFaultHold, reason, message)
}

// holdFor makes the node unhealthy for reason for d from now at least,
// unless containerd's own fault is what it is.
func (h *health) holdFor(now time.Time, d time.Duration, reason, message string) {
	h.mu.Lock()
	containerd := h.cur.Reason == cluster.HealthContainerd
	if !containerd {
		h.until = maxTime(h.until, now.Add(d))
	}
	h.mu.Unlock()
	if !containerd {
		h.set(now, reason, message)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// checkHealth probes containerd, and the pool's space when berthd knows
// the pool, every healthProbeInterval until ctx ends.
func (m *Manager) checkHealth(ctx context.Context) {
	tick := time.NewTicker(healthProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, healthProbeBudget)
		err := m.rt.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v", healthProbeBudget)
		}
		now := time.Now()
		m.health.probed(now, err)
		if ps, ok, err := m.rt.PoolSpace(); ok {
			m.health.poolSpace(now, ps)
		} else if err != nil {
			m.log.Warn("read the space of the sandboxes' pool", slog.Any("error", err))
		}
	}
}

// healthChanged logs a change of the node's health and publishes it to
// the fleet at once.
func (m *Manager) healthChanged(h cluster.Health) {
	if h.Healthy() {
		m.log.Info("healthy again: this berthd can create sandboxes")
	} else {
		m.log.Warn("unhealthy: this berthd cannot create sandboxes now; a fleet places them on other nodes while it lasts", slog.String("reason", h.Reason), slog.String("message", h.Message))
	}
	if m.cfg.Placements != nil {
		m.cfg.Placements.Kick()
	}
}
