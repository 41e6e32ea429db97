package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRemoveNode checks RemoveNode (issue 22): a node holding a lease is
// refused NODE_LIVE, dry run or not; a lost node's dry run names its
// sandboxes and removes nothing; the removal drops its records (in
// batches past etcd's transaction size), its drain mark and its listing,
// and leaves other nodes' records alone; an unknown node is NODE_NOT_FOUND.
func TestRemoveNode(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	nodes := NewNodeService(NewEtcdStore(cli), prefix)
	a := startMember(t, cli, prefix, "a", &fakeLocal{holds: map[string]string{"s1": "alice", "s2": "bob"}})
	startMember(t, cli, prefix, "b", &fakeLocal{holds: map[string]string{"s3": "alice"}})
	if _, err := nodes.DrainNode(ctx, &berthv1.DrainNodeRequest{NodeId: "a"}); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		if _, err := nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: "a", DryRun: dry}); rpcstatus.Reason(err) != rpcstatus.ReasonNodeLive || !strings.Contains(err.Error(), "stop its berthd first") {
			t.Errorf("RemoveNode of live node a (dry run %v) = %v, want NODE_LIVE", dry, err)
		}
	}
	a.Close()
	// a's snapshot records go with it; b's stay.
	for id, node := range map[string]string{snapGone: "a", snapKept: "b"} {
		if _, err := cli.Put(ctx, keys{prefix}.snapshot(id), fmt.Sprintf(`{"node":%q,"owner":"alice"}`, node)); err != nil {
			t.Fatal(err)
		}
	}
	// A pending delete of one of a's sandboxes (a tombstone) goes with a.
	if _, err := cli.Put(ctx, keys{prefix}.tombstone("a", "s0"), `{"revision":1}`); err != nil {
		t.Fatal(err)
	}
	// c never registered: only its 150 records (more than one
	// transaction's worth) make it known.
	var cIDs []string
	for i := range 150 {
		id := fmt.Sprintf("c-%03d", i)
		body, _ := json.Marshal(SandboxRecord{Node: "c", Owner: "alice"})
		if _, err := cli.Put(ctx, keys{prefix}.sandbox(id), string(body)); err != nil {
			t.Fatal(err)
		}
		cIDs = append(cIDs, id)
	}
	dry, err := nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: "a", DryRun: true})
	if err != nil || !dry.GetDryRun() || strings.Join(dry.GetSandboxIds(), ",") != "s1,s2" {
		t.Fatalf("dry run of lost node a = %v, %v; want s1,s2", dry, err)
	}
	if got := listed(t, nodes)["a"]; got == nil || got.GetPlacedSandboxes() != 2 || got.GetState() != berthv1.NodeState_NODE_STATE_LOST {
		t.Fatalf("after the dry run node a is listed as %v, want lost with 2 sandboxes", got)
	}
	resp, err := nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: "a"})
	if err != nil || resp.GetDryRun() || strings.Join(resp.GetSandboxIds(), ",") != "s1,s2" {
		t.Fatalf("RemoveNode a = %v, %v; want s1,s2 removed", resp, err)
	}
	resp, err = nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: "c"})
	if err != nil || !slices.Equal(resp.GetSandboxIds(), cIDs) {
		t.Fatalf("RemoveNode c = %d ids, %v; want its 150", len(resp.GetSandboxIds()), err)
	}
	all, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, kv := range all.Kvs {
		if k := strings.TrimPrefix(string(kv.Key), prefix); !strings.HasSuffix(k, "/b") {
			left = append(left, k)
		}
	}
	if want := "sandboxes/s3,snapshots/" + snapKept; strings.Join(left, ",") != want {
		t.Errorf("keys left besides node b's own: %v, want only %s", left, want)
	}
	if l := listed(t, nodes); l["a"] != nil || l["c"] != nil || l["b"] == nil {
		t.Errorf("listed after the removals: %v, want b only", l)
	}
	if _, err := nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: "a"}); rpcstatus.Reason(err) != rpcstatus.ReasonNodeNotFound {
		t.Errorf("second RemoveNode a = %v, want NODE_NOT_FOUND", err)
	}
}

// TestConflictsListed checks that a node's ownership conflicts reach its
// listing (Node.conflicting_sandbox_ids).
func TestConflictsListed(t *testing.T) {
	cli, prefix := etcd(t)
	nodes := NewNodeService(NewEtcdStore(cli), prefix)
	startMember(t, cli, prefix, "a", &fakeLocal{holds: map[string]string{"x1": "alice", "x2": "alice"}})
	startMember(t, cli, prefix, "b", &fakeLocal{holds: map[string]string{"x2": "alice", "x3": "alice"}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := listed(t, nodes)
		got := fmt.Sprint(l["a"].GetConflictingSandboxIds(), l["b"].GetConflictingSandboxIds())
		if got == "[] [x2]" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("conflicts listed for a and b: %s, want [] [x2]", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func listed(t *testing.T, s *NodeService) map[string]*berthv1.Node {
	t.Helper()
	resp, err := s.ListNodes(context.Background(), &berthv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*berthv1.Node)
	for _, n := range resp.GetNodes() {
		out[n.GetId()] = n
	}
	return out
}
