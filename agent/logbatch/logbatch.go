// Package logbatch holds an agent's log lines for a moment and writes them
// together. The agent's stderr is a pipe that its sandbox's containerd
// shim copies into agent.log: every write wakes the shim (a Go process
// that then reads, writes the file and polls), so a line an exec cost the
// shims about 0.1 ms of CPU an exec and the agent its own write(2) in the
// concurrent benchmark (issue 23, docs/performance.md). The lines an exec
// logs go through a holding handler: a busy agent writes them once per
// Delay instead of once per exec.
package logbatch

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Delay is how long a line waits at most before it is written, unless a
// more urgent line or a full buffer writes it sooner.
const Delay = time.Second

// maxHeld is the most bytes held before they are written at once.
const maxHeld = 32 << 10

// Writer holds what is written to it for up to Delay and then writes it
// to its destination in one write. Flush writes what it holds at once.
// It is safe for concurrent use; lines keep their order. What it holds
// when the process dies without a Flush (a panic, SIGKILL) is lost.
type Writer struct {
	dst   io.Writer
	mu    sync.Mutex
	held  []byte
	timer *time.Timer // armed while held is not empty
	err   error       // the last write's failure, returned by the next Write
}

// New returns a Writer that writes to dst.
func New(dst io.Writer) *Writer {
	w := &Writer{dst: dst}
	w.timer = time.AfterFunc(time.Hour, func() { _ = w.Flush() })
	w.timer.Stop()
	return w
}

// Write holds a copy of p and returns len(p); the error is that of an
// earlier write to the destination, reported once.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.held) == 0 {
		w.timer.Reset(Delay)
	}
	w.held = append(w.held, p...)
	if len(w.held) >= maxHeld {
		w.flushLocked()
	}
	err := w.err
	w.err = nil
	return len(p), err
}

// Flush writes what the Writer holds now and returns the destination's
// error, if any.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	err := w.err
	w.err = nil
	return err
}

func (w *Writer) flushLocked() {
	w.timer.Stop()
	if len(w.held) == 0 {
		return
	}
	if _, err := w.dst.Write(w.held); err != nil {
		w.err = err
	}
	if cap(w.held) > maxHeld {
		w.held = nil // a burst's buffer is not kept
	} else {
		w.held = w.held[:0]
	}
}

// Handler returns a handler that formats with h, whose output must be w.
// With hold its records wait in w like any write; without, each record
// is written at once, with the lines held before it, as is a record of
// level slog.LevelWarn or above in either case: a warning is what one
// reads after the agent died, and a line of the agent's start or stop is
// what a reader of the log waits for.
func (w *Writer) Handler(h slog.Handler, hold bool) slog.Handler {
	return &handler{Handler: h, w: w, hold: hold}
}

type handler struct {
	slog.Handler
	w    *Writer
	hold bool
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if !h.hold || r.Level >= slog.LevelWarn {
		if ferr := h.w.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &handler{Handler: h.Handler.WithAttrs(attrs), w: h.w, hold: h.hold}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{Handler: h.Handler.WithGroup(name), w: h.w, hold: h.hold}
}
