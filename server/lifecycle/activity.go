package lifecycle

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/server/auth"
)

// Every request that names a sandbox is activity in it for as long as it
// lasts (SPEC.md section 2: idle means no exec running and no request). The
// interceptors below find the sandbox id in the request itself — a
// top-level sandbox_id field or one in a message field one level down, such
// as ExecRequest.start — so that every service's RPCs count without each
// handler having to report it.

// ActivityUnary counts a unary request naming a sandbox as activity while
// its handler runs.
func (m *Manager) ActivityUnary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if msg, ok := req.(proto.Message); ok {
			if id := sandboxid.Of(msg.ProtoReflect(), 1); id != "" {
				defer m.beginActivity(ctx, id)()
			}
		}
		return handler(ctx, req)
	}
}

// ActivityStream counts a stream as activity in the sandbox its first
// message naming one names, from that message until the handler returns.
func (m *Manager) ActivityStream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		w := &activityStream{ServerStream: ss, m: m}
		defer w.end()
		return handler(srv, w)
	}
}

type activityStream struct {
	grpc.ServerStream
	m *Manager
	// mu guards ended: a handler may receive on another goroutine than
	// the one that returns.
	mu    sync.Mutex
	ended func() // set once a message named a sandbox
}

func (w *activityStream) RecvMsg(m any) error {
	err := w.ServerStream.RecvMsg(m)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended == nil {
		if pm, ok := m.(proto.Message); ok {
			if id := sandboxid.Of(pm.ProtoReflect(), 1); id != "" {
				w.ended = w.m.beginActivity(w.ServerStream.Context(), id)
			}
		}
	}
	return nil
}

func (w *activityStream) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended != nil {
		w.ended()
	}
}

// beginActivity counts a request naming sandbox id as activity in it until
// the returned function is called — unless the sandbox is another
// principal's: requests that get NOT_FOUND must not keep it from idling
// out. Whose it is comes from the owner berthd verified for its live
// runtime (at its creation, or a request's reach); until one is, the
// request counts.
func (m *Manager) beginActivity(ctx context.Context, id string) (end func()) {
	if last, ok := m.ids.Live(id); ok {
		if owner, known := m.ids.OwnerOf(id, last.BootID); known && !auth.Sees(ctx, owner) {
			return func() {}
		}
	}
	return m.reaper.Begin(id)
}
