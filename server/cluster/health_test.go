package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// peerNode is another node of the fleet as the router reaches it: a real
// gRPC server with a SandboxService of canned answers.
type peerNode struct {
	berthv1.UnimplementedSandboxServiceServer
	addr    string
	creates atomic.Int32
	// list answers ListSandboxes; nil lists nothing.
	list func(ctx context.Context) (*berthv1.ListSandboxesResponse, error)
}

func startPeerNode(t *testing.T) *peerNode {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &peerNode{addr: l.Addr().String()}
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, n)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return n
}

func (n *peerNode) CreateSandbox(_ context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	n.creates.Add(1)
	return &berthv1.CreateSandboxResponse{Sandbox: &berthv1.Sandbox{Id: req.GetSandboxId(), NodeId: "far"}}, nil
}

func (n *peerNode) ListSandboxes(ctx context.Context, _ *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	if n.list == nil {
		return &berthv1.ListSandboxesResponse{}, nil
	}
	return n.list(ctx)
}

// startMemberAt starts the membership of node id reached at addr, with
// local's usage, images and health.
func startMemberAt(t *testing.T, cli *clientv3.Client, prefix, id, addr string, local *fakeLocal) *Member {
	t.Helper()
	return startMemberCfg(t, cli, Config{NodeID: id, Address: addr, Prefix: prefix, LeaseTTL: 2 * time.Second, PublishInterval: 100 * time.Millisecond}, local)
}

// startMemberCfg starts the membership cfg describes, closed at cleanup.
func startMemberCfg(t *testing.T, cli *clientv3.Client, cfg Config, local Local) *Member {
	t.Helper()
	m, err := NewMember(cfg, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Start(ctx, local); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// waitNodes waits until the directory's watched view holds n nodes.
func waitNodes(t *testing.T, d *Directory, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(d.LiveNodes()) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("the directory sees %d nodes after 10s, want %d", len(d.LiveNodes()), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCreateRetriesNothingStarted: a create placed on a node that fails it
// for a reason that says nothing was started there and the fault is the
// node's own (its containerd does not answer, its sandbox pool or state
// disk is full) is sent to the next candidate within the request (issue 22:
// 68 of 68 creates failed CONTAINERD_UNAVAILABLE on one node while the
// others had room). A failure that may have left something, or that is
// the request's own, is returned as it is.
func TestCreateRetriesNothingStarted(t *testing.T) {
	img := "berth.dev/base:latest"
	notStarted := &berthv1.DependencyFailure{Dependency: berthv1.Dependency_DEPENDENCY_CONTAINERD, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}
	unknown := &berthv1.DependencyFailure{Dependency: berthv1.Dependency_DEPENDENCY_CONTAINERD, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE, Admitted: berthv1.Admitted_ADMITTED_UNKNOWN}
	diskFull := &berthv1.DependencyFailure{Dependency: berthv1.Dependency_DEPENDENCY_SERVER_DISK, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_FULL, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}
	for _, tc := range []struct {
		name  string
		err   error
		retry bool
	}{
		{"containerd unavailable, nothing started", rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonContainerdUnavailable, "read sandbox: containerd refused the connection", nil, notStarted), true},
		{"state disk full, nothing started", rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonServerDiskFull, "no space", nil, diskFull), true},
		{"sandbox pool full", rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonNoSpace, "no space left in the btrfs pool", map[string]string{"resource": "sandbox_pool"}), true},
		{"containerd failed midway", rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonContainerdUnavailable, "create task: containerd did not answer", nil, unknown), false},
		{"image unusable", rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, "bad /etc/passwd", nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, prefix := etcd(t)
			far := startPeerNode(t)
			// "near" is the least loaded, so it is tried first.
			near := startMemberAt(t, cli, prefix, "near", "127.0.0.1:1", &fakeLocal{images: []string{img}, holds: map[string]string{}, usage: Usage{MaxSandboxes: 10}})
			startMemberAt(t, cli, prefix, "far", far.addr, &fakeLocal{images: []string{img}, holds: map[string]string{}, usage: Usage{Sandboxes: 5, MaxSandboxes: 10}})
			directory := startDirectory(t, cli, prefix)
			waitNodes(t, directory, 2)
			peers := NewPeers(PeerCredentials{}, time.Second)
			t.Cleanup(peers.Close)
			r := NewRouter(RouterConfig{Member: near, Directory: directory, Peers: peers, Log: testLog()})
			ctx, cancel := context.WithTimeout(auth.NewContext(context.Background(), auth.Principal{Name: "alice"}), 10*time.Second)
			defer cancel()
			here := 0
			resp, err := r.UnaryInterceptor()(ctx, &berthv1.CreateSandboxRequest{SandboxId: "sb-1", Image: img},
				&grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_CreateSandbox_FullMethodName},
				func(context.Context, any) (any, error) { here++; return nil, tc.err })
			if here != 1 {
				t.Errorf("the near node was asked %d times, want 1", here)
			}
			if !tc.retry {
				if status.Code(err) != status.Code(tc.err) || rpcstatus.Reason(err) != rpcstatus.Reason(tc.err) {
					t.Errorf("create = %v, %v; want the near node's error %v", resp, err, tc.err)
				}
				if n := far.creates.Load(); n != 0 {
					t.Errorf("the far node got %d creates, want none", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("create = %v, want it created on the far node", err)
			}
			if got := resp.(*berthv1.CreateSandboxResponse).GetSandbox().GetNodeId(); got != "far" {
				t.Errorf("created on %q, want far", got)
			}
			if n := far.creates.Load(); n != 1 {
				t.Errorf("the far node got %d creates, want 1", n)
			}
		})
	}
}

// TestPublishHealth: a node publishes a change of its health when it is
// kicked, before the next periodic publish, and an unhealthy node whose
// usage cannot be read (its containerd does not answer) still publishes
// its health, with the usage it published last, so that placement and
// ListNodes see it (issue 22: the node kept its lease and stayed "least
// loaded").
func TestPublishHealth(t *testing.T) {
	cli, prefix := etcd(t)
	local := &fakeLocal{holds: map[string]string{}, usage: Usage{Sandboxes: 3, MaxSandboxes: 10}}
	// No periodic publish within the test: only a kick publishes.
	m := startMemberCfg(t, cli, Config{NodeID: "a", Address: "a:1", Prefix: prefix, LeaseTTL: 10 * time.Second, PublishInterval: time.Hour}, local)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	directory := startDirectory(t, cli, prefix)
	waitRecord := func(what string, ok func(NodeRecord) bool) NodeRecord {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			nodes, err := directory.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(nodes) == 1 && ok(nodes[0]) {
				return nodes[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: record %+v after 5s", what, nodes)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitRecord("registered", func(n NodeRecord) bool { return n.Health.Healthy() && n.Sandboxes == 3 })

	since := time.Now().UTC().Truncate(time.Second)
	local.mu.Lock()
	local.health = Health{Reason: HealthContainerd, Message: "containerd does not answer", Since: since}
	local.usageErr = errors.New("containerd does not answer")
	local.mu.Unlock()
	m.Kick()
	rec := waitRecord("unhealthy", func(n NodeRecord) bool { return !n.Health.Healthy() })
	if rec.Health.Reason != HealthContainerd || !rec.Health.Since.Equal(since) || rec.Sandboxes != 3 || rec.MaxSandboxes != 10 {
		t.Errorf("record %+v, want health %s since %v with the last usage (3 of 10 sandboxes)", rec, HealthContainerd, since)
	}
	ns := NewNodeService(NewEtcdStore(cli), prefix)
	list, err := ns.ListNodes(ctx, &berthv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h := list.GetNodes()[0].GetHealth(); h.GetHealthy() || h.GetReason() != HealthContainerd || !h.GetSince().AsTime().Equal(since) {
		t.Errorf("ListNodes health %v, want unhealthy %s since %v", h, HealthContainerd, since)
	}

	local.mu.Lock()
	local.health, local.usageErr = Health{Since: time.Now()}, nil
	local.mu.Unlock()
	m.Kick()
	waitRecord("healthy again", func(n NodeRecord) bool { return n.Health.Healthy() })
}

// TestListBudget: ListSandboxes through an entry point answers within its
// list budget when a node does not answer (a frozen berthd: issue 22, the
// listing hung for everyone until the node's lease ran out), with the
// sandboxes of the nodes that answered and the others named in
// unreachable_nodes, as are lost nodes that hold the caller's sandboxes;
// never a silent partial list.
func TestListBudget(t *testing.T) {
	cli, prefix := etcd(t)
	frozen := startPeerNode(t)
	frozen.list = func(ctx context.Context) (*berthv1.ListSandboxesResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	fine := startPeerNode(t)
	fine.list = func(context.Context) (*berthv1.ListSandboxesResponse, error) {
		return &berthv1.ListSandboxesResponse{Sandboxes: []*berthv1.Sandbox{{Id: "sb-fine", NodeId: "fine"}}}, nil
	}
	startMemberAt(t, cli, prefix, "frozen", frozen.addr, &fakeLocal{holds: map[string]string{}})
	startMemberAt(t, cli, prefix, "fine", fine.addr, &fakeLocal{holds: map[string]string{}})
	ctx := context.Background()
	// A lost node holding one of alice's sandboxes and one of bob's, and
	// one holding only bob's.
	for id, rec := range map[string]string{"sb-lost": `{"node":"gone","owner":"alice"}`, "sb-bob": `{"node":"gone","owner":"bob"}`, "sb-bob2": `{"node":"gone-bob","owner":"bob"}`} {
		if _, err := cli.Put(ctx, keys{prefix}.sandbox(id), rec); err != nil {
			t.Fatal(err)
		}
	}
	directory := startDirectory(t, cli, prefix)
	waitNodes(t, directory, 2)
	peers := NewPeers(PeerCredentials{}, time.Second)
	t.Cleanup(peers.Close)
	const budget = time.Second
	gateway := NewRouter(RouterConfig{Directory: directory, Peers: peers, ListBudget: budget, Log: testLog()})
	callCtx, cancel := context.WithTimeout(auth.NewContext(ctx, auth.Principal{Name: "alice"}), 30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := gateway.UnaryInterceptor()(callCtx, &berthv1.ListSandboxesRequest{},
		&grpc.UnaryServerInfo{FullMethod: berthv1.SandboxService_ListSandboxes_FullMethodName},
		func(context.Context, any) (any, error) { t.Error("a gateway listed locally"); return nil, nil })
	took := time.Since(start)
	if err != nil {
		t.Fatalf("ListSandboxes = %v, want the answering node's sandboxes", err)
	}
	if max := budget + time.Second; took > max {
		t.Errorf("ListSandboxes answered after %v, want within the %v budget (%v with margin)", took, budget, max)
	}
	list := resp.(*berthv1.ListSandboxesResponse)
	if len(list.GetSandboxes()) != 1 || list.GetSandboxes()[0].GetId() != "sb-fine" {
		t.Errorf("sandboxes %v, want sb-fine", list.GetSandboxes())
	}
	if got := list.GetUnreachableNodes(); fmt.Sprint(got) != "[frozen gone]" {
		t.Errorf("unreachable_nodes %v, want [frozen gone]", got)
	}
}
