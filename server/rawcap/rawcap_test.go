package rawcap

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
)

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s stream) Context() context.Context { return s.ctx }

// TestStreamInterceptor counts marked calls by principal: past the cap a
// FleetBusy naming the principal and sandbox, another principal and
// unmarked calls not counted, and a call's end frees its place.
func TestStreamInterceptor(t *testing.T) {
	l := New(1, 2*time.Second)
	icpt := l.StreamInterceptor(func(_ context.Context, err error) error { return err })
	call := func(ctx context.Context, during func()) error {
		return icpt(nil, stream{ctx: ctx}, &grpc.StreamServerInfo{}, func(any, grpc.ServerStream) error {
			if during != nil {
				during()
			}
			return nil
		})
	}
	alice := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	bob := auth.NewContext(context.Background(), auth.Principal{Name: "bob"})
	var inner, other, plain error
	outer := call(Mark(alice, "sb1"), func() {
		inner = call(Mark(alice, "sb2"), nil)
		other = call(Mark(bob, "sb2"), nil)
		plain = call(alice, nil)
	})
	if outer != nil || other != nil || plain != nil {
		t.Errorf("first call %v, another principal's %v, an unmarked one %v; want nil", outer, other, plain)
	}
	var busy *apierr.FleetBusy
	if !errors.As(inner, &busy) || busy.Resource != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS ||
		busy.Principal != "alice" || busy.SandboxID != "sb2" || busy.Limit != 1 || busy.InUse != 1 || busy.Delay() != 2*time.Second {
		t.Errorf("second marked call of alice = %#v, want FleetBusy PRINCIPAL_RAW_STREAMS alice sb2 1/1 retry 2s", inner)
	}
	if n := l.Open("alice"); n != 0 {
		t.Errorf("Open(alice) after its calls ended = %d, want 0", n)
	}
	if err := call(Mark(alice, "sb1"), nil); err != nil {
		t.Errorf("a marked call after the first ended = %v, want nil", err)
	}
}
