package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// NodeService implements berth.v1.NodeService from the fleet's store;
// any node or gateway of the fleet serves it. auth.AdminOnly keeps it for
// admins.
type NodeService struct {
	berthv1.UnimplementedNodeServiceServer
	store Store
	keys  keys
	// budget bounds each call's etcd calls (WithEtcdBudget).
	budget time.Duration
}

var _ berthv1.NodeServiceServer = (*NodeService)(nil)

// NewNodeService returns the NodeService of the fleet under prefix ("" for
// DefaultPrefix) in st (NewEtcdStore).
func NewNodeService(st Store, prefix string) *NodeService {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &NodeService{store: st, keys: keys{prefix}, budget: DefaultEtcdBudget}
}

// WithEtcdBudget bounds how long each call waits for etcd (default DefaultEtcdBudget):
// past it the call fails UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo,
// whatever the caller's deadline. It returns s.
func (s *NodeService) WithEtcdBudget(d time.Duration) *NodeService {
	if d > 0 {
		s.budget = d
	}
	return s
}

// ListNodes lists live nodes with their leases' remaining time and health,
// and lost nodes that were seen or still hold sandbox records.
func (s *NodeService) ListNodes(ctx context.Context, _ *berthv1.ListNodesRequest) (*berthv1.ListNodesResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	nodes, err := s.nodes(sctx)
	if err != nil {
		return nil, storeFailed(ctx, s.budget, err)
	}
	out := &berthv1.ListNodesResponse{}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, n)
	}
	sort.Slice(out.Nodes, func(i, j int) bool { return out.Nodes[i].GetId() < out.Nodes[j].GetId() })
	return out, nil
}

// DrainNode marks the node as draining.
func (s *NodeService) DrainNode(ctx context.Context, req *berthv1.DrainNodeRequest) (*berthv1.DrainNodeResponse, error) {
	n, err := s.setDrain(ctx, req.GetNodeId(), true)
	if err != nil {
		return nil, storeFailed(ctx, s.budget, err)
	}
	return &berthv1.DrainNodeResponse{Node: n}, nil
}

// UndrainNode removes the node's drain mark.
func (s *NodeService) UndrainNode(ctx context.Context, req *berthv1.UndrainNodeRequest) (*berthv1.UndrainNodeResponse, error) {
	n, err := s.setDrain(ctx, req.GetNodeId(), false)
	if err != nil {
		return nil, storeFailed(ctx, s.budget, err)
	}
	return &berthv1.UndrainNodeResponse{Node: n}, nil
}

func (s *NodeService) setDrain(ctx context.Context, id string, drain bool) (*berthv1.Node, error) {
	if id == "" {
		return nil, rpcstatus.InvalidArgument("node_id", "is empty")
	}
	ctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	seen := s.keys.seen(id)
	op := del(s.keys.drain(id))
	if drain {
		op = put(s.keys.drain(id), []byte(time.Now().UTC().Format(time.RFC3339)))
	}
	// Only a node the fleet saw: a typo must not leave a mark that waits
	// for a node of that name.
	set, _, err := s.store.Commit(ctx, []Fence{present(seen)}, []Op{op})
	if err != nil {
		return nil, storeError("set the drain mark of node "+id, err)
	}
	if !set {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonNodeNotFound, fmt.Sprintf("node %s: the fleet never saw a node of that id", id), map[string]string{"node_id": id})
	}
	nodes, err := s.nodes(ctx)
	if err != nil {
		return nil, err
	}
	return nodes[id], nil
}

// RemoveNode forgets a lost node and the records of its sandboxes (see
// berth.v1.NodeService.RemoveNode), through Store.RemoveNode: it deletes
// only while the node holds no lease (its record is absent) and only
// records that are unchanged since they were read; the node's tombstones
// (deletes of its sandboxes asked for while it was lost) go with the last
// records, so a node removed and then started again records every sandbox
// it still runs; a node registering meanwhile makes the call fail
// NODE_CHANGED with nothing more removed. The store may delete in several
// steps (etcd: batches of removeBatch), the node's own keys with the last
// one: a call that fails midway leaves the node listed, and is repeated.
// The whole call waits at most the etcd budget (WithEtcdBudget); past it
// it fails CLUSTER_UNAVAILABLE with RetryInfo.
func (s *NodeService) RemoveNode(ctx context.Context, req *berthv1.RemoveNodeRequest) (*berthv1.RemoveNodeResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	out, err := s.removeNode(sctx, req)
	if err != nil {
		return nil, storeFailed(ctx, s.budget, err)
	}
	return out, nil
}

func (s *NodeService) removeNode(ctx context.Context, req *berthv1.RemoveNodeRequest) (*berthv1.RemoveNodeResponse, error) {
	id := req.GetNodeId()
	if id == "" {
		return nil, rpcstatus.InvalidArgument("node_id", "is empty")
	}
	nodeKey, seenKey, drainKey := s.keys.node(id), s.keys.seen(id), s.keys.drain(id)
	_, found, err := s.store.Read(ctx, keyRange(nodeKey), keyRange(seenKey), keyRange(drainKey),
		prefixRange(s.keys.sandboxes()), prefixRange(s.keys.snapshots()))
	if err != nil {
		return nil, storeError("read node "+id+" and its sandboxes", err)
	}
	if len(found[0]) > 0 {
		return nil, nodeLive(id)
	}
	type record struct {
		id  string
		rev int64
	}
	var recs []record
	for _, kv := range found[3] {
		var rec SandboxRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Node == id {
			recs = append(recs, record{s.keys.idOf(s.keys.sandboxes(), kv.Key), kv.ModRevision})
		}
	}
	known := len(found[1]) > 0 || len(found[2]) > 0 || len(recs) > 0
	if !known {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonNodeNotFound, fmt.Sprintf("node %s: the fleet knows no node of that id", id), map[string]string{"node_id": id})
	}
	out := &berthv1.RemoveNodeResponse{NodeId: id, DryRun: req.GetDryRun()}
	for _, r := range recs {
		out.SandboxIds = append(out.SandboxIds, r.id)
	}
	sort.Strings(out.SandboxIds)
	if req.GetDryRun() {
		return out, nil
	}
	// The node's snapshots are gone with it: their records first, so that
	// a removal that stops half-way (NODE_CHANGED) is simply asked again.
	removal := NodeRemoval{NodeKey: nodeKey, Keys: []string{seenKey, drainKey}, Prefixes: []string{s.keys.tombstones(id)}}
	for _, kv := range found[4] {
		var rec SnapshotRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Node == id {
			removal.Snapshots = append(removal.Snapshots, kv.Key)
		}
	}
	for _, r := range recs {
		removal.Records = append(removal.Records, KV{Key: s.keys.sandbox(r.id), ModRevision: r.rev})
	}
	done, err := s.store.RemoveNode(ctx, removal)
	if err != nil {
		return nil, storeError("remove the records of node "+id, err)
	}
	switch {
	case done.Done:
	case done.Snapshots < len(removal.Snapshots):
		return nil, rpcstatus.Error(codes.Aborted, rpcstatus.ReasonNodeChanged,
			fmt.Sprintf("node %s registered while it was being removed; none of its sandbox records were removed; list the nodes and try again", id),
			map[string]string{"node_id": id})
	default:
		// The node registered, or one of its records changed (only the
		// node itself, or a delete of the sandbox, changes one).
		return nil, rpcstatus.Error(codes.Aborted, rpcstatus.ReasonNodeChanged,
			fmt.Sprintf("node %s registered or its sandbox records changed while it was being removed; %d of its %d records were removed; list the nodes and try again", id, done.Records, len(recs)),
			map[string]string{"node_id": id})
	}
	return out, nil
}

// nodeLive is RemoveNode's refusal of a node that holds a lease.
func nodeLive(id string) error {
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNodeLive,
		fmt.Sprintf("node %s holds a lease: it is running (or stopped less than its lease time ago); stop its berthd first (SIGTERM revokes its lease), then remove it", id),
		map[string]string{"node_id": id})
}

// nodes reads every node the fleet knows, by id.
func (s *NodeService) nodes(ctx context.Context) (map[string]*berthv1.Node, error) {
	_, found, err := s.store.Read(ctx, prefixRange(s.keys.nodes()), prefixRange(s.keys.seenAll()),
		prefixRange(s.keys.drains()), prefixRange(s.keys.sandboxes()))
	if err != nil {
		return nil, storeError("read the fleet's nodes", err)
	}
	out := make(map[string]*berthv1.Node)
	get := func(id string) *berthv1.Node {
		n, ok := out[id]
		if !ok {
			n = &berthv1.Node{Id: id, State: berthv1.NodeState_NODE_STATE_LOST}
			out[id] = n
		}
		return n
	}
	for _, kv := range found[1] {
		var seen seenRecord
		if json.Unmarshal(kv.Value, &seen) == nil {
			get(s.keys.idOf(s.keys.seenAll(), kv.Key)).Address = seen.Address
		}
	}
	for _, kv := range found[0] {
		rec, ok := parseNode(kv.Value, kv.Lease)
		if !ok {
			continue
		}
		n := get(rec.ID)
		n.Address, n.Labels, n.Version, n.State = rec.Address, rec.Labels, rec.Version, berthv1.NodeState_NODE_STATE_READY
		n.Sandboxes = capacity(rec.Sandboxes, rec.MaxSandboxes)
		n.MemoryBytes = capacity(rec.MemoryBytes, rec.MemoryBudget)
		n.Execs = capacity(rec.Execs, rec.MaxExecs)
		n.Images = rec.Images
		n.ConflictingSandboxIds = rec.Conflicts
		n.Health = &berthv1.NodeHealth{Healthy: rec.Health.Healthy(), Reason: rec.Health.Reason, Message: rec.Health.Message}
		if !rec.Health.Since.IsZero() {
			n.Health.Since = timestamppb.New(rec.Health.Since)
		}
		n.StartedAt, n.UpdatedAt = timestamppb.New(rec.StartedAt), timestamppb.New(rec.UpdatedAt)
		n.LeaseId = fmt.Sprintf("%x", rec.Lease)
		if remaining, granted, err := s.store.LeaseRemaining(ctx, rec.Lease); err == nil && remaining > 0 {
			n.LeaseTtl = durationpb.New(granted)
			n.LeaseRemaining = durationpb.New(remaining)
		}
	}
	for _, kv := range found[2] {
		n := get(s.keys.idOf(s.keys.drains(), kv.Key))
		if n.State == berthv1.NodeState_NODE_STATE_READY {
			n.State = berthv1.NodeState_NODE_STATE_DRAINING
		}
	}
	for _, kv := range found[3] {
		var rec SandboxRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Node != "" {
			get(rec.Node).PlacedSandboxes++
		}
	}
	return out, nil
}

func capacity(inUse, limit uint64) *berthv1.NodeCapacity {
	c := &berthv1.NodeCapacity{InUse: inUse, Limit: limit}
	if limit > inUse {
		c.Free = limit - inUse
	}
	return c
}

// NotClustered is the NodeService of a berthd outside any fleet: every
// call is FAILED_PRECONDITION NOT_CLUSTERED.
type NotClustered struct {
	berthv1.UnimplementedNodeServiceServer
}

func notClustered() error {
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNotClustered,
		"this berthd is not part of a fleet: start it with --etcd-endpoints or --etcd-embed to join one", nil)
}

// ListNodes implements berth.v1.NodeService.
func (NotClustered) ListNodes(context.Context, *berthv1.ListNodesRequest) (*berthv1.ListNodesResponse, error) {
	return nil, notClustered()
}

// DrainNode implements berth.v1.NodeService.
func (NotClustered) DrainNode(context.Context, *berthv1.DrainNodeRequest) (*berthv1.DrainNodeResponse, error) {
	return nil, notClustered()
}

// UndrainNode implements berth.v1.NodeService.
func (NotClustered) UndrainNode(context.Context, *berthv1.UndrainNodeRequest) (*berthv1.UndrainNodeResponse, error) {
	return nil, notClustered()
}

// RemoveNode implements berth.v1.NodeService.
func (NotClustered) RemoveNode(context.Context, *berthv1.RemoveNodeRequest) (*berthv1.RemoveNodeResponse, error) {
	return nil, notClustered()
}
