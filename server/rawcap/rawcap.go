// Package rawcap caps the raw HTTP file streams (docs/http.md, "Files as
// raw bodies": GET and PUT of /v1/sandboxes/{id}/files/content and
// /files/archive) one principal has open at once. Each such stream holds
// a call, its goroutines and up to a few MiB of buffers in berthd for as
// long as its client keeps it open; without a cap one principal could
// open them until berthd runs out of memory.
//
// server/restgate marks the context of a raw stream's in-process call
// (Mark); the stream interceptor, which runs after authentication, counts
// marked calls by their principal and refuses one past the cap with
// RESOURCE_EXHAUSTED FLEET_BUSY, resource
// CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS. The mark is a context value,
// not metadata: a caller cannot set it, or lift it.
package rawcap

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
)

type markKey struct{}

// Mark returns ctx marking the calls made under it as one raw stream for
// sandboxID (the sandbox its refusal names).
func Mark(ctx context.Context, sandboxID string) context.Context {
	return context.WithValue(ctx, markKey{}, sandboxID)
}

// Limiter counts the marked calls open by principal.
type Limiter struct {
	max        int
	retryDelay time.Duration
	mu         sync.Mutex
	open       map[string]int // by principal name
}

// New returns a Limiter allowing each principal max marked calls at once
// (0: no cap); a refusal suggests retryDelay.
func New(max int, retryDelay time.Duration) *Limiter {
	return &Limiter{max: max, retryDelay: retryDelay, open: map[string]int{}}
}

// Open returns how many marked calls principal has open.
func (l *Limiter) Open(principal string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[principal]
}

// StreamInterceptor counts a marked call from its start to its end by the
// caller's principal (auth.FromContext: it must run after
// authentication), and refuses one past the cap with an
// *apierr.FleetBusy, turned into the call's status by toStatus (the
// error boundary's: the interceptor runs before it, so that it counts
// calls routed to another node too), before the handler runs. Unmarked
// calls pass.
func (l *Limiter) StreamInterceptor(toStatus func(context.Context, error) error) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		sandboxID, marked := ss.Context().Value(markKey{}).(string)
		if !marked || l.max <= 0 {
			return handler(srv, ss)
		}
		p, _ := auth.FromContext(ss.Context())
		release, err := l.acquire(p.Name, sandboxID)
		if err != nil {
			return toStatus(ss.Context(), err)
		}
		defer release()
		return handler(srv, ss)
	}
}

// acquire counts one more call of principal, or refuses it past the cap.
func (l *Limiter) acquire(principal, sandboxID string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.open[principal]; n >= l.max {
		return nil, &apierr.FleetBusy{SandboxID: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS,
			Limit: uint64(l.max), InUse: uint64(n), Requested: 1, RetryDelay: l.retryDelay, Principal: principal}
	}
	l.open[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[principal]--; l.open[principal] == 0 {
				delete(l.open, principal)
			}
		})
	}, nil
}
