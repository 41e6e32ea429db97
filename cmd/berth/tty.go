package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/term"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Terminal size used when berth's own output is not a terminal, as
// docker exec -t does.
const (
	defaultRows = 24
	defaultCols = 80
)

// terminal is berth's side of a -t command: the size of berth's own
// terminal, sent at the start and again on every SIGWINCH, and raw mode on
// berth's standard input while it is forwarded, so that every key (^C, ^D,
// arrows) goes to the command's terminal unchanged.
type terminal struct {
	in, out int  // berth's stdin and stdout file descriptors
	raw     bool // put in into raw mode while the command runs
	saved   *term.State
	started *berthv1.TtySize // the size the command started with
}

// newTerminal returns the terminal of a -t command whose input is forwarded
// from in when forwardIn is set.
func newTerminal(in, out *os.File, forwardIn bool) *terminal {
	t := &terminal{in: int(in.Fd()), out: int(out.Fd())}
	t.raw = forwardIn && term.IsTerminal(t.in)
	return t
}

// startSize returns the size to start the command with, and remembers it.
func (t *terminal) startSize() *berthv1.TtySize {
	t.started = t.ttySize()
	return t.started
}

// ttySize returns the size of berth's terminal (its stdout, else its stdin),
// or 24x80 when neither is a terminal or it reports no size.
func (t *terminal) ttySize() *berthv1.TtySize {
	for _, fd := range []int{t.out, t.in} {
		cols, rows, err := term.GetSize(fd)
		if err == nil && rows > 0 && cols > 0 && rows <= 65535 && cols <= 65535 {
			return &berthv1.TtySize{Rows: uint32(rows), Cols: uint32(cols)}
		}
	}
	return &berthv1.TtySize{Rows: defaultRows, Cols: defaultCols}
}

// makeRaw puts berth's terminal into raw mode when it forwards from it.
func (t *terminal) makeRaw() error {
	if !t.raw || t.saved != nil {
		return nil
	}
	st, err := term.MakeRaw(t.in)
	if err != nil {
		return fmt.Errorf("put the terminal into raw mode: %w", err)
	}
	t.saved = st
	return nil
}

// restore undoes makeRaw; it is idempotent.
func (t *terminal) restore() {
	if t.saved != nil {
		_ = term.Restore(t.in, t.saved)
		t.saved = nil
	}
}

// forwardResizes sends berth's terminal size to e on every SIGWINCH until
// the returned stop is called; stop waits for the forwarding goroutine. A
// size that changed while the command was starting is sent at once.
func (t *terminal) forwardResizes(e *client.Execution, stderr io.Writer) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	if !proto.Equal(t.ttySize(), t.started) {
		winch <- syscall.SIGWINCH
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				size := t.ttySize()
				ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
				err := e.Resize(ctx, uint16(size.GetRows()), uint16(size.GetCols()))
				cancel()
				if err != nil && !errors.Is(err, client.ErrStreamClosed) {
					fmt.Fprintf(stderr, "berth: resize the terminal of exec %s: %s\r\n", e.ID(), describe(err))
				}
			}
		}
	})
	return func() {
		signal.Stop(winch)
		close(done)
		wg.Wait()
	}
}
