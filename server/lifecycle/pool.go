package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
)

// Maker creates warm-pool members.
type Maker interface {
	// MakePooled creates a sandbox of image with the default spec, marked as
	// an unclaimed pool member, and returns its id once its agent answers.
	MakePooled(ctx context.Context, image string) (string, error)
	// MakeStandby creates a fork standby member of sandbox parent (the
	// child its next fork makes, started on a placeholder root: see
	// runtime.SandboxSpec.Standby) and returns its id once its agent
	// waits.
	MakeStandby(ctx context.Context, parent string) (string, error)
	// Discard deletes a member the pool no longer wants (its parent gone
	// or idle past its time, or given way); a sandbox already gone is no
	// error. On an error the pool tries again (Pool.Remove).
	Discard(ctx context.Context, id string) error
}

// PoolConfig configures a Pool. Zero fields take the defaults given.
type PoolConfig struct {
	// Sizes maps an image reference to the number of ready sandboxes to
	// keep for it. An empty map disables the pool.
	Sizes map[string]int
	// RetryDelay is the pause after a failed creation before the next try
	// for that image. Default 5s.
	RetryDelay time.Duration
	// Standby is how many fork standby members to keep per parent once
	// it forked (Want); zero disables them.
	Standby int
	// StandbyIdle is how long a parent's standby members are kept after
	// its last fork. Default 10m.
	StandbyIdle time.Duration
}

// Pool keeps up to PoolConfig.Sizes[image] ready, unclaimed sandboxes per
// image and hands them out with Take. Run refills it in the background, one
// creation at a time. Its methods are safe for concurrent use.
//
// Its second kind of member is a fork standby member: up to
// PoolConfig.Standby per parent sandbox, wanted from that parent's fork
// (Want) until StandbyIdle after its last one or until Forget, and handed
// out with TakeStandby. Both kinds share the ready, failed and refill
// bookkeeping under a key: an image reference, or standbyKey(parent).
type Pool struct {
	cfg   PoolConfig
	maker Maker
	log   *slog.Logger

	mu      sync.Mutex
	ready   map[string][]string    // key -> member ids, oldest first
	failed  map[string]time.Time   // key -> when a creation last failed
	standby map[string]standbyWant // parent -> how many members, until when
	lent    map[string]int         // standby key -> members handed out, neither returned nor used yet
	// full holds the standby keys not refilled until room comes back
	// (Freed: a sandbox, snapshot or volume deleted, a sandbox
	// hibernated), with when: their member was refused for room, or gave way
	// to a sandbox that needed it (YieldStandby). A delete retries one
	// (freed), the one marked longest ago; a retry that makes its member
	// (retrying) lets the next be tried.
	full     map[string]time.Time
	freed    bool
	retrying string
	// orphans are members out of the pool whose removal failed: they
	// still hold room (a standby member counts against its parent's
	// owner, who cannot list it), so Run tries again every RetryDelay.
	orphans []string
	making  string             // the key whose member Run is making now ("": none)
	cancel  context.CancelFunc // cancels that making (YieldStandby)
	made    chan struct{}      // closed when that making ended
	wake    chan struct{}      // buffered: a refill may be needed
}

// standbyKey is the pool key of parent's standby members: no image
// reference holds a NUL.
func standbyKey(parent string) string { return "\x00standby\x00" + parent }

// parentOf returns the parent of a standby key, false for an image's key.
func parentOf(key string) (string, bool) { return strings.CutPrefix(key, "\x00standby\x00") }

// NewPool returns a Pool creating members with maker. Call Run to fill it.
func NewPool(cfg PoolConfig, maker Maker, log *slog.Logger) *Pool {
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 5 * time.Second
	}
	if cfg.StandbyIdle <= 0 {
		cfg.StandbyIdle = 10 * time.Minute
	}
	cfg.Sizes = maps.Clone(cfg.Sizes)
	return &Pool{cfg: cfg, maker: maker, log: log, ready: make(map[string][]string), failed: make(map[string]time.Time),
		standby: make(map[string]standbyWant), lent: make(map[string]int), full: make(map[string]time.Time), wake: make(chan struct{}, 1)}
}

// Want asks for n standby members of parent (at most
// PoolConfig.Standby; the most any call asked for since the parent's
// members were last forgotten) from now until StandbyIdle after the last
// call (a fork of parent calls it with its count of children: a caller
// that forks tends to fork again alike). A no-op when standby members are
// disabled.
func (p *Pool) Want(parent string, n int) {
	if p.cfg.Standby <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.standby[parent]
	w.until = time.Now().Add(p.cfg.StandbyIdle)
	w.n = min(max(w.n, n, 1), p.cfg.Standby)
	p.standby[parent] = w
	p.poke()
}

// standbyWant is how many standby members of a parent are wanted, until
// when.
type standbyWant struct {
	until time.Time
	n     int
}

// TakeStandby hands out a ready standby member of parent, removing it
// from the pool; false when none is ready. The member still fills its
// place, and none is made in its stead, until the caller returns it
// (ReturnStandby) or used it (StandbyUsed): a fork that fails before it
// reaches the member — a caller who may not see parent, or who is at
// a cap — must not make berthd create and discard members at its rate.
func (p *Pool) TakeStandby(parent string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := standbyKey(parent)
	ids := p.ready[key]
	if len(ids) == 0 {
		return "", false
	}
	p.ready[key] = ids[1:]
	p.lent[key]++
	return ids[0], true
}

// StandbyUsed says that a standby member of parent handed out by
// TakeStandby is gone: it became a fork's child, or was removed. A
// refill follows.
func (p *Pool) StandbyUsed(parent string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unlend(standbyKey(parent))
	p.poke()
}

// unlend counts one member of key handed out back; the caller holds mu.
func (p *Pool) unlend(key string) {
	if p.lent[key] <= 1 {
		delete(p.lent, key)
		return
	}
	p.lent[key]--
}

// ReturnStandby puts standby member id of parent, handed out by
// TakeStandby, back (its fork did not use it). It reports false when the
// pool no longer wants it: the caller removes it.
func (p *Pool) ReturnStandby(parent, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := standbyKey(parent)
	p.unlend(key)
	if w, ok := p.standby[parent]; !ok || len(p.ready[key])+p.lent[key] >= w.n {
		return false
	}
	p.ready[key] = append(p.ready[key], id)
	return true
}

// Forget stops wanting standby members of parent (it is deleted, or its
// spec changed) and returns the ready ones for the caller to remove; one
// being made then is discarded when done.
func (p *Pool) Forget(parent string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := standbyKey(parent)
	ids := p.ready[key]
	delete(p.ready, key)
	delete(p.failed, key)
	delete(p.lent, key)
	delete(p.full, key)
	delete(p.standby, parent)
	return ids
}

// YieldStandby takes a ready standby member of a parent that match
// accepts out of the pool for the caller to remove, so that a sandbox
// refused for room it holds can be admitted; that parent's members are
// then not made again until room comes back (Freed). When none is
// ready but one of such a parent is being made (its admission may hold
// the room), it cancels that making, waits until it ended and reports
// true with no id: the caller tries again. (Waiting for the member to be
// made instead could wait for ever: its making locks its parent, which a
// refused fork of that parent holds.) false: no member of such a parent.
// match is called without the pool's lock held.
func (p *Pool) YieldStandby(ctx context.Context, match func(parent string) bool) (string, bool) {
	for {
		p.mu.Lock()
		var parents []string
		for key, ids := range p.ready {
			if parent, ok := parentOf(key); ok && len(ids) > 0 {
				parents = append(parents, parent)
			}
		}
		making, cancel, made := p.making, p.cancel, p.made
		p.mu.Unlock()
		slices.Sort(parents)
		for _, parent := range parents {
			if !match(parent) {
				continue
			}
			p.mu.Lock()
			key := standbyKey(parent)
			if ids := p.ready[key]; len(ids) > 0 {
				p.ready[key] = ids[1:]
				p.full[key] = time.Now()
				p.mu.Unlock()
				return ids[0], true
			}
			p.mu.Unlock()
		}
		if parent, ok := parentOf(making); !ok || !match(parent) {
			return "", false
		}
		p.mu.Lock()
		p.full[making] = time.Now()
		p.mu.Unlock()
		cancel()
		select {
		case <-made:
			return "", true
		case <-ctx.Done():
			return "", false
		}
	}
}

// Yieldable returns how many standby members of each parent
// YieldStandby could take or cancel now: its ready ones, and the one
// being made.
func (p *Pool) Yieldable() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int)
	for key, ids := range p.ready {
		if parent, ok := parentOf(key); ok && len(ids) > 0 {
			out[parent] += len(ids)
		}
	}
	if parent, ok := parentOf(p.making); ok {
		out[parent]++
	}
	return out
}

// Freed says that room came back (a sandbox, snapshot or volume deleted,
// a sandbox hibernated): a standby member refused for room, or that gave
// way, may be made again. One parent's is tried (the
// one refused longest ago), and the next only when it was made: each try
// is an admission, and a delete must not cost one per such parent.
func (p *Pool) Freed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.full) > 0 {
		p.freed = true
		p.poke()
	}
}

// idle forgets the parents whose StandbyIdle passed and returns their
// ready members, and the time until the next one's ends (0: none).
func (p *Pool) idle(now time.Time) (ids []string, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for parent, w := range p.standby {
		if left := w.until.Sub(now); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		key := standbyKey(parent)
		ids = append(ids, p.ready[key]...)
		delete(p.ready, key)
		delete(p.failed, key)
		delete(p.lent, key)
		delete(p.full, key)
		delete(p.standby, parent)
	}
	return ids, wait
}

// Remove deletes member id, which the pool no longer holds (given way,
// forgotten, not returned, idle), with Maker.Discard. When that fails
// the member is kept to be removed again by Run, every RetryDelay, until
// it is gone: left, it would hold room no one can see or free until
// berthd restarts.
func (p *Pool) Remove(ctx context.Context, id string) {
	if err := p.maker.Discard(ctx, id); err != nil {
		p.log.Error("warm pool: remove member; trying again", slog.String("sandbox_id", id), slog.Any("error", err),
			slog.Duration("retry_in", p.cfg.RetryDelay))
		p.mu.Lock()
		p.orphans = append(p.orphans, id)
		p.mu.Unlock()
		p.poke()
	}
}

// removeOrphans tries again to remove the members whose removal failed
// (Remove) and returns how long until the next try (0: none left).
func (p *Pool) removeOrphans(ctx context.Context) time.Duration {
	p.mu.Lock()
	ids := p.orphans
	p.orphans = nil
	p.mu.Unlock()
	var left []string
	for _, id := range ids {
		if err := p.maker.Discard(ctx, id); err != nil {
			p.log.Error("warm pool: remove member again", slog.String("sandbox_id", id), slog.Any("error", err),
				slog.Duration("retry_in", p.cfg.RetryDelay))
			left = append(left, id)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.orphans = append(p.orphans, left...)
	if len(p.orphans) == 0 {
		return 0
	}
	return p.cfg.RetryDelay
}

// Orphans returns the ids of the members whose removal failed and is
// tried again (Remove).
func (p *Pool) Orphans() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.orphans)
}

// Enabled reports whether the pool keeps sandboxes for image.
func (p *Pool) Enabled(image string) bool { return p.cfg.Sizes[image] > 0 }

// Take hands out a ready member of image, removing it from the pool, and
// asks for a refill. It reports false when none is ready.
func (p *Pool) Take(image string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ready[image]
	if len(ids) == 0 {
		return "", false
	}
	id := ids[0]
	p.ready[image] = ids[1:]
	p.poke()
	return id, true
}

// Adopt puts an existing member of image (found at start-up) into the pool.
// It reports false when the pool has no room for it: the caller removes it.
func (p *Pool) Adopt(image, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready[image]) >= p.cfg.Sizes[image] {
		return false
	}
	p.ready[image] = append(p.ready[image], id)
	return true
}

// Ready returns the number of ready members of image.
func (p *Pool) Ready(image string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[image])
}

// Members returns the ids of every ready member, standby members too.
func (p *Pool) Members() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, image := range slices.Sorted(maps.Keys(p.ready)) {
		ids = append(ids, p.ready[image]...)
	}
	return ids
}

func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run fills the pool until ctx ends: whenever an image has fewer ready
// members than its size it creates one, then looks again. After a failed
// creation that image waits RetryDelay. Members stay when Run returns, for
// the next berthd to adopt.
func (p *Pool) Run(ctx context.Context) {
	if len(p.cfg.Sizes) == 0 && p.cfg.Standby <= 0 {
		return
	}
	p.poke()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry.C:
		}
		orphanWait := p.removeOrphans(ctx)
		for {
			idle, idleWait := p.idle(time.Now())
			for _, id := range idle {
				p.log.Info("warm pool: standby member idle past its time; removing it", slog.String("sandbox_id", id))
				p.Remove(ctx, id)
			}
			image, wait := p.next()
			if image == "" {
				for _, w := range []time.Duration{idleWait, orphanWait} {
					if w > 0 && (wait == 0 || w < wait) {
						wait = w
					}
				}
				if wait > 0 {
					retry.Reset(wait)
				}
				break
			}
			parent, standby := parentOf(image)
			mctx, made := p.beginMaking(ctx, image)
			var id string
			var err error
			if standby {
				id, err = p.maker.MakeStandby(mctx, parent)
			} else {
				id, err = p.maker.MakePooled(mctx, image)
			}
			p.mu.Lock()
			yielded := mctx.Err() != nil && ctx.Err() == nil
			p.cancel()
			p.making, p.cancel = "", nil
			retried := p.retrying
			p.retrying = ""
			close(made)
			if ctx.Err() != nil {
				p.mu.Unlock()
				return
			}
			_, wanted := p.standby[parent]
			var busy *apierr.FleetBusy
			switch {
			case yielded && err == nil:
				// Made as it was canceled: it gives way all the same.
				p.mu.Unlock()
				p.log.Info("warm pool: standby member gave way while being made; removing it", slog.String("parent", parent), slog.String("sandbox_id", id))
				p.Remove(ctx, id)
				continue
			case yielded:
				p.log.Info("warm pool: standby member gave way while being made", slog.String("parent", parent))
			case err != nil && standby && errors.As(err, &busy):
				// No room within the parent's owner's caps or the
				// server's limits: a member never takes a sandbox's.
				p.full[image] = time.Now()
				p.log.Info("warm pool: no room for a standby member; none is made until room comes back",
					slog.String("parent", parent), slog.Any("error", err))
			case err != nil:
				p.failed[image] = time.Now()
				p.log.Error("warm pool: create sandbox", slog.String("image", image), slog.Any("error", err), slog.Duration("retry_in", p.cfg.RetryDelay))
			case standby && !wanted:
				p.mu.Unlock()
				p.log.Info("warm pool: standby member's parent is gone; removing it", slog.String("parent", parent), slog.String("sandbox_id", id))
				p.Remove(ctx, id)
				continue
			default:
				delete(p.failed, image)
				p.ready[image] = append(p.ready[image], id)
				if image == retried && len(p.full) > 0 {
					p.freed = true // there was room: try the next
				}
				p.log.Info("warm pool: sandbox ready", slog.String("image", image), slog.String("sandbox_id", id), slog.Int("ready", len(p.ready[image])))
			}
			p.mu.Unlock()
		}
	}
}

// beginMaking records that key's member is being made and returns the
// context to make it under (YieldStandby cancels it) and the channel to
// close when the making ended.
func (p *Pool) beginMaking(ctx context.Context, key string) (context.Context, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var mctx context.Context
	mctx, p.cancel = context.WithCancel(ctx)
	p.making, p.made = key, make(chan struct{})
	return mctx, p.made
}

// next returns the key (an image, or a standby key) that needs a member
// now, or "" and how long until the earliest failed key may be retried (0
// when none waits). Standby keys sort first (a fork that waits for one is
// the caller's next step), then images. A standby key refused for room
// (full) is returned only after a delete (Freed), one per delete, the one
// refused longest ago, and only when no other key needs a member.
func (p *Pool) next() (string, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wait time.Duration
	sizes := maps.Clone(p.cfg.Sizes)
	if sizes == nil {
		sizes = map[string]int{}
	}
	for parent, w := range p.standby {
		sizes[standbyKey(parent)] = w.n
	}
	var retry string // the full key to try after a delete (Freed)
	for _, image := range slices.Sorted(maps.Keys(sizes)) {
		if len(p.ready[image])+p.lent[image] >= sizes[image] {
			continue
		}
		if at, ok := p.full[image]; ok {
			if p.freed && (retry == "" || at.Before(p.full[retry])) {
				retry = image
			}
			continue
		}
		if at, ok := p.failed[image]; ok {
			if left := p.cfg.RetryDelay - time.Since(at); left > 0 {
				if wait == 0 || left < wait {
					wait = left
				}
				continue
			}
		}
		return image, 0
	}
	if retry != "" {
		delete(p.full, retry)
		p.freed, p.retrying = false, retry
		return retry, 0
	}
	return "", wait
}
