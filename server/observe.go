package server

import (
	"time"
)

// Observer receives what berthd's handlers count; *metrics.Metrics
// implements it for Prometheus. Its methods must be cheap and must not
// block: they run on the request paths, output events included.
type Observer interface {
	// SandboxCreated: a create that made a new sandbox (warm false) or
	// handed out a warm-pool member (warm true) answered after took.
	SandboxCreated(warm bool, took time.Duration)
	// ExecStarted: a new exec started (its ExecStarted came back).
	ExecStarted()
	// ExecEnded: an exec this berthd started ended; outcome is one of
	// metrics.Outcome*. Called once per ExecStarted.
	ExecEnded(outcome string)
	// OutputSent: n bytes of stream ("stdout", "stderr") went to a caller.
	OutputSent(stream string, n int)
	// OutputDropped: a caller was told n output bytes were lost.
	OutputDropped(n uint64)
	// FileBytes: n bytes of file content moved "in" or "out" of a sandbox.
	FileBytes(direction string, n int)
	// FileReadDirect: a ReadFile was served from the descriptor the
	// sandbox's agent opened (a runc sandbox), not through its stream.
	FileReadDirect()
	// AgentRestarted: berthd started a new task for a sandbox whose agent
	// died.
	AgentRestarted()
}

// noObserver is the Observer of a Service configured without one.
type noObserver struct{}

func (noObserver) SandboxCreated(bool, time.Duration) {}
func (noObserver) ExecStarted()                       {}
func (noObserver) ExecEnded(string)                   {}
func (noObserver) OutputSent(string, int)             {}
func (noObserver) OutputDropped(uint64)               {}
func (noObserver) FileBytes(string, int)              {}
func (noObserver) FileReadDirect()                    {}
func (noObserver) AgentRestarted()                    {}
