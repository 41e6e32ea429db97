package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The tests run a real etcd: one embedded member per test binary.
var store struct {
	once sync.Once
	cli  *clientv3.Client
	err  error
}

func testLog() *slog.Logger {
	if os.Getenv("BERTH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func freeURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// etcd returns a client of the test binary's embedded etcd and a key
// prefix of the test's own.
func etcd(t *testing.T) (*clientv3.Client, string) {
	t.Helper()
	store.once.Do(func() {
		dir, err := os.MkdirTemp("", "berth-etcd")
		if err != nil {
			store.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e, err := StartEmbedded(ctx, EmbedConfig{Dir: dir, ClientURL: freeURL(t), PeerURL: freeURL(t)}, testLog())
		if err != nil {
			store.err = err
			return
		}
		store.cli, store.err = Connect(ctx, StoreConfig{Endpoints: e.Endpoints()}, testLog())
	})
	if store.err != nil {
		t.Fatalf("embedded etcd: %v", store.err)
	}
	return store.cli, "/" + t.Name() + "/"
}

// fakeLocal is a node's berthd as the Member sees it.
type fakeLocal struct {
	mu     sync.Mutex
	usage  Usage
	images []string
	holds  map[string]string
	health Health
	// usageErr fails Usage (containerd not answering).
	usageErr error
	// removed are the ids Remove deleted; removeErr fails Remove.
	removed   []string
	removeErr error
}

func (f *fakeLocal) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.removeErr != nil {
		return f.removeErr
	}
	delete(f.holds, id)
	f.removed = append(f.removed, id)
	return nil
}

func (f *fakeLocal) removedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.removed)
}

func (f *fakeLocal) Usage(context.Context) (Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usage, f.usageErr
}

func (f *fakeLocal) Images(context.Context) ([]string, error) { return f.images, nil }

func (f *fakeLocal) Health() Health {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.health
}

func (f *fakeLocal) Holds(context.Context) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string)
	for k, v := range f.holds {
		out[k] = v
	}
	return out, nil
}

func startMember(t *testing.T, cli *clientv3.Client, prefix, id string, local *fakeLocal) *Member {
	t.Helper()
	return startMemberAt(t, cli, prefix, id, id+":1", local)
}

func TestClaimOneHolder(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	a := startMember(t, cli, prefix, "a", &fakeLocal{holds: map[string]string{}})
	b := startMember(t, cli, prefix, "b", &fakeLocal{holds: map[string]string{}})
	// Concurrent claims of one id by two nodes: exactly one wins, the
	// other learns the winner.
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := a
			if i%2 == 1 {
				m = b
			}
			errs[i] = m.Claim(ctx, "sb-1", "alice")
		}()
	}
	wg.Wait()
	won := map[bool]int{}
	for i, err := range errs {
		switch rpcstatus.Reason(err) {
		case "":
			won[i%2 == 0]++
		case rpcstatus.ReasonPlacedElsewhere:
		default:
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("claims of sb-1 succeeded on both nodes (%v): two holders", won)
	}
	winner, loser := a, b
	if won[false] > 0 {
		winner, loser = b, a
	}
	if err := loser.Claim(ctx, "sb-1", "alice"); rpcstatus.Reason(err) != rpcstatus.ReasonPlacedElsewhere || errorMeta(err)["node_id"] != winner.NodeID() {
		t.Errorf("loser's claim = %v, want SANDBOX_PLACED_ELSEWHERE naming %s", err, winner.NodeID())
	}
	if !winner.Holds("sb-1") || loser.Holds("sb-1") {
		t.Errorf("Holds: winner %v, loser %v", winner.Holds("sb-1"), loser.Holds("sb-1"))
	}
	// Released, the id is free for the other node.
	winner.Release(ctx, "sb-1")
	if err := loser.Claim(ctx, "sb-1", "alice"); err != nil {
		t.Errorf("claim after release: %v", err)
	}
}

func TestDrainRefusesNewClaims(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	m := startMember(t, cli, prefix, "a", &fakeLocal{holds: map[string]string{}})
	if err := m.Claim(ctx, "old", "alice"); err != nil {
		t.Fatal(err)
	}
	nodes := NewNodeService(NewEtcdStore(cli), prefix)
	if _, err := nodes.DrainNode(ctx, &berthv1.DrainNodeRequest{NodeId: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Claim(ctx, "new", "alice"); rpcstatus.Reason(err) != rpcstatus.ReasonNodeNotAccepting {
		t.Errorf("claim on a draining node = %v, want NODE_NOT_ACCEPTING", err)
	}
	if err := m.Claim(ctx, "old", "alice"); err != nil {
		t.Errorf("claim of a sandbox the draining node holds = %v, want nil (idempotent create)", err)
	}
	if _, err := nodes.DrainNode(ctx, &berthv1.DrainNodeRequest{NodeId: "nope"}); rpcstatus.Reason(err) != rpcstatus.ReasonNodeNotFound {
		t.Errorf("drain of an unknown node = %v, want NODE_NOT_FOUND", err)
	}
	if _, err := nodes.UndrainNode(ctx, &berthv1.UndrainNodeRequest{NodeId: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Claim(ctx, "new", "alice"); err != nil {
		t.Errorf("claim after undrain: %v", err)
	}
}

// TestLeaseLost checks that a node whose lease is gone takes no new
// sandboxes, registers again, and that its records outlive the lease.
func TestLeaseLost(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	local := &fakeLocal{holds: map[string]string{"kept": "alice"}}
	m := startMember(t, cli, prefix, "a", local)
	if !m.Holds("kept") {
		t.Fatal("a sandbox the node held at start was not recorded")
	}
	m.mu.Lock()
	lease := m.lease
	m.mu.Unlock()
	revoked := time.Now()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	dir := startDirectory(t, cli, prefix)
	// The record of its sandbox stays while the node is away.
	if rec, ok, err := dir.Sandbox(ctx, "kept"); err != nil || !ok || rec.Node != "a" {
		t.Errorf("record of kept after the lease = %v, %v, %v", rec, ok, err)
	}
	for {
		if _, live, err := dir.LiveNode(ctx, "a"); err != nil {
			t.Fatal(err)
		} else if live {
			break
		}
		if time.Since(revoked) > 30*time.Second {
			t.Fatal("the node did not register again within 30s of losing its lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := m.Claim(ctx, "new", "alice"); err != nil {
		t.Errorf("claim after registering again: %v", err)
	}
}

// TestReconcile checks what a node does with the records at registration:
// re-adopts its sandboxes, releases records of sandboxes it no longer has,
// and keeps a local sandbox that the fleet records elsewhere, reporting the
// conflict instead of deleting what runs.
func TestReconcile(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	put := func(id, node string) {
		if _, err := cli.Put(ctx, k.sandbox(id), fmt.Sprintf(`{"node":%q,"owner":"alice"}`, node)); err != nil {
			t.Fatal(err)
		}
	}
	put("gone", "a")      // a's sandbox that expired while it was away
	put("elsewhere", "b") // the id is b's
	local := &fakeLocal{holds: map[string]string{"here": "alice", "elsewhere": "bob"}}
	m := startMember(t, cli, prefix, "a", local)
	dir, _ := NewDirectory(NewEtcdStore(cli), prefix, testLog())
	if _, ok, _ := dir.Sandbox(ctx, "gone"); ok {
		t.Error("the record of a sandbox the node no longer holds stayed")
	}
	if rec, ok, _ := dir.Sandbox(ctx, "here"); !ok || rec.Node != "a" || rec.Owner != "alice" {
		t.Errorf("record of here = %v, %v; want on a, owned by alice", rec, ok)
	}
	if rec, _, _ := dir.Sandbox(ctx, "elsewhere"); rec.Node != "b" {
		t.Errorf("record of elsewhere moved to %s", rec.Node)
	}
	if got, _ := local.Holds(ctx); len(got) != 2 {
		t.Errorf("local sandboxes after reconcile = %v, want here and elsewhere kept", got)
	}
	if m.Holds("elsewhere") {
		t.Error("the node claims elsewhere, which the fleet records on b")
	}
	if got, want := fmt.Sprint(m.Conflicts()), "map[elsewhere:b]"; got != want {
		t.Errorf("Conflicts() = %s, want %s", got, want)
	}
	// Once the local copy is gone, the conflict is too, and b's record stays.
	delete(local.holds, "elsewhere")
	m.Release(ctx, "elsewhere")
	if got := m.Conflicts(); len(got) != 0 {
		t.Errorf("Conflicts() after the local copy was removed = %v, want none", got)
	}
	if rec, _, _ := dir.Sandbox(ctx, "elsewhere"); rec.Node != "b" {
		t.Errorf("record of elsewhere after the local release = %v, want on b", rec)
	}
}

func TestPlace(t *testing.T) {
	img := "berth.dev/base:latest"
	node := func(id string, n, max uint64, mem, budget uint64) NodeRecord {
		return NodeRecord{ID: id, Images: []string{img}, Usage: Usage{Sandboxes: n, MaxSandboxes: max, MemoryBytes: mem, MemoryBudget: budget}}
	}
	unhealthy := func(n NodeRecord) NodeRecord {
		n.Health = Health{Reason: HealthContainerd}
		return n
	}
	ids := func(pl placement) (out []string) {
		for _, n := range pl.candidates {
			out = append(out, n.ID)
		}
		return out
	}
	tests := []struct {
		name  string
		nodes []NodeRecord
		req   placementRequest
		want  []string
	}{
		{"share of capacity", []NodeRecord{node("a", 10, 20, 0, 0), node("b", 5, 12, 0, 0), node("c", 2, 8, 0, 0)}, placementRequest{image: img}, []string{"c", "b", "a"}},
		{"memory binds", []NodeRecord{node("a", 1, 20, 900, 1000), node("b", 10, 20, 0, 1000)}, placementRequest{image: img, memBytes: 50}, []string{"b", "a"}},
		{"full nodes are out", []NodeRecord{node("a", 20, 20, 0, 0), node("b", 0, 0, 990, 1000)}, placementRequest{image: img, memBytes: 50}, nil},
		{"no caps: fewer sandboxes first", []NodeRecord{node("a", 3, 0, 0, 0), node("b", 1, 0, 0, 0)}, placementRequest{image: img}, []string{"b", "a"}},
		{"image", []NodeRecord{{ID: "a", Images: []string{"other"}}, node("b", 9, 10, 0, 0)}, placementRequest{image: img}, []string{"b"}},
		{"selector", []NodeRecord{node("a", 0, 0, 0, 0), {ID: "b", Images: []string{img}, Labels: map[string]string{"zone": "x"}}}, placementRequest{image: img, selector: map[string]string{"zone": "x"}}, []string{"b"}},
		{"selector by id", []NodeRecord{node("a", 0, 0, 0, 0), node("b", 5, 0, 0, 0)}, placementRequest{image: img, selector: map[string]string{"id": "b"}}, []string{"b"}},
		{"draining", []NodeRecord{{ID: "a", Images: []string{img}, Draining: true}, node("b", 5, 0, 0, 0)}, placementRequest{image: img}, []string{"b"}},
		// Issue 22: a node whose containerd is dead stayed least loaded and
		// took every create; an unhealthy node is tried only after every
		// healthy one, least loaded first among them too.
		{"unhealthy last", []NodeRecord{unhealthy(node("a", 0, 10, 0, 0)), node("b", 8, 10, 0, 0), unhealthy(node("c", 5, 10, 0, 0)), node("d", 9, 10, 0, 0)},
			placementRequest{image: img}, []string{"b", "d", "a", "c"}},
		{"unhealthy and full is out", []NodeRecord{unhealthy(node("a", 10, 10, 0, 0)), node("b", 8, 10, 0, 0)}, placementRequest{image: img}, []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ids(place(tt.nodes, tt.req))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("place = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMemberLeaseExpiry checks that a node that stops refreshing (killed)
// is lost to the others once its lease time passed: the bound on how soon
// its sandboxes answer NODE_LOST.
func TestMemberLeaseExpiry(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	m, err := NewMember(Config{NodeID: "a", Address: "a:1", Prefix: prefix, LeaseTTL: 3 * time.Second, PublishInterval: 2 * time.Second}, NewEtcdStore(cli), testLog())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, &fakeLocal{holds: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	dir := startDirectory(t, cli, prefix)
	time.Sleep(2 * time.Second) // a few refreshes
	m.stop()
	<-m.done
	start := time.Now()
	for {
		_, live, err := dir.LiveNode(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if !live {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("a node that stopped refreshing its 3s lease was still live 30s later")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the member's 3s lease expired %v after it stopped refreshing", time.Since(start).Round(10*time.Millisecond))
}

// TestRouterNodeLostOwner: a sandbox whose node is lost answers NODE_LOST
// to its owner and to admins, and to everyone else as an unknown id (the
// call is answered locally: NOT_FOUND), so that no one learns of another
// principal's sandbox from the fleet's records.
func TestRouterNodeLostOwner(t *testing.T) {
	cli, prefix := etcd(t)
	ctx := context.Background()
	k := keys{prefix}
	if _, err := cli.Put(ctx, k.sandbox("lost-sb"), `{"node":"gone","owner":"alice"}`); err != nil {
		t.Fatal(err)
	}
	dir := startDirectory(t, cli, prefix)
	r := NewRouter(RouterConfig{Directory: dir})
	for _, tc := range []struct {
		p         auth.Principal
		wantLocal bool
	}{
		{auth.Principal{Name: "alice"}, false},
		{auth.Principal{Name: "root", Admin: true}, false},
		{auth.Principal{Name: "bob"}, true},
		{auth.Principal{}, true},
	} {
		_, local, err := r.holder(ctx, tc.p, "lost-sb")
		if local != tc.wantLocal {
			t.Errorf("%v: answered locally = %v, want %v (err %v)", tc.p, local, tc.wantLocal, err)
		}
		if tc.wantLocal && err != nil {
			t.Errorf("%v: %v, want the call answered here as for an unknown id", tc.p, err)
		}
		if !tc.wantLocal && (status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "is lost")) {
			t.Errorf("%v: %v, want UNAVAILABLE NODE_LOST", tc.p, err)
		}
	}
}

// startDirectory starts a Directory of the fleet under prefix, closed at
// cleanup.
func startDirectory(t *testing.T, cli *clientv3.Client, prefix string) *Directory {
	t.Helper()
	dir, err := NewDirectory(NewEtcdStore(cli), prefix, testLog())
	if err != nil {
		t.Fatal(err)
	}
	if err := dir.Start(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dir.Close)
	return dir
}

// TestClaimDuringRegistration: a claim while the node registers again
// waits for the registration's lease when the store answers, and is
// refused NODE_NOT_ACCEPTING within registerWait when it does not (etcd
// down), so that the caller tries another node instead of hanging.
func TestClaimDuringRegistration(t *testing.T) {
	cli, prefix := etcd(t)
	m := startMember(t, cli, prefix, "a", &fakeLocal{holds: map[string]string{}})
	m.mu.Lock()
	lease := m.lease
	m.lease = 0 // lost; a registration is under way and does not return
	stuck := make(chan struct{})
	m.registering = stuck
	m.mu.Unlock()
	start := time.Now()
	err := m.Claim(context.Background(), "during", "alice")
	if rpcstatus.Reason(err) != rpcstatus.ReasonNodeNotAccepting || time.Since(start) > registerWait+time.Second {
		t.Errorf("claim while the registration hangs: %v after %v, want NODE_NOT_ACCEPTING within %v", err, time.Since(start), registerWait)
	}
	// A registration that stores its lease a moment later (its record
	// was visible already): the claim waits for it.
	storing := make(chan struct{})
	m.mu.Lock()
	m.registering = storing
	m.mu.Unlock()
	go func() {
		time.Sleep(100 * time.Millisecond)
		m.mu.Lock()
		m.lease, m.registering = lease, nil
		m.mu.Unlock()
		close(storing)
	}()
	if err := m.Claim(context.Background(), "after", "alice"); err != nil {
		t.Errorf("claim while the registration stores its lease: %v, want it to wait and succeed", err)
	}
}

// TestRegisterAnotherHolder checks what a berthd does when its node id is
// registered under a live lease: it refuses to start, touching no record,
// when another berthd holds it — on another host, with another state
// directory, or a live process — and waits only for an earlier process of
// the same node that no longer runs (TestRegisterAfterDeadSelf).
func TestRegisterAnotherHolder(t *testing.T) {
	self := ThisHolder("/state/a")
	const gone = "4194305:1" // above any pid_max (2^22): runs nowhere
	tests := []struct {
		name    string
		holder  Holder
		refused bool
	}{
		{"another host", Holder{Host: "another-machine", HostName: "h2", StateDir: self.StateDir, Process: self.Process}, true},
		{"another state directory", Holder{Host: self.Host, StateDir: "/state/b", Process: gone}, true},
		{"another live process", Holder{Host: self.Host, StateDir: self.StateDir, Process: procfs.ProcessID(os.Getppid())}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cli, prefix := etcd(t)
			ctx := context.Background()
			first, err := NewMember(Config{NodeID: "a", Address: "first:1", Prefix: prefix, LeaseTTL: 2 * time.Second, PublishInterval: 100 * time.Millisecond, Holder: tt.holder}, NewEtcdStore(cli), testLog())
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Start(ctx, &fakeLocal{holds: map[string]string{"kept": "alice"}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(first.Close)
			dir := startDirectory(t, cli, prefix)

			second, err := NewMember(Config{NodeID: "a", Address: "second:1", Prefix: prefix, LeaseTTL: 2 * time.Second, PublishInterval: 100 * time.Millisecond, Holder: self}, NewEtcdStore(cli), testLog())
			if err != nil {
				t.Fatal(err)
			}
			startCtx, cancel := context.WithTimeout(ctx, time.Second)
			err = second.Start(startCtx, &fakeLocal{holds: map[string]string{"kept": "alice"}})
			cancel()
			t.Cleanup(second.Close)
			var inUse *NodeIDInUseError
			if got := errors.As(err, &inUse); got != tt.refused {
				t.Fatalf("second Start = %v; refused as NodeIDInUseError: %v, want %v", err, got, tt.refused)
			}
			if tt.refused {
				if inUse.Holder != tt.holder || inUse.Address != "first:1" || inUse.NodeID != "a" {
					t.Errorf("refusal = %+v, want node a held by %+v at first:1", *inUse, tt.holder)
				}
				for _, want := range []string{tt.holder.Process, tt.holder.StateDir, "first:1", "--node-id"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("refusal %q does not name %q", err, want)
					}
				}
			} else if err != nil {
				t.Errorf("second Start within 1s = %v, want nil and the node waiting for the lease in the background", err)
			}
			// The first node's registration and records are untouched.
			if n, live, err := dir.LiveNode(ctx, "a"); err != nil || !live || n.Address != "first:1" {
				t.Errorf("node a = %+v, live %v, %v; want the first berthd's record", n, live, err)
			}
			if rec, ok, err := dir.Sandbox(ctx, "kept"); err != nil || !ok || rec.Node != "a" {
				t.Errorf("record of kept = %+v, %v, %v; want on a", rec, ok, err)
			}
		})
	}
}

// TestRegisterAfterDeadSelf checks that a berthd restarted after a crash
// — same host, same state directory, the earlier process gone — revokes
// its dead predecessor's lease and registers at once, instead of waiting
// up to the lease time for it to end (issue 22); a registration without a
// holder (a berthd from before holders were recorded, which may still
// run) is still waited for.
func TestRegisterAfterDeadSelf(t *testing.T) {
	self := ThisHolder("/state/a")
	const gone = "4194305:1" // above any pid_max (2^22): runs nowhere
	for _, tt := range []struct {
		name   string
		holder Holder
		waits  bool
	}{
		{"an earlier process that died", Holder{Host: self.Host, StateDir: self.StateDir, Process: gone}, false},
		{"a berthd that recorded no holder", Holder{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cli, prefix := etcd(t)
			ctx := context.Background()
			k := keys{prefix}
			// The predecessor's record under a 10 s lease that nobody
			// keeps alive: it died a moment ago.
			lease, err := cli.Grant(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(NodeRecord{ID: "a", Address: "first:1", Holder: tt.holder})
			if _, err := cli.Put(ctx, k.node("a"), string(body), clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Put(ctx, k.sandbox("kept"), `{"node":"a","owner":"alice"}`); err != nil {
				t.Fatal(err)
			}
			dir := startDirectory(t, cli, prefix)
			m, err := NewMember(Config{NodeID: "a", Address: "second:1", Prefix: prefix, LeaseTTL: 10 * time.Second, PublishInterval: 100 * time.Millisecond, Holder: self}, NewEtcdStore(cli), testLog())
			if err != nil {
				t.Fatal(err)
			}
			startCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			start := time.Now()
			err = m.Start(startCtx, &fakeLocal{holds: map[string]string{"kept": "alice"}})
			cancel()
			t.Cleanup(m.Close)
			if err != nil {
				t.Fatalf("Start = %v, want nil", err)
			}
			n, live, err := dir.LiveNode(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if tt.waits {
				if n.Address != "first:1" {
					t.Errorf("node a after Start = %+v, want the earlier record kept until its lease ends", n)
				}
				return
			}
			if !live || n.Address != "second:1" || time.Since(start) > 2*time.Second {
				t.Fatalf("node a %v after Start = %+v (live %v); want registered by the restarted berthd at once", time.Since(start), n, live)
			}
			if ttl, err := cli.TimeToLive(ctx, lease.ID); err != nil || ttl.TTL > 0 {
				t.Errorf("the dead predecessor's lease = %v, %v; want it revoked", ttl, err)
			}
			if rec, ok, err := dir.Sandbox(ctx, "kept"); err != nil || !ok || rec.Node != "a" || !m.Holds("kept") {
				t.Errorf("record of kept after the node registered = %+v, %v, %v, held %v; want re-adopted on a", rec, ok, err, m.Holds("kept"))
			}
		})
	}
}
