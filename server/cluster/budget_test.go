package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestRouterEtcdBudget: with the fleet's etcd stopped, a call routed by a
// berthd that does not hold its sandbox — unary or streaming, a create
// naming its id or one to be placed, with a deadline or none — fails
// UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo within the etcd budget
// (plus a margin for loaded test machines), instead of waiting for etcd
// until the caller's deadline (issue 22: DEADLINE_EXCEEDED with no reason,
// or 27 s for an exec without a deadline).
func TestRouterEtcdBudget(t *testing.T) {
	dir, err := os.MkdirTemp("", "berth-etcd-budget")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := StartEmbedded(ctx, EmbedConfig{Dir: dir, ClientURL: freeURL(t), PeerURL: freeURL(t)}, testLog())
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			e.Close()
		}
	})
	cli, err := Connect(ctx, StoreConfig{Endpoints: e.Endpoints()}, testLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	prefix := "/budget/"
	if _, err := cli.Put(ctx, keys{prefix}.sandbox("sb-far"), `{"node":"far","owner":"alice"}`); err != nil {
		t.Fatal(err)
	}
	directory := startDirectory(t, cli, prefix)
	const budget = time.Second
	r := NewRouter(RouterConfig{Directory: directory, EtcdBudget: budget, Log: testLog()})
	e.Close()
	closed = true

	unary := r.UnaryInterceptor()
	stream := r.StreamInterceptor()
	alice := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	notHere := func(context.Context, any) (any, error) {
		t.Error("a call was served here while the store did not answer")
		return nil, nil
	}
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		call     func(ctx context.Context) error
	}{
		{"GetSandbox", 10 * time.Second, func(ctx context.Context) error {
			_, err := unary(ctx, &berthv1.GetSandboxRequest{SandboxId: "sb-far"}, &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_GetSandbox_FullMethodName}, notHere)
			return err
		}},
		{"GetSandbox without deadline", 0, func(ctx context.Context) error {
			_, err := unary(ctx, &berthv1.GetSandboxRequest{SandboxId: "sb-far"}, &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_GetSandbox_FullMethodName}, notHere)
			return err
		}},
		{"Exec without deadline", 0, func(ctx context.Context) error {
			ss := &firstOnlyStream{ctx: ctx, first: &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: "sb-far"}}}}
			return stream(nil, ss, &grpc.StreamServerInfo{FullMethod: berthv1.SandboxService_Exec_FullMethodName, IsClientStream: true, IsServerStream: true}, func(any, grpc.ServerStream) error {
				t.Error("an exec was served here while the store did not answer")
				return nil
			})
		}},
		{"CreateSandbox with id", 10 * time.Second, func(ctx context.Context) error {
			_, err := unary(ctx, &berthv1.CreateSandboxRequest{SandboxId: "sb-new", Image: "img"}, &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_CreateSandbox_FullMethodName}, notHere)
			return err
		}},
		{"CreateSandbox placed", 0, func(ctx context.Context) error {
			_, err := unary(ctx, &berthv1.CreateSandboxRequest{Image: "img"}, &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_CreateSandbox_FullMethodName}, notHere)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := alice
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			} else {
				// A call with no deadline must not hang: bound the test
				// itself, far above what is asserted.
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				timer := time.AfterFunc(10*time.Second, cancel)
				defer timer.Stop()
				defer cancel()
			}
			start := time.Now()
			err := tc.call(ctx)
			took := time.Since(start)
			if max := budget + 1500*time.Millisecond; took > max {
				t.Errorf("answered after %v, want within the %v budget (%v with margin)", took, budget, max)
			}
			if status.Code(err) != codes.Unavailable || rpcstatus.Reason(err) != rpcstatus.ReasonClusterUnavailable {
				t.Fatalf("err = %v, want UNAVAILABLE CLUSTER_UNAVAILABLE", err)
			}
			var retry *errdetails.RetryInfo
			for _, d := range status.Convert(err).Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					retry = ri
				}
			}
			if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
				t.Errorf("err = %v: RetryInfo %v, want one with a positive delay", err, retry)
			}
		})
	}
}

// firstOnlyStream is a caller's stream that sends first and then waits
// for the call to end.
type firstOnlyStream struct {
	ctx   context.Context
	first *berthv1.ExecRequest
	sent  bool
}

func (s *firstOnlyStream) Context() context.Context     { return s.ctx }
func (s *firstOnlyStream) SetHeader(metadata.MD) error  { return nil }
func (s *firstOnlyStream) SendHeader(metadata.MD) error { return nil }
func (s *firstOnlyStream) SetTrailer(metadata.MD)       {}
func (s *firstOnlyStream) SendMsg(any) error            { return nil }
func (s *firstOnlyStream) RecvMsg(m any) error {
	if s.sent {
		<-s.ctx.Done()
		return s.ctx.Err()
	}
	s.sent = true
	dst := m.(*berthv1.ExecRequest)
	dst.Event = s.first.Event
	return nil
}
