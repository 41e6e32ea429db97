package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A fleet's images: an ImportImage or PullImage through any node or
// gateway goes to every live node, so that placement (which only chooses
// nodes whose record lists the image) may choose any of them.
//
//   - The first target is the node called (a gateway: the first live node
//     that answers). Its answer decides the call: when it fails (a bad
//     archive, an unknown reference) the call fails with its error and no
//     other node is asked.
//   - Then every other live node gets the same call as the caller (the
//     caller's principal forwarded, an admin only with its own token:
//     auth.ForwardedImageMethods), imageFanout at a time. An import's
//     archive is spooled to a temporary file once (os.TempDir) and read
//     from it for each node; nothing is held in memory whole. A pull is
//     made by each node from the registry itself.
//   - The response lists every node asked with what it made of it
//     (ImageNodeResult). A node that failed, or that was not live then or
//     joins later, does not hold the image; placement keeps skipping it
//     for the image's sandboxes until it is imported or pulled there.
//   - Before answering, the call waits (at most imagePublishWait) until
//     the nodes that stored the image have published it, so that a create
//     right after the answer finds them.
//
// ListImages on a node lists its own images with the live nodes that hold
// each (from their records: no call to any node), and by name the images
// only other nodes hold; on a gateway only the latter. DeleteImage stays
// per node.

// imageFanout is how many nodes an import or pull through the fleet is sent
// to at once.
const imageFanout = 4

// imagePublishWait bounds the wait for the nodes that stored an image to
// publish it in their records.
const imagePublishWait = 5 * time.Second

// importChunk is the size of the archive chunks sent to other nodes.
const importChunk = 1 << 20

// ImageStreamInterceptor sends ImportImage and PullImage to every live
// node of the fleet (see the comment at the top of this file). A call a
// node forwarded is served where it arrives.
func (r *Router) ImageStreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, ok := auth.FromContext(ss.Context())
		if !ok || p.Via != "" {
			return handler(srv, ss)
		}
		switch info.FullMethod {
		case berthv1.ImageService_ImportImage_FullMethodName:
			return r.importImage(p, srv, ss, handler)
		case berthv1.ImageService_PullImage_FullMethodName:
			return r.pullImage(p, srv, ss, handler)
		}
		return handler(srv, ss)
	}
}

// ImageUnaryInterceptor answers ListImages with the nodes that hold each
// image.
func (r *Router) ImageUnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, ok := auth.FromContext(ctx)
		if !ok || p.Via != "" || info.FullMethod != berthv1.ImageService_ListImages_FullMethodName {
			return handler(ctx, req)
		}
		resp := &berthv1.ListImagesResponse{}
		if r.cfg.Member != nil {
			out, err := handler(ctx, req)
			if err != nil {
				return nil, err
			}
			resp = out.(*berthv1.ListImagesResponse)
		}
		withHolders(resp, r.cfg.Directory.LiveNodes())
		return resp, nil
	}
}

// withHolders sets each image's node_ids from the records of nodes and
// adds, by name, the images that only those nodes hold; ordered by name.
func withHolders(resp *berthv1.ListImagesResponse, nodes []NodeRecord) {
	holders := make(map[string][]string)
	for _, n := range nodes {
		for _, im := range n.Images {
			holders[im] = append(holders[im], n.ID)
		}
	}
	for _, img := range resp.Images {
		img.NodeIds = holders[img.GetName()]
		delete(holders, img.GetName())
	}
	for name, ids := range holders {
		resp.Images = append(resp.Images, &berthv1.Image{Name: name, NodeIds: ids})
	}
	sort.Slice(resp.Images, func(i, j int) bool { return resp.Images[i].GetName() < resp.Images[j].GetName() })
}

// imageTargets returns the nodes an image call goes to: this node (nil on
// a gateway) and the other live nodes, ordered by id.
func (r *Router) imageTargets() (self *NodeRecord, others []NodeRecord) {
	m := r.cfg.Member
	if m != nil {
		self = &NodeRecord{ID: m.NodeID()}
	}
	for _, n := range r.cfg.Directory.LiveNodes() {
		if self == nil || n.ID != self.ID {
			others = append(others, n)
		}
	}
	return self, others
}

// importImage spools the caller's archive, imports it on the first target,
// then on every other live node.
func (r *Router) importImage(p auth.Principal, srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	first := new(berthv1.ImportImageRequest)
	if err := ss.RecvMsg(first); err != nil || first.GetHeader() == nil {
		if r.cfg.Member != nil {
			// The node's handler answers a stream without a header.
			return handler(srv, &replayStream{ServerStream: ss, first: firstOrNil(first, err)})
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header: the first message must be the header", map[string]string{"field": "header"})
	}
	if self, others := r.imageTargets(); self != nil && len(others) == 0 {
		// No other node: nothing to spool for.
		st := &importAlone{replayStream: replayStream{ServerStream: ss, first: first}}
		if err := handler(srv, st); err != nil {
			return err
		}
		if st.resp == nil {
			return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "the node's ImportImage ended without a response", nil)
		}
		st.resp.Nodes = []*berthv1.ImageNodeResult{{NodeId: self.ID, Ok: true}}
		r.awaitPublished(ctx, imageNames(st.resp), st.resp.Nodes)
		return ss.SendMsg(st.resp)
	}
	spool, err := spoolArchive(ss)
	if err != nil {
		return err
	}
	defer os.Remove(spool)
	header := first.GetHeader()
	send := func(ctx context.Context, n NodeRecord, _ bool) (proto.Message, error) {
		return r.importOn(ctx, p, n, header, spool)
	}
	local := func() (proto.Message, error) {
		f, err := os.Open(spool)
		if err != nil {
			return nil, fmt.Errorf("cluster: reopen the spooled archive: %w", err)
		}
		defer f.Close()
		st := &archiveStream{ServerStream: ss, header: header, archive: f}
		if err := handler(srv, st); err != nil {
			return nil, err
		}
		return st.resp, nil
	}
	resp, results, err := r.fanOut(ctx, local, send)
	if err != nil {
		return err
	}
	out := resp.(*berthv1.ImportImageResponse)
	r.awaitPublished(ctx, imageNames(out), results)
	out.Nodes = results
	return ss.SendMsg(out)
}

// importAlone is the caller's stream of an import on a node that is the
// fleet's only live one: the node's handler reads it as it is, and its
// response is kept.
type importAlone struct {
	replayStream
	resp *berthv1.ImportImageResponse
}

func (s *importAlone) SendMsg(m any) error {
	s.resp, _ = m.(*berthv1.ImportImageResponse)
	return nil
}

func imageNames(resp *berthv1.ImportImageResponse) []string {
	var names []string
	for _, img := range resp.GetImages() {
		names = append(names, img.GetName())
	}
	return names
}

func firstOrNil(m proto.Message, err error) proto.Message {
	if err != nil {
		return nil
	}
	return m
}

// spoolArchive writes the archive chunks the caller sends after the
// header to a temporary file and returns its path.
func spoolArchive(ss grpc.ServerStream) (string, error) {
	f, err := os.CreateTemp("", "berth-import-*.archive")
	if err != nil {
		return "", rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, fmt.Sprintf("cannot spool the image archive for the fleet's nodes: %v", err), nil)
	}
	defer f.Close()
	for {
		msg := new(berthv1.ImportImageRequest)
		err := ss.RecvMsg(msg)
		if errors.Is(err, io.EOF) {
			return f.Name(), nil
		}
		switch {
		case err != nil:
		case msg.GetHeader() != nil:
			err = rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header: only the first message may be a header", map[string]string{"field": "header"})
		default:
			if _, werr := f.Write(msg.GetChunk()); werr != nil {
				err = rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, fmt.Sprintf("cannot spool the image archive for the fleet's nodes: %v", werr), nil)
			}
		}
		if err != nil {
			os.Remove(f.Name())
			return "", err
		}
	}
}

// archiveStream feeds a node's own ImportImage handler the header and
// then the spooled archive, and keeps its response.
type archiveStream struct {
	grpc.ServerStream
	header  *berthv1.ImportImageHeader
	archive io.Reader
	sent    bool
	resp    *berthv1.ImportImageResponse
}

func (s *archiveStream) RecvMsg(m any) error {
	req, ok := m.(*berthv1.ImportImageRequest)
	if !ok {
		return fmt.Errorf("cluster: ImportImage receives %T", m)
	}
	if !s.sent {
		s.sent = true
		req.Part = &berthv1.ImportImageRequest_Header{Header: s.header}
		return nil
	}
	buf := make([]byte, importChunk)
	n, err := io.ReadFull(s.archive, buf)
	if n == 0 {
		if err == nil || errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return err
	}
	req.Part = &berthv1.ImportImageRequest_Chunk{Chunk: buf[:n]}
	return nil
}

func (s *archiveStream) SendMsg(m any) error {
	s.resp, _ = m.(*berthv1.ImportImageResponse)
	return nil
}

// importOn sends the spooled archive to node n as p.
func (r *Router) importOn(ctx context.Context, p auth.Principal, n NodeRecord, header *berthv1.ImportImageHeader, spool string) (proto.Message, error) {
	f, err := os.Open(spool)
	if err != nil {
		return nil, fmt.Errorf("cluster: reopen the spooled archive: %w", err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := r.peerStream(ctx, p, n, berthv1.ImageService_ImportImage_FullMethodName, &grpc.StreamDesc{ClientStreams: true})
	if err != nil {
		return nil, err
	}
	src := &archiveStream{header: header, archive: f}
	for {
		req := new(berthv1.ImportImageRequest)
		if err := src.RecvMsg(req); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("cluster: read the spooled archive: %w", err)
		}
		if err := cs.SendMsg(req); err != nil {
			break // the node ended the call: its status follows
		}
	}
	if err := cs.CloseSend(); err != nil {
		return nil, r.imagePeerError(n, err)
	}
	resp := new(berthv1.ImportImageResponse)
	if err := cs.RecvMsg(resp); err != nil {
		return nil, r.imagePeerError(n, err)
	}
	return resp, nil
}

// peerStream opens a call of method on node n as p.
func (r *Router) peerStream(ctx context.Context, p auth.Principal, n NodeRecord, method string, desc *grpc.StreamDesc) (grpc.ClientStream, error) {
	conn, ready, err := r.cfg.Peers.ready(ctx, n)
	if err != nil {
		return nil, err
	}
	if !ready {
		return nil, status.Errorf(codes.Unavailable, "node %s did not answer: no connection to %s", n.ID, n.Address)
	}
	desc.StreamName = method
	cs, err := conn.NewStream(forwarded(ctx, p), desc, method)
	if err != nil {
		return nil, r.imagePeerError(n, err)
	}
	return cs, nil
}

// imagePeerError is the error of an image call node n failed: its own
// berth status as it is, anything else (a broken connection) said to be
// the node's.
func (r *Router) imagePeerError(n NodeRecord, err error) error {
	if rpcstatus.Reason(err) != "" {
		return err
	}
	st := status.Convert(err)
	return status.Errorf(st.Code(), "node %s: %s", n.ID, st.Message())
}

// pullImage pulls on the first target, relaying its progress to the
// caller, then on every other live node; the last message carries the
// image and what each node made of the pull.
func (r *Router) pullImage(p auth.Principal, srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	req := new(berthv1.PullImageRequest)
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	local := func() (proto.Message, error) {
		st := &pullStream{replayStream: replayStream{ServerStream: ss, first: req}, relay: ss}
		if err := handler(srv, st); err != nil {
			return nil, err
		}
		return st.last, nil
	}
	send := func(ctx context.Context, n NodeRecord, first bool) (proto.Message, error) {
		var relay grpc.ServerStream
		if first {
			// A gateway relays the progress of its first target.
			relay = ss
		}
		return r.pullOn(ctx, p, n, req, relay)
	}
	resp, results, err := r.fanOut(ctx, local, send)
	if err != nil {
		return err
	}
	last := resp.(*berthv1.PullImageResponse)
	r.awaitPublished(ctx, []string{last.GetImage().GetName()}, results)
	last.Nodes = results
	return ss.SendMsg(last)
}

// pullStream hands a node's own PullImage handler the request, relays its
// progress and keeps its last message (the one with the image).
type pullStream struct {
	replayStream
	relay grpc.ServerStream // nil: progress is dropped
	last  *berthv1.PullImageResponse
}

func (s *pullStream) SendMsg(m any) error {
	resp, _ := m.(*berthv1.PullImageResponse)
	if resp.GetImage() != nil {
		s.last = resp
		return nil
	}
	if s.relay == nil {
		return nil
	}
	return s.relay.SendMsg(m)
}

// pullOn makes node n pull req as p, relaying its progress to relay (nil:
// dropped).
func (r *Router) pullOn(ctx context.Context, p auth.Principal, n NodeRecord, req *berthv1.PullImageRequest, relay grpc.ServerStream) (proto.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := r.peerStream(ctx, p, n, berthv1.ImageService_PullImage_FullMethodName, &grpc.StreamDesc{ServerStreams: true})
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, r.imagePeerError(n, err)
	}
	if err := cs.CloseSend(); err != nil {
		return nil, r.imagePeerError(n, err)
	}
	out := &pullStream{relay: relay}
	for {
		m := new(berthv1.PullImageResponse)
		if err := cs.RecvMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, r.imagePeerError(n, err)
		}
		if err := out.SendMsg(m); err != nil {
			return nil, err
		}
	}
	if out.last == nil {
		return nil, status.Errorf(codes.Internal, "node %s ended PullImage without the image", n.ID)
	}
	return out.last, nil
}

// fanOut runs an image call on the first target — this node (local), or
// on a gateway the first live node that answers with a berth status — and,
// when it succeeds, on every other live node with send, imageFanout at a
// time. It returns the first target's response and every node's result,
// ordered by node id.
//
// send's first is true for the calls made to find the first target.
func (r *Router) fanOut(ctx context.Context, local func() (proto.Message, error), send func(ctx context.Context, n NodeRecord, first bool) (proto.Message, error)) (proto.Message, []*berthv1.ImageNodeResult, error) {
	self, others := r.imageTargets()
	var results []*berthv1.ImageNodeResult
	var resp proto.Message
	var err error
	if self != nil {
		if resp, err = local(); err != nil {
			return nil, nil, err
		}
		results = append(results, &berthv1.ImageNodeResult{NodeId: self.ID, Ok: true})
	} else {
		for len(others) > 0 && resp == nil {
			n := others[0]
			others = others[1:]
			resp, err = send(ctx, n, true)
			switch {
			case err == nil:
				results = append(results, &berthv1.ImageNodeResult{NodeId: n.ID, Ok: true})
			case rpcstatus.Reason(err) != "" || ctx.Err() != nil:
				return nil, nil, err
			default:
				results = append(results, nodeResult(n.ID, err))
			}
		}
		if resp == nil {
			return nil, nil, rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable, "no node of the fleet answered: none holds a lease, or none could be reached", nil)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, imageFanout)
	for _, n := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := send(ctx, n, false)
			res := &berthv1.ImageNodeResult{NodeId: n.ID, Ok: true}
			if err != nil {
				res = nodeResult(n.ID, err)
				r.log.WarnContext(ctx, "cluster: a node did not store an image sent through the fleet", slog.String("node_id", n.ID), slog.Any("error", err))
			}
			mu.Lock()
			results = append(results, res)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(results, func(i, j int) bool { return results[i].GetNodeId() < results[j].GetNodeId() })
	return resp, results, nil
}

func nodeResult(node string, err error) *berthv1.ImageNodeResult {
	st := status.Convert(err)
	return &berthv1.ImageNodeResult{NodeId: node, ErrorCode: codeName(st.Code()), ErrorReason: rpcstatus.Reason(err), ErrorMessage: st.Message()}
}

// codeName is a gRPC code as the canonical upper-case name.
func codeName(c codes.Code) string {
	names := map[codes.Code]string{
		codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
		codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
		codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
		codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
		codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
		codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
	}
	if n, ok := names[c]; ok {
		return n
	}
	return c.String()
}

// awaitPublished waits, at most imagePublishWait, until every node that
// stored names (results) lists them in its record.
func (r *Router) awaitPublished(ctx context.Context, names []string, results []*berthv1.ImageNodeResult) {
	deadline := time.NewTimer(imagePublishWait)
	defer deadline.Stop()
	for {
		live := make(map[string]NodeRecord)
		for _, n := range r.cfg.Directory.LiveNodes() {
			live[n.ID] = n
		}
		missing := ""
		for _, res := range results {
			if !res.GetOk() {
				continue
			}
			for _, name := range names {
				if n, ok := live[res.GetNodeId()]; !ok || !n.hasImage(name) {
					missing = res.GetNodeId()
				}
			}
		}
		if missing == "" {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			r.log.WarnContext(ctx, "cluster: a node stored an image but has not published it yet", slog.String("node_id", missing), slog.Any("images", names))
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
