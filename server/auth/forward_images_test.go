package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// TestNodeForwardsImageWrites checks what a fleet's image fan-out needs
// of the node credential (issue 22 part 6): a node may forward an image
// pull (or import) for the principal it names, which must still be an
// admin with its own token there; the node credential alone, or with
// another principal, changes no image store.
func TestNodeForwardsImageWrites(t *testing.T) {
	f := newFixture(t)
	tok := auth.ForwardedTokenHeader
	pull := func(kv ...string) (*berthv1.Image, error) {
		c, err := client.Dial(t.Context(), f.tcpAddr, client.WithTLS(f.trustOnly(t)), client.WithToken(nodeToken),
			client.WithDialOptions(grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				return streamer(metadata.AppendToOutgoingContext(ctx, kv...), desc, cc, method, opts...)
			})))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return c.PullImage(ctx, "x")
	}
	img, err := pull(auth.ForwardedHeader, "ops", tok, adminToken)
	if want := "admin=true via=node-2 method=token metadata=0"; err != nil || img.GetName() != "ops" || img.GetDigest() != want {
		t.Errorf("PullImage forwarded for admin ops with its token = %v, %v; want ops (%s)", img, err, want)
	}
	for _, tc := range []struct {
		name string
		kv   []string
	}{
		{"as itself", nil},
		{"for root", []string{auth.ForwardedHeader, auth.RootPrincipal}},
		{"for an admin without its token", []string{auth.ForwardedHeader, "ops"}},
		{"for alice with her token", []string{auth.ForwardedHeader, "alice", tok, aliceToken}},
	} {
		if _, err := pull(tc.kv...); !isReason(err, codes.PermissionDenied, rpcstatus.ReasonNotPermitted) {
			t.Errorf("PullImage forwarded by the node credential %s = %v, want PERMISSION_DENIED %s", tc.name, err, rpcstatus.ReasonNotPermitted)
		}
	}
}
