package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// imageNode is a fleet node whose ImageService stores what it is sent
// (the archive's digest, the pulled reference) and publishes the image in
// its record, as a berthd does; or refuses every call with refuse.
type imageNode struct {
	berthv1.UnimplementedImageServiceServer
	id     string
	member *Member
	refuse error

	mu       sync.Mutex
	images   []string
	archives [][32]byte // digests of the archives imported
	callers  []string   // the forwarded principal of each call
}

func (n *imageNode) Usage(context.Context) (Usage, error)             { return Usage{}, nil }
func (n *imageNode) Remove(context.Context, string) error             { return nil }
func (n *imageNode) Holds(context.Context) (map[string]string, error) { return nil, nil }
func (n *imageNode) Health() Health                                   { return Health{} }
func (n *imageNode) Images(context.Context) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.images), nil
}

func (n *imageNode) stored(ctx context.Context, name string, digest [32]byte) {
	n.mu.Lock()
	n.images = append(n.images, name)
	n.archives = append(n.archives, digest)
	n.callers = append(n.callers, metadata.ValueFromIncomingContext(ctx, auth.ForwardedHeader)...)
	n.mu.Unlock()
	if n.member != nil {
		n.member.Kick()
	}
}

func (n *imageNode) ImportImage(stream berthv1.ImageService_ImportImageServer) error {
	if n.refuse != nil {
		return n.refuse
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := sha256.New()
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		h.Write(m.GetChunk())
	}
	name := first.GetHeader().GetName()
	n.stored(stream.Context(), name, [32]byte(h.Sum(nil)))
	return stream.SendAndClose(&berthv1.ImportImageResponse{Images: []*berthv1.Image{{Name: name, Digest: "sha256:" + n.id}}})
}

func (n *imageNode) PullImage(req *berthv1.PullImageRequest, stream berthv1.ImageService_PullImageServer) error {
	if n.refuse != nil {
		return n.refuse
	}
	if err := stream.Send(&berthv1.PullImageResponse{DownloadedBytes: 1, TotalBytes: 2}); err != nil {
		return err
	}
	n.stored(stream.Context(), req.GetReference(), [32]byte{})
	return stream.Send(&berthv1.PullImageResponse{Image: &berthv1.Image{Name: req.GetReference(), Digest: "sha256:" + n.id}})
}

// startImageNode serves n's ImageService on 127.0.0.1 and registers it in
// the fleet; with down, it registers at an address where nothing listens.
func startImageNode(t *testing.T, cli *clientv3.Client, prefix string, n *imageNode, down bool) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if down {
		lis.Close()
	} else {
		srv := grpc.NewServer()
		berthv1.RegisterImageServiceServer(srv, n)
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
	}
	m, err := NewMember(Config{NodeID: n.id, Address: lis.Addr().String(), Prefix: prefix, LeaseTTL: 2 * time.Second, PublishInterval: 10 * time.Second}, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Start(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	n.member = m
}

// callerStream is the caller's side of a streaming call made through an
// interceptor: it sends in, then io.EOF, and keeps what it is sent.
type callerStream struct {
	ctx  context.Context
	in   []any
	sent []any
}

func (s *callerStream) Context() context.Context     { return s.ctx }
func (s *callerStream) SetHeader(metadata.MD) error  { return nil }
func (s *callerStream) SendHeader(metadata.MD) error { return nil }
func (s *callerStream) SetTrailer(metadata.MD)       {}
func (s *callerStream) SendMsg(m any) error {
	s.sent = append(s.sent, m)
	return nil
}
func (s *callerStream) RecvMsg(m any) error {
	if len(s.in) == 0 {
		return io.EOF
	}
	src := s.in[0]
	s.in = s.in[1:]
	switch dst := m.(type) {
	case *berthv1.ImportImageRequest:
		dst.Part = src.(*berthv1.ImportImageRequest).Part
	case *berthv1.PullImageRequest:
		dst.Reference = src.(*berthv1.PullImageRequest).GetReference()
	}
	return nil
}

// imageFleet is four nodes: a and b store images, c does not answer, d
// refuses (as a node does an admin call of a principal that is no admin
// there).
func imageFleet(t *testing.T) (nodes map[string]*imageNode, directory *Directory, cli *clientv3.Client, prefix string) {
	cli, prefix = etcd(t)
	nodes = map[string]*imageNode{"a": {id: "a"}, "b": {id: "b"}, "c": {id: "c"},
		"d": {id: "d", refuse: rpcstatus.Error(codes.PermissionDenied, rpcstatus.ReasonNotPermitted, "ImportImage is for admins", nil)}}
	for _, id := range []string{"a", "b", "c", "d"} {
		startImageNode(t, cli, prefix, nodes[id], id == "c")
	}
	directory = startDirectory(t, cli, prefix)
	for deadline := time.Now().Add(10 * time.Second); len(directory.LiveNodes()) < 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("live nodes %v, want a to d", directory.LiveNodes())
		}
	}
	return nodes, directory, cli, prefix
}

// checkResults checks the node results of an image call through the
// fleet: a and b stored it, c and d are named with why not.
func checkResults(t *testing.T, what string, got []*berthv1.ImageNodeResult) {
	t.Helper()
	if len(got) != 4 || got[0].GetNodeId() != "a" || !got[0].GetOk() || got[1].GetNodeId() != "b" || !got[1].GetOk() ||
		got[2].GetNodeId() != "c" || got[2].GetOk() || got[2].GetErrorCode() != "UNAVAILABLE" ||
		got[3].GetNodeId() != "d" || got[3].GetOk() || got[3].GetErrorCode() != "PERMISSION_DENIED" || got[3].GetErrorReason() != rpcstatus.ReasonNotPermitted {
		t.Errorf("%s: node results %v; want a and b ok, c UNAVAILABLE, d PERMISSION_DENIED NOT_PERMITTED", what, got)
	}
}

// published checks that the nodes that stored name list it in their
// records as the directory sees them when the call returned.
func published(t *testing.T, what string, directory *Directory, name string) {
	t.Helper()
	for _, n := range directory.LiveNodes() {
		if want := n.ID == "a" || n.ID == "b"; n.hasImage(name) != want {
			t.Errorf("%s: when the call returned, node %s's record lists %v, want %s listed: %v", what, n.ID, n.Images, name, want)
		}
	}
}

// TestImagesThroughGateway imports an archive (several chunks) and pulls
// an image through a gateway's router (issue 22 part 6): every live node
// is asked as the caller; the answer names those that did not store it,
// and comes once those that did published it.
func TestImagesThroughGateway(t *testing.T) {
	nodes, directory, _, _ := imageFleet(t)
	peers := NewPeers(PeerCredentials{}, time.Second)
	t.Cleanup(peers.Close)
	r := NewRouter(RouterConfig{Directory: directory, Peers: peers, Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "ops", Admin: true})
	noHandler := func(any, grpc.ServerStream) error {
		t.Error("a gateway called its own image handler")
		return nil
	}

	archive := make([]byte, 5<<20+123)
	rand.Read(archive)
	in := []any{&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: "img:1"}}}}
	for rest := archive; len(rest) > 0; {
		n := min(len(rest), 2<<20)
		in = append(in, &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: rest[:n]}})
		rest = rest[n:]
	}
	ss := &callerStream{ctx: ctx, in: in}
	err := r.ImageStreamInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: berthv1.ImageService_ImportImage_FullMethodName, IsClientStream: true}, noHandler)
	if err != nil || len(ss.sent) != 1 {
		t.Fatalf("ImportImage through the gateway = %v, sent %v", err, ss.sent)
	}
	resp := ss.sent[0].(*berthv1.ImportImageResponse)
	if len(resp.GetImages()) != 1 || resp.GetImages()[0].GetDigest() != "sha256:a" {
		t.Errorf("ImportImage answered with %v; want node a's image (the first node)", resp.GetImages())
	}
	checkResults(t, "ImportImage", resp.GetNodes())
	published(t, "ImportImage", directory, "img:1")
	want := sha256.Sum256(archive)
	for _, id := range []string{"a", "b"} {
		n := nodes[id]
		if len(n.archives) != 1 || !bytes.Equal(n.archives[0][:], want[:]) || !slices.Equal(n.callers, []string{"ops"}) {
			t.Errorf("node %s got %d archives (the caller's: %v), forwarded for %v; want the caller's archive once, for ops", id, len(n.archives), len(n.archives) == 1 && n.archives[0] == want, n.callers)
		}
	}

	ss = &callerStream{ctx: ctx, in: []any{&berthv1.PullImageRequest{Reference: "reg/img:2"}}}
	err = r.ImageStreamInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: berthv1.ImageService_PullImage_FullMethodName, IsServerStream: true}, noHandler)
	if err != nil || len(ss.sent) != 2 {
		t.Fatalf("PullImage through the gateway = %v, sent %v; want node a's progress, then the image", err, ss.sent)
	}
	progress, last := ss.sent[0].(*berthv1.PullImageResponse), ss.sent[1].(*berthv1.PullImageResponse)
	if progress.GetImage() != nil || progress.GetTotalBytes() != 2 || last.GetImage().GetName() != "reg/img:2" {
		t.Errorf("PullImage sent %v then %v; want progress, then the image", progress, last)
	}
	checkResults(t, "PullImage", last.GetNodes())
	published(t, "PullImage", directory, "reg/img:2")

	// ListImages on the gateway: what the records hold, by name.
	list, err := r.ImageUnaryInterceptor()(ctx, &berthv1.ListImagesRequest{}, &grpc.UnaryServerInfo{FullMethod: berthv1.ImageService_ListImages_FullMethodName},
		func(context.Context, any) (any, error) { return nil, errors.New("the gateway's handler was called") })
	if err != nil {
		t.Fatal(err)
	}
	imgs := list.(*berthv1.ListImagesResponse).GetImages()
	if len(imgs) != 2 || imgs[0].GetName() != "img:1" || !slices.Equal(imgs[0].GetNodeIds(), []string{"a", "b"}) || imgs[1].GetName() != "reg/img:2" {
		t.Errorf("ListImages on the gateway = %v; want img:1 and reg/img:2 on a and b", imgs)
	}
}

// TestImportThroughNode imports through node a's router: a imports with
// its own handler first, then the others get the archive. A bad archive
// (a's handler fails) fails the call and reaches no other node.
func TestImportThroughNode(t *testing.T) {
	nodes, directory, _, _ := imageFleet(t)
	peers := NewPeers(PeerCredentials{}, time.Second)
	t.Cleanup(peers.Close)
	r := NewRouter(RouterConfig{Member: nodes["a"].member, Directory: directory, Peers: peers, Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "ops", Admin: true})
	local := func(_ any, ss grpc.ServerStream) error {
		return nodes["a"].ImportImage(&grpc.GenericServerStream[berthv1.ImportImageRequest, berthv1.ImportImageResponse]{ServerStream: ss})
	}
	info := &grpc.StreamServerInfo{FullMethod: berthv1.ImageService_ImportImage_FullMethodName, IsClientStream: true}
	header := &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: "img:3"}}}
	ss := &callerStream{ctx: ctx, in: []any{header, &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: []byte("archive")}}}}
	if err := r.ImageStreamInterceptor()(nil, ss, info, local); err != nil || len(ss.sent) != 1 {
		t.Fatalf("ImportImage through node a = %v, sent %v", err, ss.sent)
	}
	checkResults(t, "ImportImage through a", ss.sent[0].(*berthv1.ImportImageResponse).GetNodes())
	published(t, "ImportImage through a", directory, "img:3")

	bad := rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonImageArchive, "not an archive", nil)
	ss = &callerStream{ctx: ctx, in: []any{header}}
	err := r.ImageStreamInterceptor()(nil, ss, info, func(any, grpc.ServerStream) error { return bad })
	if rpcstatus.Reason(err) != rpcstatus.ReasonImageArchive || len(ss.sent) != 0 {
		t.Errorf("a bad archive through node a = %v, sent %v; want a's IMAGE_ARCHIVE_INVALID", err, ss.sent)
	}
	if got := len(nodes["b"].archives); got != 1 {
		t.Errorf("node b got %d archives, want 1: a bad archive must reach no other node", got)
	}
}

// TestImportAlone imports through the fleet's only live node: its handler
// reads the caller's stream as it is (nothing spooled), and the answer
// names it and comes once it published the image.
func TestImportAlone(t *testing.T) {
	cli, prefix := etcd(t)
	solo := &imageNode{id: "solo"}
	startImageNode(t, cli, prefix, solo, false)
	directory := startDirectory(t, cli, prefix)
	r := NewRouter(RouterConfig{Member: solo.member, Directory: directory, Peers: NewPeers(PeerCredentials{}, time.Second), Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "ops", Admin: true})
	header := &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: "img:4"}}}
	ss := &callerStream{ctx: ctx, in: []any{header, &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: []byte("archive")}}}}
	local := func(_ any, ss grpc.ServerStream) error {
		return solo.ImportImage(&grpc.GenericServerStream[berthv1.ImportImageRequest, berthv1.ImportImageResponse]{ServerStream: ss})
	}
	err := r.ImageStreamInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: berthv1.ImageService_ImportImage_FullMethodName, IsClientStream: true}, local)
	if err != nil || len(ss.sent) != 1 {
		t.Fatalf("ImportImage through the only node = %v, sent %v", err, ss.sent)
	}
	resp := ss.sent[0].(*berthv1.ImportImageResponse)
	if nodes := resp.GetNodes(); len(nodes) != 1 || nodes[0].GetNodeId() != "solo" || !nodes[0].GetOk() || len(resp.GetImages()) != 1 {
		t.Errorf("ImportImage through the only node answered %v; want img:4 and solo ok", resp)
	}
	if live := directory.LiveNodes(); len(live) != 1 || !live[0].hasImage("img:4") {
		t.Errorf("when the call returned the fleet's records were %v; want solo listing img:4", live)
	}
	want := sha256.Sum256([]byte("archive"))
	if len(solo.archives) != 1 || solo.archives[0] != want {
		t.Errorf("solo got %d archives; want the caller's once", len(solo.archives))
	}
}
