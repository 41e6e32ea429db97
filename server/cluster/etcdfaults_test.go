package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// stoppableEtcd is an embedded etcd of a test's own that the test stops
// and starts again on the same data directory and URLs, as an operator's
// etcd that is restarted, or away for a while.
type stoppableEtcd struct {
	t                  *testing.T
	dir                string
	clientURL, peerURL string
	e                  *Embedded
}

func newStoppableEtcd(t *testing.T) *stoppableEtcd {
	t.Helper()
	dir, err := os.MkdirTemp("", "berth-etcd-faults")
	if err != nil {
		t.Fatal(err)
	}
	s := &stoppableEtcd{t: t, dir: dir, clientURL: freeURL(t), peerURL: freeURL(t)}
	t.Cleanup(func() {
		s.stop()
		os.RemoveAll(dir)
	})
	return s
}

func (s *stoppableEtcd) start() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := StartEmbedded(ctx, EmbedConfig{Dir: s.dir, ClientURL: s.clientURL, PeerURL: s.peerURL}, testLog())
	if err != nil {
		s.t.Fatal(err)
	}
	s.e = e
}

func (s *stoppableEtcd) stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// client returns a client of it that does not need it to answer now.
func (s *stoppableEtcd) client() *clientv3.Client {
	s.t.Helper()
	cli, err := Connect(context.Background(), StoreConfig{Endpoints: []string{s.clientURL}, DialTimeout: time.Second}, testLog())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { cli.Close() })
	return cli
}

// wantClusterUnavailable fails the test unless err is UNAVAILABLE
// CLUSTER_UNAVAILABLE with a positive RetryInfo, answered within max.
func wantClusterUnavailable(t *testing.T, what string, err error, took, max time.Duration) {
	t.Helper()
	if took > max {
		t.Errorf("%s answered after %v, want within %v", what, took, max)
	}
	if status.Code(err) != codes.Unavailable || rpcstatus.Reason(err) != rpcstatus.ReasonClusterUnavailable {
		t.Errorf("%s = %v, want UNAVAILABLE CLUSTER_UNAVAILABLE", what, err)
		return
	}
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return
		}
	}
	t.Errorf("%s = %v: no RetryInfo with a positive delay", what, err)
}

// unbounded returns a context without deadline that the test still ends
// after a while, far above what it asserts.
func unbounded(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	timer := time.AfterFunc(20*time.Second, cancel)
	t.Cleanup(func() { timer.Stop(); cancel() })
	return ctx
}

const testBudget = time.Second

// TestMemberStartsWithoutEtcd: a node whose etcd does not answer starts
// anyway (issue 22: berthd exited 10 s after start): Start returns within
// the etcd budget, the node serves the sandboxes in its own state (the
// router answers for them here, without asking etcd), refuses claims with a
// typed error at once, and joins the fleet when etcd answers: registered,
// its sandboxes recorded on it, records it held before kept, nothing
// released that it holds.
func TestMemberStartsWithoutEtcd(t *testing.T) {
	s := newStoppableEtcd(t)
	s.start()
	cli := s.client()
	ctx := context.Background()
	prefix := "/offline/"
	k := keys{prefix}
	if _, err := cli.Put(ctx, k.sandbox("kept"), `{"node":"a","owner":"alice"}`); err != nil {
		t.Fatal(err)
	}
	s.stop()

	local := &fakeLocal{holds: map[string]string{"kept": "alice", "made-offline": "bob"}}
	m, err := NewMember(Config{NodeID: "a", Address: "a:1", Prefix: prefix, LeaseTTL: 2 * time.Second, PublishInterval: 100 * time.Millisecond, EtcdBudget: testBudget}, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := m.Start(unbounded(t), local); err != nil {
		t.Fatalf("Start without etcd = %v, want the node to start and wait for etcd", err)
	}
	if took := time.Since(start); took > testBudget+time.Second {
		t.Errorf("Start without etcd took %v, want within the %v budget", took, testBudget)
	}
	t.Cleanup(m.Close)
	dir, err := NewDirectory(NewEtcdStore(cli), prefix, testLog())
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := dir.Start(unbounded(t), testBudget); err != nil {
		t.Fatalf("Directory.Start without etcd = %v, want it to start and follow when etcd answers", err)
	}
	if took := time.Since(start); took > testBudget+time.Second {
		t.Errorf("Directory.Start without etcd took %v", took)
	}
	t.Cleanup(dir.Close)
	r := NewRouter(RouterConfig{Member: m, Directory: dir, EtcdBudget: testBudget, Log: testLog()})
	for _, id := range []string{"kept", "made-offline"} {
		start = time.Now()
		_, here, err := r.holder(unbounded(t), auth.Principal{Name: "alice"}, id)
		if err != nil || !here || time.Since(start) > 100*time.Millisecond {
			t.Errorf("holder(%s) without etcd = here %v, %v after %v; want served here at once", id, here, err, time.Since(start))
		}
	}
	start = time.Now()
	err = m.Claim(unbounded(t), "new", "alice")
	if rpcstatus.Reason(err) != rpcstatus.ReasonNodeNotAccepting && rpcstatus.Reason(err) != rpcstatus.ReasonClusterUnavailable || time.Since(start) > testBudget+time.Second {
		t.Errorf("Claim without etcd = %v after %v, want NODE_NOT_ACCEPTING or CLUSTER_UNAVAILABLE within the budget", err, time.Since(start))
	}

	s.start()
	waitLive(t, dir, "a", "a:1", 15*time.Second, "after etcd answered")
	for id, owner := range local.holds {
		// The node's record goes live first; its sandboxes' records are
		// claimed after it: wait (bounded) for each.
		deadline := time.Now().Add(15 * time.Second)
		rec, ok, err := dir.Sandbox(ctx, id)
		for (err != nil || !ok) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			rec, ok, err = dir.Sandbox(ctx, id)
		}
		if err != nil || !ok || rec.Node != "a" || rec.Owner != owner {
			t.Errorf("record of %s after joining = %+v, %v, %v; want on a, owned by %s", id, rec, ok, err, owner)
		}
		if !m.Holds(id) {
			t.Errorf("the node does not hold %s after joining", id)
		}
	}
	if err := m.Claim(ctx, "new", "alice"); err != nil {
		t.Errorf("Claim after joining = %v", err)
	}
}

// waitLive waits, at most within, until node id is live at address.
func waitLive(t *testing.T, dir *Directory, id, address string, within time.Duration, when string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if n, live, err := dir.LiveNode(context.Background(), id); err == nil && live && n.Address == address {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s was not live at %s within %v %s", id, address, within, when)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaseOutlivesEtcdRestart: etcd restarted after an outage longer than
// the lease time (it renews the leases it had at its start): the node keeps
// its lease and takes sandboxes as soon as etcd answers, instead of
// registering again and waiting for its own old registration to expire.
func TestLeaseOutlivesEtcdRestart(t *testing.T) {
	s := newStoppableEtcd(t)
	s.start()
	cli := s.client()
	const ttl = 2 * time.Second
	m, err := NewMember(Config{NodeID: "a", Address: "a:1", Prefix: "/restart/", LeaseTTL: ttl, PublishInterval: 100 * time.Millisecond, EtcdBudget: testBudget}, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background(), &fakeLocal{holds: map[string]string{"kept": "alice"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	m.mu.Lock()
	lease := m.lease
	m.mu.Unlock()
	s.stop()
	time.Sleep(ttl + 2*time.Second) // past the client's keep-alive deadline
	s.start()
	back := time.Now()
	var err2 error
	for time.Since(back) < 10*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err2 = m.Claim(ctx, "after", "alice")
		cancel()
		if err2 == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err2 != nil {
		t.Fatalf("Claim after etcd came back = %v", err2)
	}
	took := time.Since(back)
	t.Logf("the node took a sandbox %v after etcd came back", took.Round(10*time.Millisecond))
	if took > ttl {
		t.Errorf("the node took a sandbox %v after etcd came back, want within the %v lease time", took, ttl)
	}
	m.mu.Lock()
	now := m.lease
	m.mu.Unlock()
	if now != lease {
		t.Errorf("lease after the restart = %x, want the same lease %x kept", now, lease)
	}
}

// TestStoreCallsWithinBudget: with etcd away, a claim and the NodeService
// calls fail UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo within the
// etcd budget, even for a caller without a deadline, instead of hanging.
func TestStoreCallsWithinBudget(t *testing.T) {
	s := newStoppableEtcd(t)
	s.start()
	cli := s.client()
	prefix := "/budget-member/"
	m, err := NewMember(Config{NodeID: "a", Address: "a:1", Prefix: prefix, LeaseTTL: 10 * time.Second, PublishInterval: 100 * time.Millisecond, EtcdBudget: testBudget}, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background(), &fakeLocal{holds: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	nodes := NewNodeService(NewEtcdStore(cli), prefix).WithEtcdBudget(testBudget)
	s.stop()
	max := testBudget + 1500*time.Millisecond

	start := time.Now()
	err = m.Claim(unbounded(t), "sb", "alice")
	wantClusterUnavailable(t, "Claim", err, time.Since(start), max)
	start = time.Now()
	_, err = nodes.DrainNode(unbounded(t), &berthv1.DrainNodeRequest{NodeId: "a"})
	wantClusterUnavailable(t, "DrainNode", err, time.Since(start), max)
	start = time.Now()
	_, err = nodes.UndrainNode(unbounded(t), &berthv1.UndrainNodeRequest{NodeId: "a"})
	wantClusterUnavailable(t, "UndrainNode", err, time.Since(start), max)
	start = time.Now()
	_, err = nodes.ListNodes(unbounded(t), &berthv1.ListNodesRequest{})
	wantClusterUnavailable(t, "ListNodes", err, time.Since(start), max)
}

// TestPeersKeepConnectionAcrossRegistration: a node that registered again
// under a new lease at the same address keeps its connection, so the
// streams routed over it go on (issue 22: they ended CANCELED "grpc: the
// client connection is closing" when nodes re-registered after an etcd
// blip).
func TestPeersKeepConnectionAcrossRegistration(t *testing.T) {
	p := NewPeers(PeerCredentials{}, time.Second)
	t.Cleanup(p.Close)
	first, _, err := p.connOf(NodeRecord{ID: "a", Address: "127.0.0.1:1", Lease: 1})
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := p.connOf(NodeRecord{ID: "a", Address: "127.0.0.1:1", Lease: 2})
	if err != nil {
		t.Fatal(err)
	}
	if again != first || first.GetState() == connectivity.Shutdown {
		t.Errorf("a new lease at the same address: connection replaced %v, old one %v; want it kept", again != first, first.GetState())
	}
	moved, _, err := p.connOf(NodeRecord{ID: "a", Address: "127.0.0.1:2", Lease: 2})
	if err != nil {
		t.Fatal(err)
	}
	if moved == first {
		t.Error("a node at a new address got its old address's connection")
	}
}

// TestPlacementWithoutLeases: when every node that could take a sandbox
// refused because it held no lease at that instant (all leases lapsed
// together after etcd came back), or no node holds one, a create fails
// UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo, not FLEET_BUSY with
// limit 0 and in use 0 (issue 22).
func TestPlacementWithoutLeases(t *testing.T) {
	r := NewRouter(RouterConfig{Log: testLog()})
	req := &berthv1.CreateSandboxRequest{Image: "img"}
	noLease := func(node string) error {
		return notAccepting(node, "sb", false)
	}
	pl := placement{nodes: 2, matching: 2, withImage: 2, candidates: []NodeRecord{{ID: "a"}, {ID: "b"}}}
	err := r.placementRefused(req, "sb", pl, noLease("b"), 2)
	wantClusterUnavailable(t, "every candidate without a lease", err, 0, time.Second)
	err = r.placementRefused(req, "sb", placement{}, nil, 0)
	wantClusterUnavailable(t, "no live node", err, 0, time.Second)
	// Draining is a refusal of its own: FLEET_BUSY as before.
	err = r.placementRefused(req, "sb", pl, notAccepting("b", "sb", true), 0)
	if rpcstatus.Reason(err) != rpcstatus.ReasonFleetBusy {
		t.Errorf("every candidate draining = %v, want FLEET_BUSY", err)
	}
}
