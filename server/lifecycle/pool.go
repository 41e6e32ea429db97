package lifecycle

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// Maker creates warm-pool members.
type Maker interface {
	// MakePooled creates a sandbox of image with the default spec, marked as
	// an unclaimed pool member, and returns its id once its agent answers.
	MakePooled(ctx context.Context, image string) (string, error)
}

// PoolConfig configures a Pool. Zero fields take the defaults given.
type PoolConfig struct {
	// Sizes maps an image reference to the number of ready sandboxes to
	// keep for it. An empty map disables the pool.
	Sizes map[string]int
	// RetryDelay is the pause after a failed creation before the next try
	// for that image. Default 5s.
	RetryDelay time.Duration
}

// Pool keeps up to PoolConfig.Sizes[image] ready, unclaimed sandboxes per
// image and hands them out with Take. Run refills it in the background, one
// creation at a time. Its methods are safe for concurrent use.
type Pool struct {
	cfg   PoolConfig
	maker Maker
	log   *slog.Logger

	mu     sync.Mutex
	ready  map[string][]string  // image -> member ids, oldest first
	failed map[string]time.Time // image -> when a creation last failed
	wake   chan struct{}        // buffered: a refill may be needed
}

// NewPool returns a Pool creating members with maker. Call Run to fill it.
func NewPool(cfg PoolConfig, maker Maker, log *slog.Logger) *Pool {
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 5 * time.Second
	}
	cfg.Sizes = maps.Clone(cfg.Sizes)
	return &Pool{cfg: cfg, maker: maker, log: log, ready: make(map[string][]string), failed: make(map[string]time.Time), wake: make(chan struct{}, 1)}
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

// Members returns the ids of every ready member.
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
	if len(p.cfg.Sizes) == 0 {
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
		for {
			image, wait := p.next()
			if image == "" {
				if wait > 0 {
					retry.Reset(wait)
				}
				break
			}
			id, err := p.maker.MakePooled(ctx, image)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			if err != nil {
				p.failed[image] = time.Now()
				p.log.Error("warm pool: create sandbox", slog.String("image", image), slog.Any("error", err), slog.Duration("retry_in", p.cfg.RetryDelay))
			} else {
				delete(p.failed, image)
				p.ready[image] = append(p.ready[image], id)
				p.log.Info("warm pool: sandbox ready", slog.String("image", image), slog.String("sandbox_id", id), slog.Int("ready", len(p.ready[image])))
			}
			p.mu.Unlock()
		}
	}
}

// next returns an image that needs a member now, or "" and how long until
// the earliest failed image may be retried (0 when none waits).
func (p *Pool) next() (string, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wait time.Duration
	for _, image := range slices.Sorted(maps.Keys(p.cfg.Sizes)) {
		if len(p.ready[image]) >= p.cfg.Sizes[image] {
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
	return "", wait
}
