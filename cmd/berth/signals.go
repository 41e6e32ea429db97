package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// giveUpAfterSignals is how many SIGINT/SIGTERM berth forwards to a running
// command; at the next one it stops waiting for the command.
const giveUpAfterSignals = 2

// signalTimeout bounds forwarding one signal.
const signalTimeout = 5 * time.Second

// signalRelay owns berth's handling of SIGINT, SIGTERM and SIGHUP: while a
// command runs SIGINT and SIGTERM are forwarded to it; at other times (while
// starting it, or once berth gave up on it) they cancel the current step
// through cancel. SIGHUP always cancels: berth's terminal is gone.
type signalRelay struct {
	cancel context.CancelFunc
	stderr io.Writer
	sigs   chan os.Signal
	stop   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	target    *client.Execution
	forwarded int
	last      os.Signal // the last signal that canceled instead of being forwarded
}

func startSignalRelay(cancel context.CancelFunc, stderr io.Writer) *signalRelay {
	r := &signalRelay{cancel: cancel, stderr: stderr, sigs: make(chan os.Signal, 4), stop: make(chan struct{})}
	signal.Notify(r.sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	r.wg.Go(r.loop)
	return r
}

// setTarget starts (e != nil) or ends forwarding to e.
func (r *signalRelay) setTarget(e *client.Execution) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = e
}

// canceledBy returns the signal that canceled a step, or nil.
func (r *signalRelay) canceledBy() os.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// close stops handling signals and waits for the relay's goroutine.
func (r *signalRelay) close() {
	signal.Stop(r.sigs)
	close(r.stop)
	r.wg.Wait()
}

func (r *signalRelay) loop() {
	for {
		select {
		case <-r.stop:
			return
		case s := <-r.sigs:
			r.handle(s)
		}
	}
}

func (r *signalRelay) handle(s os.Signal) {
	if s == syscall.SIGHUP {
		// berth's terminal is gone: stop following (the stream ends; a -t
		// command is hung up by berthd unless --detach-on-hangup), and let
		// berth clean up (berth run deletes its sandbox) and exit 129.
		r.mu.Lock()
		r.last, r.target = s, nil
		r.mu.Unlock()
		r.cancel()
		return
	}
	r.mu.Lock()
	e := r.target
	giveUp := e != nil && r.forwarded >= giveUpAfterSignals
	if e == nil || giveUp {
		r.last = s
		r.target = nil
	} else {
		r.forwarded++
	}
	r.mu.Unlock()
	if e == nil || giveUp {
		if giveUp {
			fmt.Fprintf(r.stderr, "berth: %v again: no longer waiting for exec %s (it may still run)\n", s, e.ID())
		}
		r.cancel()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
	defer cancel()
	if err := e.Signal(ctx, signalName(s)); err != nil {
		fmt.Fprintf(r.stderr, "berth: forward %v to exec %s: %s\n", s, e.ID(), describe(err))
	}
}

// signalName is the name ExecSignal takes for s.
func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGTERM:
		return "TERM"
	}
	if n, ok := s.(syscall.Signal); ok {
		return fmt.Sprint(int(n))
	}
	return s.String()
}

// signalExit is the exit status of a process killed by s, 128+N.
func signalExit(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return exitBerth
}
