package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// NodeService implements berth.v1.NodeService from etcd; any node or
// gateway of the fleet serves it. auth.AdminOnly keeps it for admins.
type NodeService struct {
	berthv1.UnimplementedNodeServiceServer
	cli  *clientv3.Client
	keys keys
	// budget bounds each call's etcd calls (WithEtcdBudget).
	budget time.Duration
}

var _ berthv1.NodeServiceServer = (*NodeService)(nil)

// NewNodeService returns the NodeService of the fleet under prefix ("" for
// DefaultPrefix).
func NewNodeService(cli *clientv3.Client, prefix string) *NodeService {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &NodeService{cli: cli, keys: keys{prefix}, budget: 2 * time.Second}
}

// WithEtcdBudget bounds how long each call waits for etcd (default 2 s):
// past it the call fails UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo,
// whatever the caller's deadline. It returns s.
func (s *NodeService) WithEtcdBudget(d time.Duration) *NodeService {
	if d > 0 {
		s.budget = d
	}
	return s
}

// ListNodes lists live nodes with their leases' remaining time, and lost
// nodes that were seen or still hold sandbox records.
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
	op := clientv3.OpDelete(s.keys.drain(id))
	if drain {
		op = clientv3.OpPut(s.keys.drain(id), time.Now().UTC().Format(time.RFC3339))
	}
	// Only a node the fleet saw: a typo must not leave a mark that waits
	// for a node of that name.
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(seen), ">", 0)).Then(op).Commit()
	if err != nil {
		return nil, storeError("set the drain mark of node "+id, err)
	}
	if !resp.Succeeded {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonNodeNotFound, fmt.Sprintf("node %s: the fleet never saw a node of that id", id), map[string]string{"node_id": id})
	}
	nodes, err := s.nodes(ctx)
	if err != nil {
		return nil, err
	}
	return nodes[id], nil
}

// nodes reads every node the fleet knows, by id.
func (s *NodeService) nodes(ctx context.Context) (map[string]*berthv1.Node, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.keys.nodes(), clientv3.WithPrefix()),
		clientv3.OpGet(s.keys.seenAll(), clientv3.WithPrefix()),
		clientv3.OpGet(s.keys.drains(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.keys.sandboxes(), clientv3.WithPrefix()),
	).Commit()
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
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		var seen seenRecord
		if json.Unmarshal(kv.Value, &seen) == nil {
			get(s.keys.idOf(s.keys.seenAll(), string(kv.Key))).Address = seen.Address
		}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
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
		n.StartedAt, n.UpdatedAt = timestamppb.New(rec.StartedAt), timestamppb.New(rec.UpdatedAt)
		n.LeaseId = fmt.Sprintf("%x", rec.Lease)
		if ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(rec.Lease)); err == nil && ttl.TTL > 0 {
			n.LeaseTtl = durationpb.New(time.Duration(ttl.GrantedTTL) * time.Second)
			n.LeaseRemaining = durationpb.New(time.Duration(ttl.TTL) * time.Second)
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		n := get(s.keys.idOf(s.keys.drains(), string(kv.Key)))
		if n.State == berthv1.NodeState_NODE_STATE_READY {
			n.State = berthv1.NodeState_NODE_STATE_DRAINING
		}
	}
	for _, kv := range resp.Responses[3].GetResponseRange().GetKvs() {
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
