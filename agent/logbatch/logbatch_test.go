package logbatch

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// dst records each write it gets, and signals it.
type dst struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
}

func newDst() *dst { return &dst{wrote: make(chan struct{}, 100)} }

func (d *dst) Write(p []byte) (int, error) {
	d.mu.Lock()
	d.writes = append(d.writes, string(p))
	d.mu.Unlock()
	d.wrote <- struct{}{}
	return len(p), nil
}

func (d *dst) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.writes...)
}

// TestHeldLinesGoTogether: held records are written in one write, in
// order, no sooner than Delay after the first of them, and an unheld
// record (a start or stop line) writes them first, with it.
func TestHeldLinesGoTogether(t *testing.T) {
	d := newDst()
	w := New(d)
	text := slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	held, now := slog.New(w.Handler(text, true)), slog.New(w.Handler(text, false))

	start := time.Now()
	held.Info("exec finished", "exec_id", "a")
	held.Info("exec finished", "exec_id", "b")
	if got := d.got(); len(got) != 0 {
		t.Fatalf("held lines written at once: %q", got)
	}
	select {
	case <-d.wrote:
	case <-time.After(10 * Delay):
		t.Fatalf("held lines not written %v after the first", 10*Delay)
	}
	if waited := time.Since(start); waited < Delay {
		t.Errorf("held lines written after %v, want no sooner than %v", waited, Delay)
	}
	want := "level=INFO msg=\"exec finished\" exec_id=a\nlevel=INFO msg=\"exec finished\" exec_id=b\n"
	if got := d.got(); len(got) != 1 || got[0] != want {
		t.Fatalf("writes = %q, want one: %q", got, want)
	}

	held.Info("exec finished", "exec_id", "c")
	now.Info("berth-agent stopped")
	want = "level=INFO msg=\"exec finished\" exec_id=c\nlevel=INFO msg=\"berth-agent stopped\"\n"
	if got := d.got(); len(got) != 2 || got[1] != want {
		t.Fatalf("writes = %q, want the held line and the unheld one in one write: %q", got, want)
	}

	held.Warn("exec finished", "exec_id", "d")
	if got := d.got(); len(got) != 3 || !strings.Contains(got[2], "level=WARN") {
		t.Fatalf("writes = %q, want a held warning written at once", got)
	}
}

// TestFullBufferWritten: past maxHeld bytes the Writer writes at once;
// Flush writes the rest, and nothing is lost or reordered.
func TestFullBufferWritten(t *testing.T) {
	d := newDst()
	w := New(d)
	line := []byte(strings.Repeat("x", 999) + "\n")
	var want bytes.Buffer
	for range 2 * maxHeld / len(line) {
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		want.Write(line)
	}
	if got := d.got(); len(got) != 1 || len(got[0]) < maxHeld {
		t.Fatalf("%d writes before the Flush, want one of at least %d bytes", len(got), maxHeld)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.got(), ""); got != want.String() {
		t.Errorf("wrote %d bytes in %d writes, want the %d written, in order", len(got), len(d.got()), want.Len())
	}
}
