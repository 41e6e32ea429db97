package cluster

import (
	"context"
	"testing"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRouterDeleteLost checks that a sandbox whose node is lost can be
// deleted (issue 22: it failed NODE_LOST forever): by its owner or an
// admin the record is removed and the id is free; anyone else's delete is
// answered here as for an unknown id, leaving the record; other calls
// still fail NODE_LOST, with a RetryInfo (nothing ran); and a record whose
// node holds a lease again is not removed.
func TestRouterDeleteLost(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	for id, node := range map[string]string{"lost-a": "gone", "lost-b": "gone", "back-sb": "back"} {
		if _, err := cli.Put(ctx, k.sandbox(id), `{"node":"`+node+`","owner":"alice"}`); err != nil {
			t.Fatal(err)
		}
	}
	dir := startDirectory(t, cli, prefix)
	self := startMember(t, cli, prefix, "self", &fakeLocal{holds: map[string]string{}})
	unary := NewRouter(RouterConfig{Member: self, Directory: dir, Log: testLog()}).UnaryInterceptor()
	del := &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_DeleteSandbox_FullMethodName}
	get := &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_GetSandbox_FullMethodName}
	served := 0
	here := func(context.Context, any) (any, error) {
		served++
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, "sandbox lost-a not found", nil)
	}
	as := func(name string, admin bool) context.Context {
		return auth.NewContext(ctx, auth.Principal{Name: name, Admin: admin})
	}
	recorded := func(id string) bool {
		_, ok, err := dir.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	_, err := unary(as("alice", false), &berthv1.GetSandboxRequest{SandboxId: "lost-a"}, get, here)
	if lostNode(err) != "gone" {
		t.Fatalf("GetSandbox of a lost node's sandbox = %v, want NODE_LOST naming gone", err)
	}
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	if retry.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("NODE_LOST with nothing run carries RetryInfo %v, want a positive delay", retry)
	}
	if _, err := unary(as("bob", false), &berthv1.DeleteSandboxRequest{SandboxId: "lost-a"}, del, here); status.Code(err) != codes.NotFound || served != 1 || !recorded("lost-a") {
		t.Errorf("bob's delete of alice's lost sandbox = %v (served here %d times, recorded %v), want NOT_FOUND from here, record kept", err, served, recorded("lost-a"))
	}
	if resp, err := unary(as("alice", false), &berthv1.DeleteSandboxRequest{SandboxId: "lost-a"}, del, here); err != nil || resp == nil || recorded("lost-a") {
		t.Errorf("alice's delete of her lost sandbox = %v, %v (recorded after: %v), want success and the record gone", resp, err, recorded("lost-a"))
	}
	if _, err := unary(as("ops", true), &berthv1.DeleteSandboxRequest{SandboxId: "lost-b"}, del, here); err != nil || recorded("lost-b") {
		t.Errorf("an admin's delete of a lost sandbox = %v (recorded after: %v), want success and the record gone", err, recorded("lost-b"))
	}
	// The node registered between the lookup and the removal: the record
	// stays.
	if _, err := cli.Put(ctx, k.node("back"), `{"id":"back","address":"back:1"}`); err != nil {
		t.Fatal(err)
	}
	if removed, err := dir.forgetLost(ctx, "back-sb", "back", "alice"); err != nil || removed || !recorded("back-sb") {
		t.Errorf("forgetLost of a sandbox whose node is back = %v, %v (recorded %v), want false and the record kept", removed, err, recorded("back-sb"))
	}
}
