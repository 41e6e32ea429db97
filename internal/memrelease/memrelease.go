// Package memrelease gives the memory a Go program took for a spike back
// to the kernel within seconds of the spike's end.
//
// The Go runtime returns freed heap pages by itself (its background
// scavenger), but only down to what its last garbage collection left as
// the heap's goal, and a program that goes idle after a spike runs no
// collection until the runtime forces one (every 2 minutes): berthd held
// some 360 MiB of RSS for minutes after 5,000 half-open connections closed
// (issue 21). A soft memory limit (GOMEMLIMIT, debug.SetMemoryLimit) does
// not help there: it bounds what the runtime keeps only near the limit.
// Run watches berthd's resident memory and, while it is above a
// threshold, collects and returns every free page (debug.FreeOSMemory)
// when goroutines ended — the end of connections and requests, which is
// how spikes in a server end — and otherwise with a backoff.
package memrelease

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// Defaults of Config.
const (
	DefaultAbove      = 64 << 20
	DefaultInterval   = time.Second
	DefaultMaxBackoff = 30 * time.Second
)

// Config configures Run. Zero fields take the defaults named.
type Config struct {
	// Above is the resident memory (RSS), in bytes, above which Run
	// returns what is free (see Usage). Default DefaultAbove.
	Above uint64
	// Interval is how often Run reads the runtime's metrics. Default
	// DefaultInterval.
	Interval time.Duration
	// MaxBackoff is the longest Run waits between two releases while RSS
	// stays above Above and no goroutines end (it is live:
	// each release costs a full collection). Default DefaultMaxBackoff.
	MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.Above == 0 {
		c.Above = DefaultAbove
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	return c
}

// Usage returns the program's resident memory (RSS, from /proc/self/statm,
// proc(5)), in bytes, and its number of goroutines (runtime/metrics).
// RSS, not what the runtime has mapped (runtime/metrics
// /memory/classes/total:bytes), is what the kernel lacks and what
// operators watch: berthd holding 5,000 connections had 1.5 GB mapped, most
// of it buffers allocated and never written, at an RSS of 243 MiB. Without
// /proc it counts the runtime's mapped memory less what it released.
func Usage() (rss uint64, goroutines uint64) {
	s := []metrics.Sample{
		{Name: "/sched/goroutines:goroutines"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	metrics.Read(s)
	goroutines = s[0].Value.Uint64()
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				return pages * uint64(os.Getpagesize()), goroutines
			}
		}
	}
	return s[1].Value.Uint64() - s[2].Value.Uint64(), goroutines
}

// Run releases memory as the package comment says until ctx ends. Each
// tick in which RSS is above Above it releases when a
// quarter or more of the goroutines counted at the last release have
// ended, or when the backoff has passed: Interval after a release that got
// under Above, doubling up to MaxBackoff after one that did not.
func Run(ctx context.Context, cfg Config, log *slog.Logger) {
	cfg = cfg.withDefaults()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	backoff := cfg.Interval
	var last time.Time
	_, lastG := Usage()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rss, g := Usage()
		if rss <= cfg.Above {
			backoff, lastG = cfg.Interval, g
			continue
		}
		if g > lastG*3/4 && time.Since(last) < backoff {
			continue
		}
		start := time.Now()
		debug.FreeOSMemory()
		after, _ := Usage()
		last, lastG = time.Now(), g
		if after > cfg.Above {
			backoff = min(2*backoff, cfg.MaxBackoff)
		} else {
			backoff = cfg.Interval
		}
		log.Debug("returned free memory to the kernel", slog.Uint64("rss_bytes", rss), slog.Uint64("after_bytes", after),
			slog.Uint64("goroutines", g), slog.Duration("took", time.Since(start)), slog.Duration("next_within", backoff))
	}
}
