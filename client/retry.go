package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// RetryPolicy makes a Client retry the calls that failed with a condition
// that is safe to retry: a *FleetBusyError after the delay berthd gives, and
// an *UnreachableError whose call ran nothing, with jittered exponential
// backoff, as is a *DependencyError for containerd not answering that
// changed nothing and a fleet's CLUSTER_UNAVAILABLE (its etcd did not
// answer), waiting at least the delay berthd gives. *RuntimeReplacedError and *StaleHandleError are never
// retried, nor is anything else. Retries end when the call's context ends or
// MaxAttempts is reached; the last error is returned.
//
// Retried calls: CreateSandbox, GetSandbox, DeleteSandbox, PauseSandbox,
// ResumeSandbox, HibernateSandbox (all three idempotent), ForkSandbox with
// a request id, each page of ListSandboxes, Run, ListImages, and the
// opening of Exec and Attach (until berthd says the process runs; an
// Execution is never re-opened); the Sandbox methods over them too. Not
// ImportImage, whose reader cannot be read again, nor CreateSnapshot or a
// ForkSandbox without a request id (each call makes new ones).
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included.
	// Default 10.
	MaxAttempts int
	// InitialBackoff is the backoff before the first retry after an
	// *UnreachableError; it doubles with each retry up to MaxBackoff, and
	// each wait is drawn at random between half of it and all of it.
	// Default 100 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the backoff. Default 5 s.
	MaxBackoff time.Duration
	// MaxBusyDelay caps the wait after a *FleetBusyError (and the delay
	// of a CLUSTER_UNAVAILABLE), whatever delay berthd suggests. Default 30 s.
	MaxBusyDelay time.Duration
	// OnRetry, when set, is called before each wait with the attempt that
	// failed (1 for the first), its error and the wait, on the calling
	// goroutine: for logs and metrics.
	OnRetry func(attempt int, err error, wait time.Duration)
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 10
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = 5 * time.Second
	}
	if p.MaxBusyDelay <= 0 {
		p.MaxBusyDelay = 30 * time.Second
	}
	return p
}

// WithRetry makes the Client retry safe-to-retry failures under p. Without
// it a Client never retries.
func WithRetry(p RetryPolicy) Option {
	return func(c *dialConfig) {
		p := p.withDefaults()
		c.retry = &p
	}
}

// retry runs call, which returns a converted error, until it succeeds, fails
// with something not to retry, the attempts run out, or ctx ends.
func (c *Client) retry(ctx context.Context, call func() error) error {
	err := call()
	p := c.retryPolicy
	if p == nil {
		return err
	}
	backoff := p.InitialBackoff
	for attempt := 1; err != nil && attempt < p.MaxAttempts; attempt++ {
		if !IsRetryable(err) {
			return err
		}
		var wait time.Duration
		if busy := (*FleetBusyError)(nil); errors.As(err, &busy) {
			// At least berthd's delay, plus up to a fifth more so that
			// callers turned away together do not return together.
			d := min(busy.Delay(), p.MaxBusyDelay)
			wait = d + rand.N(d/5+1)
		} else {
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, p.MaxBackoff)
			// A fleet whose etcd does not answer says when to come back
			// (RetryInfo): no sooner, as for FLEET_BUSY.
			if e := (*Error)(nil); errors.As(err, &e) && e.Reason == ReasonClusterUnavailable {
				wait = max(wait, min(e.RetryDelay, p.MaxBusyDelay))
			}
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err // the wait would outlast the call
		}
		if p.OnRetry != nil {
			p.OnRetry(attempt, err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		err = call()
	}
	return err
}
