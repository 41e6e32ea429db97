package cluster

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RouterConfig configures a Router.
type RouterConfig struct {
	// Member is this node's membership; nil for a gateway, which holds no
	// sandboxes and routes every call.
	Member *Member
	// Directory and Peers find and reach the other nodes.
	Directory *Directory
	Peers     *Peers
	// Version is berthd's version, for error details.
	Version string
	// BusyRetryDelay is the retry delay of the fleet's FLEET_BUSY.
	// Default 1 s.
	BusyRetryDelay time.Duration
	// EtcdBudget bounds how long a routed call or a create waits for the
	// fleet's etcd to answer the lookups that find its node (whatever
	// the caller's deadline, or without one); past it the call fails
	// UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo. Default 2 s.
	EtcdBudget time.Duration
	// ListBudget bounds how long ListSandboxes waits for the nodes it
	// asks: it answers with what came in time and names the nodes that
	// did not (ListSandboxesResponse.unreachable_nodes). Default 3 s,
	// below typical client deadlines.
	ListBudget time.Duration
	Log        *slog.Logger
}

// clusterRetryDelay is the retry delay a CLUSTER_UNAVAILABLE suggests.
const clusterRetryDelay = time.Second

// Router routes berth.v1 calls to the node that holds their sandbox: it is
// a pair of gRPC interceptors that run after authentication (they need the
// caller's principal) and before the handlers. A call that a node forwarded
// (auth.Principal.Via is set) is always served where it arrives, so a call
// is routed at most once.
type Router struct {
	cfg RouterConfig
	log *slog.Logger
}

// NewRouter returns the Router of cfg.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.BusyRetryDelay <= 0 {
		cfg.BusyRetryDelay = time.Second
	}
	if cfg.EtcdBudget <= 0 {
		cfg.EtcdBudget = DefaultEtcdBudget
	}
	if cfg.ListBudget <= 0 {
		cfg.ListBudget = 3 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Router{cfg: cfg, log: cfg.Log}
}

// routedServices are the services whose calls name a sandbox and go to its
// node. Every other service (images, nodes, health, reflection) is served
// by the berthd called.
var routedServices = auth.ForwardedServices

// readOnly are the routed methods that change nothing: when their node
// breaks off, nothing took effect (ADMITTED_NOT_STARTED). A broken call of
// any other method may have (ADMITTED_UNKNOWN).
var readOnly = map[string]bool{
	berthv1.SandboxService_GetSandbox_FullMethodName:       true,
	berthv1.SandboxService_ListExecs_FullMethodName:        true,
	berthv1.SandboxService_AttachExec_FullMethodName:       true,
	berthv1.FileService_ReadFile_FullMethodName:            true,
	berthv1.FileService_Stat_FullMethodName:                true,
	berthv1.FileService_ListDir_FullMethodName:             true,
	berthv1.FileService_Download_FullMethodName:            true,
	berthv1.SandboxService_ListSessions_FullMethodName:     true,
	berthv1.SandboxService_WatchFiles_FullMethodName:       true,
	berthv1.SandboxService_ListCodeContexts_FullMethodName: true,
}

func serviceOf(fullMethod string) string {
	s, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	return s
}

// UnaryInterceptor routes unary calls.
func (r *Router) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, ok := auth.FromContext(ctx)
		if !ok || p.Via != "" || !routedServices[serviceOf(info.FullMethod)] {
			return handler(ctx, req)
		}
		switch info.FullMethod {
		case berthv1.SandboxService_CreateSandbox_FullMethodName:
			if len(req.(*berthv1.CreateSandboxRequest).GetVolumes()) > 0 {
				return nil, volumesNotInFleet()
			}
			if req.(*berthv1.CreateSandboxRequest).GetFromSnapshot() != "" {
				return r.createFromSnapshot(ctx, p, req.(*berthv1.CreateSandboxRequest), handler)
			}
			return r.create(ctx, p, req.(*berthv1.CreateSandboxRequest), handler)
		case berthv1.SandboxService_DeleteSnapshot_FullMethodName, berthv1.SandboxService_CommitSnapshot_FullMethodName:
			// CreateSnapshot and ForkSandbox name their sandbox and go
			// to its node below.
			return r.snapshotCall(ctx, p, info.FullMethod, req.(proto.Message), handler)
		case berthv1.SandboxService_ListSnapshots_FullMethodName:
			return r.listSnapshots(ctx, p, req.(*berthv1.ListSnapshotsRequest), handler)
		case berthv1.SandboxService_CreateVolume_FullMethodName, berthv1.SandboxService_GetVolume_FullMethodName,
			berthv1.SandboxService_ListVolumes_FullMethodName, berthv1.SandboxService_DeleteVolume_FullMethodName:
			return nil, volumesNotInFleet()
		case berthv1.SandboxService_ListSandboxes_FullMethodName:
			return r.list(ctx, p, req.(*berthv1.ListSandboxesRequest), handler)
		}
		m, _ := req.(proto.Message)
		if m == nil {
			return handler(ctx, req)
		}
		id := sandboxid.Of(m.ProtoReflect(), 1)
		node, local, err := r.holder(ctx, p, id)
		if lost := lostNode(err); lost != "" && info.FullMethod == berthv1.SandboxService_DeleteSandbox_FullMethodName {
			return r.deleteLost(ctx, p, id, lost, handler, info, m)
		}
		if err != nil || local {
			if err != nil {
				return nil, err
			}
			return r.here(ctx, info.FullMethod, req, handler)
		}
		return r.forwardUnary(ctx, p, node, info.FullMethod, m, id)
	}
}

// volumesNotInFleet refuses the volume calls, and creates that mount a
// volume, in a fleet: a volume lives on one node's disk pool and the
// fleet's directory records no volumes to place a sandbox by.
func volumesNotInFleet() error {
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonVolumeUnsupported,
		"volumes are not available in a fleet yet: a volume is kept on one node and the fleet's directory does not place sandboxes by volume; use a single berthd", nil)
}

// deleteLost deletes sandbox id, whose node is lost, for p, who may see
// it (holder answers NODE_LOST to no one else): its record is removed, so
// the id is free again, and a tombstone left for the node. The sandbox is
// not reached — it is gone with its node, or the node deletes it when it
// comes back (see Member.reconcile). When the record or the node changed meanwhile the
// delete is routed again, once.
func (r *Router) deleteLost(ctx context.Context, p auth.Principal, id, node string, handler grpc.UnaryHandler, info *grpc.UnaryServerInfo, req proto.Message) (any, error) {
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	removed, err := r.cfg.Directory.forgetLost(sctx, id, node, p.String())
	if err != nil {
		return nil, r.storeFailed(ctx, err)
	}
	if removed {
		r.log.InfoContext(ctx, "cluster: deleted the record of a sandbox whose node is lost", slog.String("sandbox_id", id), slog.String("node_id", node), slog.String("principal", p.String()))
		return &berthv1.DeleteSandboxResponse{}, nil
	}
	again, local, err := r.holder(ctx, p, id)
	switch {
	case err != nil:
		return nil, err
	case local:
		return r.here(ctx, info.FullMethod, req, handler)
	}
	return r.forwardUnary(ctx, p, again, info.FullMethod, req, id)
}

// StreamInterceptor routes streaming calls by the sandbox their first
// message names.
func (r *Router) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		p, ok := auth.FromContext(ctx)
		if !ok || p.Via != "" || !routedServices[serviceOf(info.FullMethod)] {
			return handler(srv, ss)
		}
		in, out, err := messageTypes(info.FullMethod)
		if err != nil {
			return err
		}
		first := in.New().Interface()
		if err := ss.RecvMsg(first); err != nil {
			if errors.Is(err, io.EOF) {
				return handler(srv, ss)
			}
			return err
		}
		replay := &replayStream{ServerStream: ss, first: first}
		id := sandboxid.Of(first.ProtoReflect(), 1)
		node, local, err := r.holder(ctx, p, id)
		switch {
		case err != nil:
			return err
		case local && r.cfg.Member != nil:
			return handler(srv, replay)
		case local:
			// A gateway has no handlers of its own: any node answers for
			// a sandbox that no node holds.
			if node, err = r.anyNode(ctx); err != nil {
				return err
			}
		}
		return r.forwardStream(ctx, p, node, info, replay, first, out, id)
	}
}

// here serves a call on this berthd: its own handler on a node; on a
// gateway, any node, which answers for a sandbox that no node holds (or a
// malformed request) exactly as a node does.
func (r *Router) here(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	if r.cfg.Member != nil {
		return handler(ctx, req)
	}
	node, err := r.anyNode(ctx)
	if err != nil {
		return nil, err
	}
	p, _ := auth.FromContext(ctx)
	m, _ := req.(proto.Message)
	return r.forwardUnary(ctx, p, node, method, m, sandboxid.Of(m.ProtoReflect(), 1))
}

// anyNode returns a live node for a gateway to ask.
func (r *Router) anyNode(ctx context.Context) (NodeRecord, error) {
	nodes := r.cfg.Directory.LiveNodes()
	if len(nodes) == 0 {
		return NodeRecord{}, rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable,
			fmt.Sprintf("no node of the fleet holds a lease: none can answer; nothing was sent, retry after %v", clusterRetryDelay), nil,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
	}
	return nodes[0], nil
}

// holder returns the live node that holds sandbox id, or local when this
// berthd answers the call itself: the id is its own, no node holds it, or
// the request names no (valid) sandbox — the handler then answers as for
// any unknown or malformed id. A sandbox whose node is lost is
// UNAVAILABLE SANDBOX_UNREACHABLE with cause NODE_LOST for those who may
// see it, and answered here as unknown for everyone else.
func (r *Router) holder(ctx context.Context, p auth.Principal, id string) (node NodeRecord, local bool, err error) {
	if id == "" || !sandboxid.Valid(id) {
		return NodeRecord{}, true, nil
	}
	if m := r.cfg.Member; m != nil && m.Holds(id) {
		return NodeRecord{}, true, nil
	}
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	rec, ok, err := r.cfg.Directory.Sandbox(sctx, id)
	node, local, lost, err := r.recordHolder(ctx, sctx, p, rec, ok, err)
	if lost {
		return NodeRecord{}, false, r.nodeUnreachable(id, rec.Node, true, berthv1.Admitted_ADMITTED_NOT_STARTED)
	}
	return node, local, err
}

// recordHolder is holder's answer for the record rec of a sandbox or a
// snapshot (ok: there is one; err: the lookup under sctx failed): its
// live node, local, or lost when its node is lost and p may see it.
func (r *Router) recordHolder(ctx, sctx context.Context, p auth.Principal, rec SandboxRecord, ok bool, err error) (node NodeRecord, local, lost bool, _ error) {
	if err != nil || !ok {
		return NodeRecord{}, err == nil, false, r.storeFailed(ctx, err)
	}
	if m := r.cfg.Member; m != nil && rec.Node == m.NodeID() {
		return NodeRecord{}, true, false, nil
	}
	node, live, err := r.cfg.Directory.LiveNode(sctx, rec.Node)
	switch {
	case err != nil:
		return NodeRecord{}, false, false, r.storeFailed(ctx, err)
	case live:
		return node, false, false, nil
	case !p.Sees(rec.Owner):
		return NodeRecord{}, true, false, nil
	}
	return NodeRecord{}, false, true, nil
}

// storeContext returns the context of a call's etcd lookups: ctx bounded
// by the etcd budget. Only lookups use it, never the forwarded call.
func (r *Router) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.EtcdBudget)
}

// storeFailed returns the error of a call whose etcd lookup under
// storeContext(ctx) failed with err (see the package's storeFailed).
func (r *Router) storeFailed(ctx context.Context, err error) error {
	return storeFailed(ctx, r.cfg.EtcdBudget, err)
}

// nodeUnreachable is UNAVAILABLE SANDBOX_UNREACHABLE for a sandbox whose
// node is lost (its lease expired) or did not answer, with a RetryInfo of
// clusterRetryDelay when nothing ran (admitted NOT_STARTED): a retry is
// safe and helps once the node answers or registers again.
func (r *Router) nodeUnreachable(id, node string, lost bool, admitted berthv1.Admitted) error {
	cause, what := berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_UNREACHABLE, fmt.Sprintf("node %s, which holds it, did not answer", node)
	if lost {
		cause, what = berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST, fmt.Sprintf("node %s, which holds it, is lost: its lease in the cluster store expired", node)
	}
	msg := fmt.Sprintf("sandbox %s: %s", id, what)
	switch admitted {
	case berthv1.Admitted_ADMITTED_STARTED:
		msg += "; the exec had started and may still run"
	case berthv1.Admitted_ADMITTED_UNKNOWN:
		msg += "; the request reached the node, whether it took effect is unknown"
	default:
		msg += "; nothing ran"
	}
	details := []protoadapt.MessageV1{&berthv1.Unreachable{SandboxId: id, Cause: cause, NodeId: node, ServerVersion: r.cfg.Version, Admitted: admitted}}
	if admitted == berthv1.Admitted_ADMITTED_NOT_STARTED {
		// Nothing ran, and the node may answer (or register again) soon.
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
	}
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg,
		map[string]string{"sandbox_id": id, "node_id": node, "cause": cause.String()}, details...)
}

// peerError is the status of a forwarded call that failed: the node's own
// berth status as it is; a broken or refused connection as the node being
// unreachable (admitted says what may have happened).
func (r *Router) peerError(ctx context.Context, err error, id, node string, admitted berthv1.Admitted) error {
	if rpcstatus.Reason(err) != "" {
		return err
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return rpcstatus.Error(codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded, fmt.Sprintf("deadline exceeded while node %s served sandbox %s", node, id), map[string]string{"sandbox_id": id, "node_id": node})
	case ctx.Err() != nil:
		return rpcstatus.Error(codes.Canceled, rpcstatus.ReasonCanceled, fmt.Sprintf("request canceled while node %s served sandbox %s", node, id), map[string]string{"sandbox_id": id, "node_id": node})
	case status.Code(err) == codes.Unavailable, status.Code(err) == codes.Canceled:
		// Canceled with the caller's context alive: the connection to the
		// node was closed under the call (Peers closed it: the node moved
		// to another address, or this berthd stops).
		return r.nodeUnreachable(id, node, false, admitted)
	}
	// A status gRPC made on the way (message too large, an older node
	// without the method): passed as it is.
	return err
}

// forwardUnary makes the unary call method with req on node for p.
func (r *Router) forwardUnary(ctx context.Context, p auth.Principal, node NodeRecord, method string, req proto.Message, id string) (any, error) {
	_, out, err := messageTypes(method)
	if err != nil {
		return nil, err
	}
	conn, ready, err := r.cfg.Peers.ready(ctx, node)
	if err != nil {
		return nil, err
	}
	if !ready {
		if ctx.Err() != nil {
			return nil, r.peerError(ctx, ctx.Err(), id, node.ID, berthv1.Admitted_ADMITTED_NOT_STARTED)
		}
		return nil, r.nodeUnreachable(id, node.ID, false, berthv1.Admitted_ADMITTED_NOT_STARTED)
	}
	resp := out.New().Interface()
	if err := conn.Invoke(forwarded(ctx, p), method, req, resp); err != nil {
		admitted := berthv1.Admitted_ADMITTED_UNKNOWN
		if readOnly[method] {
			admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
		}
		return nil, r.peerError(ctx, err, id, node.ID, admitted)
	}
	return resp, nil
}

// forwardStream relays a streaming call between the caller's stream ss and
// node: first, then every message either way, then the node's status.
// The caller-to-node direction runs on a goroutine that ends when ss ends,
// which gRPC makes happen when this returns.
func (r *Router) forwardStream(ctx context.Context, p auth.Principal, node NodeRecord, info *grpc.StreamServerInfo, ss grpc.ServerStream, first proto.Message, out protoreflect.MessageType, id string) error {
	conn, ready, err := r.cfg.Peers.ready(ctx, node)
	if err != nil {
		return err
	}
	if !ready {
		if ctx.Err() != nil {
			return r.peerError(ctx, ctx.Err(), id, node.ID, berthv1.Admitted_ADMITTED_NOT_STARTED)
		}
		return r.nodeUnreachable(id, node.ID, false, berthv1.Admitted_ADMITTED_NOT_STARTED)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: info.FullMethod, ServerStreams: info.IsServerStream, ClientStreams: info.IsClientStream}
	cs, err := conn.NewStream(forwarded(ctx, p), desc, info.FullMethod)
	if err != nil {
		return r.peerError(ctx, err, id, node.ID, berthv1.Admitted_ADMITTED_NOT_STARTED)
	}
	in := first.ProtoReflect().Type()
	go func() {
		// ss.RecvMsg returns first on the first call, then the caller's
		// messages. SendMsg's io.EOF means the node ended the call: its
		// status comes from RecvMsg below.
		for {
			m := in.New().Interface()
			if err := ss.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					cs.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if err := cs.SendMsg(m); err != nil {
				return
			}
			if !info.IsClientStream {
				cs.CloseSend()
				return
			}
		}
	}()
	admitted := berthv1.Admitted_ADMITTED_UNKNOWN
	if readOnly[info.FullMethod] {
		admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
	}
	for {
		m := out.New().Interface()
		if err := cs.RecvMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return r.peerError(ctx, err, id, node.ID, admitted)
		}
		if e, ok := m.(*berthv1.ExecResponse); ok && e.GetStarted() != nil {
			admitted = berthv1.Admitted_ADMITTED_STARTED
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// replayStream hands first to the first RecvMsg, then reads ss.
type replayStream struct {
	grpc.ServerStream
	mu    sync.Mutex
	first proto.Message
}

func (s *replayStream) RecvMsg(m any) error {
	s.mu.Lock()
	first := s.first
	s.first = nil
	s.mu.Unlock()
	if first == nil {
		return s.ServerStream.RecvMsg(m)
	}
	dst, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("cluster: cannot replay %T into %T", first, m)
	}
	proto.Reset(dst)
	proto.Merge(dst, first)
	return nil
}

var methodTypes sync.Map // full method -> [2]protoreflect.MessageType

// messageTypes returns the request and response types of a gRPC method
// from the registered descriptors.
func messageTypes(fullMethod string) (in, out protoreflect.MessageType, err error) {
	if v, ok := methodTypes.Load(fullMethod); ok {
		t := v.([2]protoreflect.MessageType)
		return t[0], t[1], nil
	}
	svc, name, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: service of %s: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok || sd.Methods().ByName(protoreflect.Name(name)) == nil {
		return nil, nil, fmt.Errorf("cluster: no method %s", fullMethod)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if in, err = protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName()); err != nil {
		return nil, nil, err
	}
	if out, err = protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err != nil {
		return nil, nil, err
	}
	methodTypes.Store(fullMethod, [2]protoreflect.MessageType{in, out})
	return in, out, nil
}

// create places a new sandbox, or sends the create to the node that holds
// its id already. The id is known before any node sees the request when
// the caller names it or a request_id derives it; a create without either
// gets a new random id (or a warm-pool member) from the node it lands on,
// which records it. A node that refuses — full, draining, or without a
// lease, gone before it took the call, or failing it for a fault of its
// own with nothing started (see notStartedOnNode) — is skipped for the
// next candidate, and when every candidate failed so the last one's error
// is the answer; one that finds the id recorded on another node (a concurrent
// create of the same id placed it there) hands the call to that node.
func (r *Router) create(ctx context.Context, p auth.Principal, req *berthv1.CreateSandboxRequest, handler grpc.UnaryHandler) (any, error) {
	id := req.GetSandboxId()
	if id == "" && req.GetRequestId() != "" {
		id = sandboxid.FromRequest(p.Name, req.GetRequestId())
	}
	if id != "" && !sandboxid.Valid(id) {
		return r.here(ctx, berthv1.SandboxService_CreateSandbox_FullMethodName, req, handler)
	}
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	if id != "" {
		rec, ok, err := r.cfg.Directory.Sandbox(sctx, id)
		if err != nil {
			return nil, r.storeFailed(ctx, err)
		}
		if ok {
			return r.createAt(ctx, p, rec.Node, rec.Owner, id, req, handler)
		}
	}
	nodes, err := r.cfg.Directory.Nodes(sctx)
	if err != nil {
		return nil, r.storeFailed(ctx, err)
	}
	cancel()
	pl := place(nodes, placementRequest{image: req.GetImage(), memBytes: req.GetResources().GetMemoryBytes(), selector: selectorOf(req.GetLabels())})
	var last error
	noLease := 0 // candidates that refused for holding no lease
	for _, n := range pl.candidates {
		resp, err := r.createOn(ctx, p, n, id, req, handler)
		switch reason := rpcstatus.Reason(err); {
		case err == nil:
			return resp, nil
		case reason == rpcstatus.ReasonPlacedElsewhere:
			holder := errorMeta(err)["node_id"]
			return r.createAt(ctx, p, holder, p.Name, id, req, handler)
		case reason == rpcstatus.ReasonNodeNotAccepting || reason == rpcstatus.ReasonFleetBusy || notStartedOnNode(err):
			r.log.DebugContext(ctx, "cluster: node refused a placement; trying the next", slog.String("node_id", n.ID), slog.String("sandbox_id", id), slog.Any("error", err))
			last = err
			if reason == rpcstatus.ReasonNodeNotAccepting && errorMeta(err)["cause"] == causeNoLease {
				noLease++
			}
		default:
			return nil, err
		}
	}
	return nil, r.placementRefused(req, id, pl, last, noLease)
}

// createAt sends a create to node, which holds id (created by owner).
func (r *Router) createAt(ctx context.Context, p auth.Principal, node, owner, id string, req *berthv1.CreateSandboxRequest, handler grpc.UnaryHandler) (any, error) {
	if m := r.cfg.Member; m != nil && node == m.NodeID() {
		return handler(ctx, req)
	}
	sctx, cancel := r.storeContext(ctx)
	n, live, err := r.cfg.Directory.LiveNode(sctx, node)
	cancel()
	switch {
	case err != nil:
		return nil, r.storeFailed(ctx, err)
	case live:
		return r.createOn(ctx, p, n, id, req, handler)
	case !p.Sees(owner):
		return nil, rpcstatus.SandboxTaken(id)
	}
	return nil, r.nodeUnreachable(id, node, true, berthv1.Admitted_ADMITTED_NOT_STARTED)
}

func (r *Router) createOn(ctx context.Context, p auth.Principal, n NodeRecord, id string, req *berthv1.CreateSandboxRequest, handler grpc.UnaryHandler) (any, error) {
	if m := r.cfg.Member; m != nil && n.ID == m.NodeID() {
		return handler(ctx, req)
	}
	return r.forwardUnary(ctx, p, n, berthv1.SandboxService_CreateSandbox_FullMethodName, req, id)
}

// notStartedOnNode reports whether err says a create failed for a fault
// of the node it was sent to, with nothing started there, so that another
// node may take it: the node could not be reached and nothing was sent to
// it (Unreachable naming the node, ADMITTED_NOT_STARTED); its containerd
// did not answer, or its state disk or descriptors ran out, before
// anything changed (DependencyFailure, ADMITTED_NOT_STARTED); or the pool
// that holds its sandboxes' file systems is full (NO_SPACE, resource
// sandbox_pool: the node removed what the create made, and its claim).
// Capacity refusals (FLEET_BUSY, NODE_NOT_ACCEPTING) are the caller's
// other case. A failure that may have left something (ADMITTED_UNKNOWN,
// an agent that did not start) or that is the request's own is not one.
func notStartedOnNode(err error) bool {
	st, _ := status.FromError(err)
	if rpcstatus.Reason(err) == rpcstatus.ReasonNoSpace {
		return errorMeta(err)["resource"] == "sandbox_pool"
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *berthv1.Unreachable:
			return d.GetNodeId() != "" && d.GetAdmitted() == berthv1.Admitted_ADMITTED_NOT_STARTED
		case *berthv1.DependencyFailure:
			return d.GetAdmitted() == berthv1.Admitted_ADMITTED_NOT_STARTED
		}
	}
	return false
}

func errorMeta(err error) map[string]string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == rpcstatus.Domain {
			return info.GetMetadata()
		}
	}
	return nil
}

// placementRefused says why no node took a new sandbox: no node at all,
// none matching its node selector, none holding its image, or no room
// (FLEET_BUSY for the fleet: the limits and use of the nodes that could
// have taken it, summed). No node holding a lease — none registered, or
// every candidate refused, noLease of them for holding none at that
// instant (leases that lapsed together while etcd was away) — is
// UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo: the nodes register
// again within about a second of etcd answering.
func (r *Router) placementRefused(req *berthv1.CreateSandboxRequest, id string, pl placement, last error, noLease int) error {
	meta := map[string]string{"sandbox_id": id}
	retry := &errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)}
	switch {
	case pl.nodes == 0:
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable,
			fmt.Sprintf("no node of the fleet holds a lease: none can take a sandbox; nothing was started, retry after %v", clusterRetryDelay), meta, retry)
	case len(pl.full) == 0 && len(pl.candidates) > 0 && noLease == len(pl.candidates):
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable,
			fmt.Sprintf("none of the fleet's %d nodes that may take sandbox %s holds a lease at this moment (they register again after the cluster store was away); nothing was started, retry after %v",
				len(pl.candidates), id, clusterRetryDelay), meta, retry)
	case pl.matching == 0:
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNoMatchingNode,
			fmt.Sprintf("none of the fleet's %d nodes has the labels that the sandbox's %s labels ask for", pl.nodes, NodeSelectorPrefix), meta)
	case pl.withImage == 0:
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonImageNotFound,
			fmt.Sprintf("image %s is on none of the fleet's %d nodes that may take the sandbox; import or pull it on them", req.GetImage(), pl.matching), withImage(meta, req.GetImage()))
	case len(pl.full) == 0 && last != nil:
		// Every candidate refused on its own (a race with other creates,
		// or nodes that broke off): its last answer says why.
		if rpcstatus.Reason(last) == rpcstatus.ReasonFleetBusy || rpcstatus.Reason(last) == rpcstatus.ReasonUnreachable || notStartedOnNode(last) {
			return last
		}
	}
	d := &berthv1.FleetBusy{SandboxId: id, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES, Requested: 1,
		RetryDelay: durationpb.New(r.cfg.BusyRetryDelay), ServerVersion: r.cfg.Version, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}
	if pl.memoryBound && len(pl.full) > 0 {
		d.Resource, d.Requested = berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, req.GetResources().GetMemoryBytes()
	}
	draining := 0
	for _, n := range pl.full {
		if n.Draining {
			draining++
		}
		if d.Resource == berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY {
			d.Limit, d.InUse = d.Limit+n.MemoryBudget, d.InUse+n.MemoryBytes
		} else {
			d.Limit, d.InUse = d.Limit+n.MaxSandboxes, d.InUse+n.Sandboxes
		}
	}
	msg := fmt.Sprintf("no capacity for sandbox %s: none of the fleet's %d nodes that may take it has room (%d draining; in use %d of %d %s); nothing was started, retry after %v",
		id, len(pl.full), draining, d.InUse, d.Limit, strings.TrimPrefix(strings.ToLower(d.Resource.String()), "capacity_resource_"), r.cfg.BusyRetryDelay)
	if len(pl.full) == 0 && last != nil {
		msg = fmt.Sprintf("no capacity for sandbox %s: every node that may take it refused it (the last: %v); nothing was started, retry after %v", id, status.Convert(last).Message(), r.cfg.BusyRetryDelay)
	}
	return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, msg, withResource(meta, d.Resource.String()),
		d, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.cfg.BusyRetryDelay)})
}

func withImage(meta map[string]string, image string) map[string]string {
	meta["image"] = image
	return meta
}

func withResource(meta map[string]string, resource string) map[string]string {
	meta["resource"] = resource
	return meta
}

// list asks every live node for the caller's sandboxes (listAll) and
// merges the pages by id.
func (r *Router) list(ctx context.Context, p auth.Principal, req *berthv1.ListSandboxesRequest, handler grpc.UnaryHandler) (any, error) {
	resps, unreachable, err := r.listAll(ctx, p, berthv1.SandboxService_ListSandboxes_FullMethodName, req, handler, r.cfg.Directory.Sandboxes)
	if err != nil {
		return nil, err
	}
	var (
		all  []*berthv1.Sandbox
		more bool
	)
	for _, resp := range resps {
		resp, _ := resp.(*berthv1.ListSandboxesResponse)
		all = append(all, resp.GetSandboxes()...)
		more = more || resp.GetNextPageToken() != ""
	}
	size := int(req.GetPageSize())
	if size <= 0 {
		size = 100
	}
	sort.Slice(all, func(i, j int) bool { return all[i].GetId() < all[j].GetId() })
	out := &berthv1.ListSandboxesResponse{Sandboxes: all, UnreachableNodes: unreachable}
	if len(all) > size {
		out.Sandboxes, more = all[:size], true
	}
	if more && len(out.Sandboxes) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(out.Sandboxes[len(out.Sandboxes)-1].GetId()))
	}
	return out, nil
}

// listAll asks every live node for the answer of the list call method with
// req, for p, in parallel, and returns the answers that came. It waits at
// most the list budget: a node that did not answer by then (a frozen
// berthd), or failed for a reason of its own, is named in unreachable, and
// so is a lost node (no lease) on which records (read by records: the
// sandboxes' or the snapshots') name something of p's. An error of the
// request itself (a bad page token) fails the call, as does no node
// answering at all.
func (r *Router) listAll(ctx context.Context, p auth.Principal, method string, req proto.Message, handler grpc.UnaryHandler,
	records func(context.Context) (map[string]SandboxRecord, error)) (resps []any, unreachable []string, _ error) {
	nodes := r.cfg.Directory.LiveNodes()
	name := method[strings.LastIndex(method, "/")+1:]
	type answer struct {
		resp any
		err  error
		node string
	}
	// Every call runs under lctx, which ends when listAll returns: a node
	// that did not answer in time is abandoned, its call canceled.
	lctx, cancel := context.WithTimeout(ctx, r.cfg.ListBudget)
	defer cancel()
	ask := func(n NodeRecord, local bool, out chan<- answer) {
		a := answer{node: n.ID}
		if local {
			a.resp, a.err = handler(lctx, req)
		} else {
			a.resp, a.err = r.forwardUnary(lctx, p, n, method, req, "")
		}
		out <- a
	}
	answers := make(chan answer, len(nodes)+1)
	asked := make(map[string]bool, len(nodes)+1)
	for _, n := range nodes {
		asked[n.ID] = true
		go ask(n, r.cfg.Member != nil && n.ID == r.cfg.Member.NodeID(), answers)
	}
	if m := r.cfg.Member; m != nil && !asked[m.NodeID()] {
		// This node lost its lease: it still lists its own.
		asked[m.NodeID()] = true
		go ask(NodeRecord{ID: m.NodeID()}, true, answers)
	}
	lost := make(chan []string, 1)
	go func() { lost <- r.lostHolders(lctx, p, asked, records) }()
	answered := make(map[string]bool, len(asked))
	budget := time.NewTimer(r.cfg.ListBudget)
	defer budget.Stop()
collect:
	for len(answered) < len(asked) {
		select {
		case a := <-answers:
			answered[a.node] = true
			switch {
			case ctx.Err() != nil:
				return nil, nil, listEnded(ctx)
			case a.err != nil && requestError(a.err):
				return nil, nil, a.err
			case a.err != nil:
				r.log.WarnContext(ctx, "cluster: a node did not answer "+name+"; it is named in unreachable_nodes", slog.String("node_id", a.node), slog.Any("error", a.err))
				unreachable = append(unreachable, a.node)
			default:
				resps = append(resps, a.resp)
			}
		case <-budget.C:
			break collect
		case <-ctx.Done():
			return nil, nil, listEnded(ctx)
		}
	}
	for id := range asked {
		if !answered[id] {
			r.log.WarnContext(ctx, "cluster: a node did not answer "+name+" within the list budget; it is named in unreachable_nodes", slog.String("node_id", id), slog.Duration("list_budget", r.cfg.ListBudget))
			unreachable = append(unreachable, id)
		}
	}
	if len(unreachable) == len(asked) && len(asked) > 0 {
		sort.Strings(unreachable)
		return nil, nil, rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable,
			fmt.Sprintf("no node of the fleet answered %s within %v (asked: %s)", name, r.cfg.ListBudget, strings.Join(unreachable, ", ")), nil,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
	}
	// Within the budget too: the lookup runs under lctx.
	unreachable = append(unreachable, <-lost...)
	sort.Strings(unreachable)
	return resps, slices.Compact(unreachable), nil
}

// listEnded is the status of a list whose caller went away (ctx ended)
// before the nodes answered.
func listEnded(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return rpcstatus.Error(codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded, "deadline exceeded while the fleet's nodes listed", nil)
	}
	return rpcstatus.Error(codes.Canceled, rpcstatus.ReasonCanceled, "request canceled while the fleet's nodes listed", nil)
}

// requestError reports whether a node's err is about the request rather
// than the node: every node would answer it alike.
func requestError(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// lostHolders returns the nodes outside asked (lost: they hold no lease)
// on which records (a Directory's Sandboxes or Snapshots) name something
// that p may see, within ctx and the etcd budget; none when etcd does not
// answer in time (logged).
func (r *Router) lostHolders(ctx context.Context, p auth.Principal, asked map[string]bool, records func(context.Context) (map[string]SandboxRecord, error)) []string {
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	recs, err := records(sctx)
	if err != nil {
		r.log.WarnContext(ctx, "cluster: a list could not read which lost nodes hold what it lists", slog.Any("error", err))
		return nil
	}
	var out []string
	for _, rec := range recs {
		if !asked[rec.Node] && p.Sees(rec.Owner) {
			out = append(out, rec.Node)
		}
	}
	return out
}
