package cluster

import (
	"context"
	"slices"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// TestDeleteLostSticks checks that the delete of a lost node's sandbox is
// honoured when the node returns (issue 22: the node recorded the sandbox
// again as its own): the delete leaves a tombstone naming the node, and
// the node, registering again, deletes that sandbox locally, records the
// rest again and removes the tombstone; a tombstone of a sandbox the node
// no longer holds is removed too.
func TestDeleteLostSticks(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	local := &fakeLocal{holds: map[string]string{"deleted": "alice", "kept": "alice"}}
	a := startMember(t, cli, prefix, "a", local)
	a.Close() // its lease revoked: a is lost, its sandboxes keep running

	dir := startDirectory(t, cli, prefix)
	self := startMember(t, cli, prefix, "self", &fakeLocal{holds: map[string]string{}})
	unary := NewRouter(RouterConfig{Member: self, Directory: dir, Log: testLog()}).UnaryInterceptor()
	del := &grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_DeleteSandbox_FullMethodName}
	here := func(context.Context, any) (any, error) {
		t.Fatal("the delete of a lost node's sandbox was served here")
		return nil, nil
	}
	alice := auth.NewContext(ctx, auth.Principal{Name: "alice"})
	if _, err := unary(alice, &berthv1.DeleteSandboxRequest{SandboxId: "deleted"}, del, here); err != nil {
		t.Fatalf("alice's delete of her sandbox on the lost node a = %v", err)
	}
	if _, ok, _ := dir.Sandbox(ctx, "deleted"); ok {
		t.Fatal("the record of the deleted sandbox stayed")
	}
	tomb := func(id string) bool {
		resp, err := cli.Get(ctx, k.tombstone("a", id))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	if !tomb("deleted") {
		t.Fatal("the delete left no tombstone for node a")
	}
	// A tombstone of a sandbox a no longer holds (gone with its host).
	if _, err := cli.Put(ctx, k.tombstone("a", "vanished"), `{"revision":1}`); err != nil {
		t.Fatal(err)
	}

	// a comes back with both sandboxes still running.
	back := startMember(t, cli, prefix, "a", local)
	if got := local.removedIDs(); !slices.Equal(got, []string{"deleted"}) {
		t.Errorf("sandboxes a deleted when it registered again = %v, want [deleted]", got)
	}
	if _, ok, _ := dir.Sandbox(ctx, "deleted"); ok || back.Holds("deleted") {
		t.Errorf("the deleted sandbox is recorded again (held %v)", back.Holds("deleted"))
	}
	if rec, ok, _ := dir.Sandbox(ctx, "kept"); !ok || rec.Node != "a" || !back.Holds("kept") {
		t.Errorf("record of kept = %+v, %v; want recorded on a again", rec, ok)
	}
	if tomb("deleted") || tomb("vanished") {
		t.Errorf("tombstones left after a registered again: deleted %v, vanished %v", tomb("deleted"), tomb("vanished"))
	}
	if len(back.Conflicts()) != 0 {
		t.Errorf("conflicts = %v, want none", back.Conflicts())
	}
}

// TestTombstoneKeptWhenDeleteFails checks that a node that cannot delete a
// sandbox its tombstone names keeps the tombstone (for its next
// registration) and does not record the sandbox again.
func TestTombstoneKeptWhenDeleteFails(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	if _, err := cli.Put(ctx, k.tombstone("a", "stuck"), `{"revision":1}`); err != nil {
		t.Fatal(err)
	}
	local := &fakeLocal{holds: map[string]string{"stuck": "alice"}, removeErr: context.DeadlineExceeded}
	m := startMember(t, cli, prefix, "a", local)
	dir := startDirectory(t, cli, prefix)
	if _, ok, _ := dir.Sandbox(ctx, "stuck"); ok || m.Holds("stuck") {
		t.Error("a sandbox whose delete is pending was recorded again")
	}
	resp, err := cli.Get(ctx, k.tombstone("a", "stuck"), clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Errorf("tombstone of stuck = %v, %v; want kept", resp, err)
	}
}
