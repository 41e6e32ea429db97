package cluster

import (
	"context"
	"fmt"
	"sort"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A snapshot is kept on the node of the sandbox it was taken of: that node
// records it in the directory (Member.RecordSnapshot) before
// CreateSnapshot answers, and the calls that name a snapshot go to the
// node its record names. CreateSnapshot and ForkSandbox name their
// sandbox and are routed as any call naming one (ForkSandbox's children
// are claimed on the parent's node as creates are).

// snapshotHolder returns the live node that keeps snapshot id, or local
// when this berthd answers the call itself: no node records the id, the
// id is malformed, or its node is lost and p may not see it (answered as
// unknown, word for word). A snapshot whose node is lost is UNAVAILABLE
// SANDBOX_UNREACHABLE with cause NODE_LOST, naming the node, for those
// who may see it.
func (r *Router) snapshotHolder(ctx context.Context, p auth.Principal, id string) (NodeRecord, bool, error) {
	if !runtime.ValidSnapshotID(id) {
		return NodeRecord{}, true, nil
	}
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	rec, ok, err := r.cfg.Directory.Snapshot(sctx, id)
	node, local, lost, err := r.recordHolder(ctx, sctx, p, rec, ok, err)
	if lost {
		return NodeRecord{}, false, r.snapshotLost(id, rec.Node)
	}
	return node, local, err
}

// snapshotLost is UNAVAILABLE SANDBOX_UNREACHABLE for snapshot id, whose
// node is lost: nothing ran, and a retry helps once the node registers
// again.
func (r *Router) snapshotLost(id, node string) error {
	cause := berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable,
		fmt.Sprintf("snapshot %s: node %s, which keeps it, is lost: its lease in the cluster store expired; nothing ran", id, node),
		map[string]string{"snapshot_id": id, "node_id": node, "cause": cause.String()},
		&berthv1.Unreachable{Cause: cause, NodeId: node, ServerVersion: r.cfg.Version, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
}

// snapshotCall sends DeleteSnapshot or CommitSnapshot, which name a
// snapshot in snapshot_id, to the node that keeps it.
func (r *Router) snapshotCall(ctx context.Context, p auth.Principal, method string, req proto.Message, handler grpc.UnaryHandler) (any, error) {
	id := snapshotIDOf(req)
	node, local, err := r.snapshotHolder(ctx, p, id)
	switch {
	case err != nil:
		return nil, err
	case local:
		return r.here(ctx, method, req, handler)
	}
	return r.forwardUnary(ctx, p, node, method, req, id)
}

// snapshotIDOf returns the snapshot a DeleteSnapshot or CommitSnapshot
// request names.
func snapshotIDOf(req proto.Message) string {
	switch req := req.(type) {
	case *berthv1.DeleteSnapshotRequest:
		return req.GetSnapshotId()
	case *berthv1.CommitSnapshotRequest:
		return req.GetSnapshotId()
	}
	return ""
}

// createFromSnapshot places a sandbox created from a snapshot on the node
// that keeps the snapshot, the only one that can make it: that node's
// refusal (FLEET_BUSY when it is full, NODE_NOT_ACCEPTING when it drains)
// is the answer, as is UNAVAILABLE SANDBOX_UNREACHABLE NODE_LOST, naming
// the node, when it is lost. No other node is tried.
func (r *Router) createFromSnapshot(ctx context.Context, p auth.Principal, req *berthv1.CreateSandboxRequest, handler grpc.UnaryHandler) (any, error) {
	node, local, err := r.snapshotHolder(ctx, p, req.GetFromSnapshot())
	switch {
	case err != nil:
		return nil, err
	case local:
		return r.here(ctx, berthv1.SandboxService_CreateSandbox_FullMethodName, req, handler)
	}
	return r.forwardUnary(ctx, p, node, berthv1.SandboxService_CreateSandbox_FullMethodName, req, req.GetFromSnapshot())
}

// listSnapshots asks every live node for the caller's snapshots (listAll)
// and merges them, oldest first.
func (r *Router) listSnapshots(ctx context.Context, p auth.Principal, req *berthv1.ListSnapshotsRequest, handler grpc.UnaryHandler) (any, error) {
	resps, unreachable, err := r.listAll(ctx, p, berthv1.SandboxService_ListSnapshots_FullMethodName, req, handler, r.cfg.Directory.Snapshots)
	if err != nil {
		return nil, err
	}
	out := &berthv1.ListSnapshotsResponse{UnreachableNodes: unreachable}
	for _, resp := range resps {
		resp, _ := resp.(*berthv1.ListSnapshotsResponse)
		out.Snapshots = append(out.Snapshots, resp.GetSnapshots()...)
	}
	sort.SliceStable(out.Snapshots, func(i, j int) bool {
		a, b := out.Snapshots[i], out.Snapshots[j]
		if c := a.GetCreated().AsTime().Compare(b.GetCreated().AsTime()); c != 0 {
			return c < 0
		}
		return a.GetId() < b.GetId()
	})
	return out, nil
}
