package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
)

// snapLocal is a fakeLocal that keeps snapshots (SnapshotLocal).
type snapLocal struct {
	*fakeLocal
	snaps map[string]string
}

func (s snapLocal) Snapshots(context.Context) (map[string]string, error) { return s.snaps, nil }

const (
	snapGone  = "snap-00000000000000000001"
	snapKept  = "snap-00000000000000000002"
	snapOther = "snap-00000000000000000003"
	snapNew   = "snap-00000000000000000004"
)

// TestReconcileSnapshots: at registration a node records the snapshots it
// keeps without a record, releases its records of snapshots it no longer
// keeps, and leaves another node's record alone; RecordSnapshot and
// ReleaseSnapshot write and remove its own.
func TestReconcileSnapshots(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	put := func(id, node string) {
		if _, err := cli.Put(ctx, k.snapshot(id), fmt.Sprintf(`{"node":%q,"owner":"alice"}`, node)); err != nil {
			t.Fatal(err)
		}
	}
	put(snapGone, "a")
	put(snapOther, "b")
	m := startMemberCfg(t, cli, Config{NodeID: "a", Address: "a:1", Prefix: prefix, LeaseTTL: 2 * time.Second}, snapLocal{&fakeLocal{}, map[string]string{snapKept: "alice"}})
	dir := startDirectory(t, cli, prefix)
	if _, ok, _ := dir.Snapshot(ctx, snapGone); ok {
		t.Error("the record of a snapshot the node no longer keeps stayed")
	}
	if rec, ok, _ := dir.Snapshot(ctx, snapKept); !ok || rec.Node != "a" || rec.Owner != "alice" {
		t.Errorf("record of the kept snapshot = %v, %v; want on a, owned by alice", rec, ok)
	}
	if rec, _, _ := dir.Snapshot(ctx, snapOther); rec.Node != "b" {
		t.Errorf("record of b's snapshot moved to %q", rec.Node)
	}
	if err := m.RecordSnapshot(ctx, snapNew, "bob"); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := dir.Snapshot(ctx, snapNew); !ok || rec.Node != "a" || rec.Owner != "bob" {
		t.Errorf("record of a new snapshot = %v, %v; want on a, owned by bob", rec, ok)
	}
	if err := m.RecordSnapshot(ctx, snapOther, "alice"); err == nil || !strings.Contains(err.Error(), "recorded on node b") {
		t.Errorf("RecordSnapshot of b's snapshot id: %v, want refused naming b", err)
	}
	m.ReleaseSnapshot(ctx, snapNew)
	m.ReleaseSnapshot(ctx, snapOther)
	if _, ok, _ := dir.Snapshot(ctx, snapNew); ok {
		t.Error("ReleaseSnapshot left the record")
	}
	if _, ok, _ := dir.Snapshot(ctx, snapOther); !ok {
		t.Error("ReleaseSnapshot on a removed another node's record")
	}
}

// TestRouterSnapshotNodeLost: a call naming a snapshot whose node is lost
// is UNAVAILABLE SANDBOX_UNREACHABLE naming the node for its owner and an
// admin, never run here; anyone else gets the answer for an unknown
// snapshot: here, a gateway without nodes, CLUSTER_UNAVAILABLE.
func TestRouterSnapshotNodeLost(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, keys{prefix}.snapshot(snapGone), `{"node":"gone","owner":"alice"}`); err != nil {
		t.Fatal(err)
	}
	r := NewRouter(RouterConfig{Directory: startDirectory(t, cli, prefix), Log: testLog()})
	notFound := status.Error(codes.NotFound, "snapshot not found")
	for _, tc := range []struct {
		p        auth.Principal
		wantHere bool
	}{
		{auth.Principal{Name: "alice"}, false},
		{auth.Principal{Name: "root", Admin: true}, false},
		{auth.Principal{Name: "bob"}, true},
	} {
		for method, req := range map[string]any{
			berthv1.SandboxService_DeleteSnapshot_FullMethodName: &berthv1.DeleteSnapshotRequest{SnapshotId: snapGone},
			berthv1.SandboxService_CommitSnapshot_FullMethodName: &berthv1.CommitSnapshotRequest{SnapshotId: snapGone, Reference: "x:1"},
			berthv1.SandboxService_CreateSandbox_FullMethodName:  &berthv1.CreateSandboxRequest{FromSnapshot: snapGone, Image: "x"},
		} {
			ran := false
			_, err := r.UnaryInterceptor()(auth.NewContext(ctx, tc.p), req, &grpc.UnaryServerInfo{FullMethod: method},
				func(context.Context, any) (any, error) { ran = true; return nil, notFound })
			switch {
			case tc.wantHere && rpcstatus.Reason(err) != rpcstatus.ReasonClusterUnavailable:
				t.Errorf("%s by %v: %v, want it answered by a node as for an unknown snapshot", method, tc.p, err)
			case !tc.wantHere && (ran || status.Code(err) != codes.Unavailable || rpcstatus.Reason(err) != rpcstatus.ReasonUnreachable ||
				!strings.Contains(err.Error(), "node gone, which keeps it, is lost") || lostNode(err) != "gone"):
				t.Errorf("%s by %v: ran %v, %v; want UNAVAILABLE SANDBOX_UNREACHABLE NODE_LOST naming node gone", method, tc.p, ran, err)
			}
		}
	}
}

// TestRouterRefusesVolumes: in a fleet the volume calls, and a create that
// mounts a volume, are FAILED_PRECONDITION VOLUME_UNSUPPORTED, never run
// on whichever node the call reached (a volume lives on one node).
func TestRouterRefusesVolumes(t *testing.T) {
	r := NewRouter(RouterConfig{Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	for method, req := range map[string]any{
		berthv1.SandboxService_CreateVolume_FullMethodName:  &berthv1.CreateVolumeRequest{Name: "v"},
		berthv1.SandboxService_GetVolume_FullMethodName:     &berthv1.GetVolumeRequest{Name: "v"},
		berthv1.SandboxService_ListVolumes_FullMethodName:   &berthv1.ListVolumesRequest{},
		berthv1.SandboxService_DeleteVolume_FullMethodName:  &berthv1.DeleteVolumeRequest{Name: "v"},
		berthv1.SandboxService_CreateSandbox_FullMethodName: &berthv1.CreateSandboxRequest{Volumes: []*berthv1.VolumeMount{{Name: "v", Path: "/data"}}},
	} {
		ran := false
		_, err := r.UnaryInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { ran = true; return nil, nil })
		if ran || status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeUnsupported {
			t.Errorf("%s in a fleet: ran %v, %v; want FAILED_PRECONDITION VOLUME_UNSUPPORTED without running", method, ran, err)
		}
	}
}
