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
// every few seconds, and at once when goroutines end — the end of
// connections and requests, which is how spikes in a server end — never
// spending more than a tenth of one CPU on it.
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
	DefaultAbove    = 64 << 20
	DefaultInterval = time.Second
	DefaultPause    = 2 * time.Second
)

// cpuShare bounds the time releases take: after one that took d, the next
// waits at least d/cpuShare (a full collection of a large live heap can
// take half a second on a busy host): a tenth of one CPU at most.
const cpuShare = 0.1

// Config configures Run. Zero fields take the defaults named.
type Config struct {
	// Above is the resident memory (RSS), in bytes, above which Run
	// returns what is free (see Usage). Default DefaultAbove.
	Above uint64
	// Interval is how often Run reads RSS and the goroutine count, and
	// the least time between two releases. Default DefaultInterval.
	Interval time.Duration
	// Pause is the time after a release that returned less than an
	// eighth of RSS (what is held is live: a spike still going on, or a
	// large working set) before the next, unless goroutines end. It is
	// how long, at most, memory freed without goroutines ending (a Run's
	// output buffer) stays with berthd. Default DefaultPause.
	Pause time.Duration
}

func (c Config) withDefaults() Config {
	if c.Above == 0 {
		c.Above = DefaultAbove
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Pause <= 0 {
		c.Pause = DefaultPause
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

// Run releases memory as the package comment says until ctx ends. At each
// Interval while RSS is above Above it releases when a quarter or more of
// the goroutines counted at the last release have ended, or when the wait
// after the last release has passed: Interval after one that returned an
// eighth of RSS or more, Pause after one that returned less, and never
// less than the last release took divided by cpuShare.
func Run(ctx context.Context, cfg Config, log *slog.Logger) {
	cfg = cfg.withDefaults()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	var (
		last     time.Time
		wait     time.Duration
		_, lastG = Usage()
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rss, g := Usage()
		if rss <= cfg.Above {
			lastG = g
			continue
		}
		since := time.Since(last)
		ended := g <= lastG*3/4
		if since < wait && !(ended && since >= cfg.Interval) {
			continue
		}
		start := time.Now()
		debug.FreeOSMemory()
		took := time.Since(start)
		after, _ := Usage()
		last, lastG = time.Now(), g
		wait = cfg.Interval
		if after > rss-rss/8 {
			wait = cfg.Pause
		}
		wait = max(wait, time.Duration(float64(took)/cpuShare))
		log.Debug("returned free memory to the kernel", slog.Uint64("rss_bytes", rss), slog.Uint64("after_bytes", after),
			slog.Uint64("goroutines", g), slog.Duration("took", took), slog.Duration("next_within", wait))
	}
}
