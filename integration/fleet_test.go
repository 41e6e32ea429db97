package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/testcerts"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The fleet test runs berth across three "hosts" on this machine: three
// containerd instances (the suite's and two more from scripts/containerd.sh,
// on overlayfs), three berthd processes, and the etcd embedded in the first
// berthd. Nodes reach each other over TLS with a client certificate of the
// node principal; the test calls as alice with a bearer token over TLS.
//
// Cost: two extra containerd instances (~2 s each), 30 + a few sandbox
// creations spread over three nodes, and two lease expiries of 3 s.

// fleetNode is one berthd of the test fleet.
type fleetNode struct {
	id         string
	containerd string
	ns         string
	dir        string // state directory
	sock       string // unix socket (root: admin)
	addr       string // 127.0.0.1:port, TLS
	args       []string
	proc       *berthdProc
	rt         *runtime.Runtime // the node's containerd namespace, read by the test
}

type fleetEnv struct {
	nodes  []*fleetNode
	certs  *testcerts.Set
	alice  []*client.Client // one per node, as alice over TLS
	ops    *client.Client   // admin, through node 0
	etcd   string
	prefix string
}

const fleetLeaseTTL = 3 * time.Second

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startContainerd starts a private containerd in dir (overlayfs only) and
// stops it at cleanup.
func startContainerd(t testing.TB, dir string) string {
	t.Helper()
	script := filepath.Join(env.repo, "scripts", "containerd.sh")
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = append(os.Environ(), "BERTH_BTRFS=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("start containerd in %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		cmd := exec.Command("bash", script, "stop", dir)
		cmd.Env = append(os.Environ(), "BERTH_BTRFS=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("stop containerd in %s: %v: %s", dir, err, out)
		}
	})
	return filepath.Join(dir, "containerd.sock")
}

// startFleet brings up a node per --max-sandboxes cap: the first on the
// suite's containerd, each other on a containerd of its own unless
// shared, when they all use the suite's (in namespaces of their own).
// The first node runs the fleet's etcd (embedded).
func startFleet(t testing.TB, caps []int, shared bool) *fleetEnv {
	t.Helper()
	return startFleetWith(t, caps, shared, "", true)
}

// startFleetOn is startFleet with the fleet's etcd at etcdURL, outside the
// nodes, or embedded in the first node when etcdURL is empty.
func startFleetOn(t testing.TB, caps []int, shared bool, etcdURL string) *fleetEnv {
	t.Helper()
	return startFleetWith(t, caps, shared, etcdURL, true)
}

// startFleetWith is startFleetOn; with importEach false no node gets the
// base image.
func startFleetWith(t testing.TB, caps []int, shared bool, etcdURL string, importEach bool) *fleetEnv {
	t.Helper()
	return startFleetSnapshotter(t, caps, shared, etcdURL, importEach, "overlayfs")
}

// startFleetSnapshotter is startFleetWith with the nodes' sandboxes under
// containerd's snapshotter (btrfs for snapshots and forks).
func startFleetSnapshotter(t testing.TB, caps []int, shared bool, etcdURL string, importEach bool, snapshotter string) *fleetEnv {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "bf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Sandboxes' roots are unprivileged host ids (user namespaces): they
	// must pass through to the containerd state directories here.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	f := &fleetEnv{}
	if f.certs, err = testcerts.NewSet(dir); err != nil {
		t.Fatal(err)
	}
	peerCert, peerKey, err := f.certs.ClientFiles("berth-node")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	lines := fmt.Sprintf("%s alice\n%s ops\n%s bob\n", auth.TokenHash(aliceToken), auth.TokenHash(opsToken), auth.TokenHash(bobToken))
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	f.prefix = "/berth-test-" + suffix + "/"
	f.etcd = etcdURL
	if etcdURL == "" {
		f.etcd = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	}
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	for i, c := range caps {
		n := &fleetNode{id: fmt.Sprintf("n%d", i+1), ns: "berth-fleet-" + suffix, dir: filepath.Join(dir, fmt.Sprintf("s%d", i+1))}
		n.sock = filepath.Join(dir, fmt.Sprintf("n%d.sock", i+1))
		n.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		if i == 0 || shared {
			n.containerd = env.containerd
			n.ns = fmt.Sprintf("berth-fleet-%s-%d", suffix, i+1)
		} else {
			n.containerd = startContainerd(t, filepath.Join(dir, fmt.Sprintf("c%d", i+1)))
		}
		n.args = []string{
			"--containerd-address", n.containerd, "--namespace", n.ns, "--state-dir", n.dir,
			"--agent-binary", env.agentBinary, "--snapshotter", snapshotter,
			"--listen", "unix://" + n.sock, "--listen", n.addr,
			"--tls-cert", f.certs.CertFile, "--tls-key", f.certs.KeyFile, "--tls-client-ca", f.certs.CAFile,
			"--token-file", tokens, "--admin", "ops", "--node-principal", "berth-node",
			"--peer-tls-ca", f.certs.CAFile, "--peer-tls-cert", peerCert, "--peer-tls-key", peerKey,
			"--node-id", n.id, "--cluster-prefix", f.prefix, "--lease-ttl", fleetLeaseTTL.String(),
			"--max-sandboxes", fmt.Sprint(c), "--log-level", "DEBUG",
		}
		if snapshotter != "overlayfs" {
			// Nodes sharing one btrfs pool, each sandbox's quota the
			// default 10 GiB: as the suite's berthds, overcommitted.
			n.args = append(n.args, "--disk-overcommit", "100")
		}
		if i == 0 && etcdURL == "" {
			n.args = append(n.args, "--etcd-embed", "--etcd-embed-dir", filepath.Join(dir, "etcd"),
				"--etcd-embed-client-url", f.etcd, "--etcd-embed-peer-url", peerURL)
		} else {
			n.args = append(n.args, "--etcd-endpoints", f.etcd)
		}
		f.nodes = append(f.nodes, n)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		n.rt, err = runtime.New(ctx, runtime.Config{Address: n.containerd, Namespace: n.ns, Snapshotter: snapshotter, StateDir: n.dir, AgentBinary: env.agentBinary})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.rt.Close() })
	}
	for _, n := range f.nodes {
		n.start(t)
	}
	// The base image on every node, through its own unix socket (root is
	// an admin there): images are per node.
	for _, n := range f.nodes {
		if importEach {
			importOn(t, n)
		}
	}
	tlsCfg, err := client.TLSConfigFromFiles(f.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range f.nodes {
		c, err := client.Dial(context.Background(), n.addr, client.WithTLS(tlsCfg), client.WithToken(aliceToken))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f.alice = append(f.alice, c)
	}
	if f.ops, err = client.Dial(context.Background(), f.nodes[0].addr, client.WithTLS(tlsCfg), client.WithToken(opsToken)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.ops.Close() })
	// Every node publishes its images soon after the import.
	f.waitNodes(t, "every node ready with the base image", func(nodes []*berthv1.Node) bool {
		ready := 0
		for _, n := range nodes {
			if n.GetState() == berthv1.NodeState_NODE_STATE_READY && (!importEach || len(n.GetImages()) > 0 && n.GetImages()[0] == env.image) {
				ready++
			}
		}
		return ready == len(f.nodes)
	})
	t.Cleanup(func() { f.cleanup(t) })
	return f
}

// start runs the node's berthd and waits until it serves.
func (n *fleetNode) start(t testing.TB) {
	t.Helper()
	p := &berthdProc{cmd: exec.Command(berthdBinary(t), n.args...), log: &agentbin.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	n.proc = p
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("berthd %s log (last 8 KiB):\n%s", n.id, tail(p.log.String(), 8<<10))
		}
	})
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := berthv1.NewImageServiceClient(conn).ListImages(ctx, &berthv1.ListImagesRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("berthd %s did not serve: %v\nlog:\n%s", n.id, err, tail(p.log.String(), 8<<10))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// startGateway runs a berthd --gateway of the fleet and returns a client
// of it as alice.
func (f *fleetEnv) startGateway(t *testing.T) *client.Client {
	t.Helper()
	n0 := f.nodes[0]
	gw := &fleetNode{id: "gw", dir: filepath.Join(filepath.Dir(n0.dir), "gw"), sock: filepath.Join(filepath.Dir(n0.sock), "gw.sock"), addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	for i := 0; i < len(n0.args); i++ {
		switch a := n0.args[i]; a {
		case "--containerd-address", "--namespace", "--agent-binary", "--snapshotter", "--max-sandboxes", "--etcd-embed-dir", "--etcd-embed-client-url", "--etcd-embed-peer-url", "--listen", "--node-id", "--state-dir":
			i++ // and its value
		case "--etcd-embed":
		default:
			gw.args = append(gw.args, a)
		}
	}
	gw.args = append(gw.args, "--gateway", "--etcd-endpoints", f.etcd, "--node-id", gw.id, "--state-dir", gw.dir, "--listen", "unix://"+gw.sock, "--listen", gw.addr)
	p := &berthdProc{cmd: exec.Command(berthdBinary(t), gw.args...), log: &agentbin.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("gateway log (last 8 KiB):\n%s", tail(p.log.String(), 8<<10))
		}
	})
	tlsCfg, err := client.TLSConfigFromFiles(f.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(context.Background(), gw.addr, client.WithTLS(tlsCfg), client.WithToken(aliceToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// It serves once alice's ListNodes gets an answer: NOT_PERMITTED, the
	// service being for admins.
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ListNodes(ctx)
		cancel()
		if fleetReason(err) == client.ReasonNotPermitted {
			return c
		}
		select {
		case <-p.exited:
			t.Fatalf("the gateway exited: %v\nlog:\n%s", p.err, tail(p.log.String(), 8<<10))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway: ListNodes as alice = %v, want NOT_PERMITTED\nlog:\n%s", err, tail(p.log.String(), 8<<10))
		}
	}
}

// importOn imports the base image on node n.
func importOn(t testing.TB, n *fleetNode) {
	t.Helper()
	c, err := client.Dial(context.Background(), "unix://"+n.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fh, err := os.Open(env.archive)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.ImportImage(ctx, fh, ""); err != nil {
		t.Fatalf("import the base image on %s: %v", n.id, err)
	}
}

// waitNodes polls ListNodes (as the admin ops) until ok holds, for at most
// a minute: long enough for any lease to expire and any node to publish.
func (f *fleetEnv) waitNodes(t testing.TB, what string, ok func([]*berthv1.Node) bool) []*berthv1.Node {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last []*berthv1.Node
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nodes, err := f.ops.ListNodes(ctx)
		cancel()
		if err == nil {
			last = nodes
			if ok(nodes) {
				return nodes
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("nodes never reached %q; last: %v", what, last)
	return nil
}

// cleanup deletes the fleet's sandboxes on every node's containerd.
func (f *fleetEnv) cleanup(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range f.nodes {
		if n.proc != nil {
			n.proc.cmd.Process.Signal(syscall.SIGTERM)
			<-n.proc.exited
		}
		sbs, _ := n.rt.List(ctx, nil)
		for _, sb := range sbs {
			if err := n.rt.Delete(ctx, sb.ID); err != nil {
				t.Logf("cleanup: delete %s on %s: %v", sb.ID, n.id, err)
			}
		}
		// Snapshots (btrfs nodes only; overlayfs keeps none).
		snaps, _ := n.rt.ListSnapshots(ctx, func(string) bool { return true })
		for _, s := range snaps {
			if err := n.rt.DeleteSnapshot(ctx, s.ID); err != nil {
				t.Logf("cleanup: delete snapshot %s on %s: %v", s.ID, n.id, err)
			}
		}
	}
}

func (f *fleetEnv) node(id string) *fleetNode {
	for _, n := range f.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// TestFleet runs berth across three nodes: placement by capacity, every
// kind of call through an entry point that does not hold the sandbox, a
// node lost and back, one sandbox out of concurrent creates of one id on
// two entry points, and draining.
func TestFleet(t *testing.T) {
	need(t)
	f := startFleet(t, []int{20, 12, 8}, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// 30 sandboxes through node 1. Each node's published use counts its
	// sandboxes as soon as it claims them, so the least loaded by share of
	// its capacity takes the next: 3/4 of each node's capacity.
	placed := map[string][]string{}
	for i := range 30 {
		sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: fmt.Sprintf("fl-%02d", i), Image: env.image})
		if err != nil {
			t.Fatalf("create fl-%02d through n1: %v", i, err)
		}
		placed[sb.GetNodeId()] = append(placed[sb.GetNodeId()], sb.GetId())
	}
	for id, want := range map[string]int{"n1": 15, "n2": 9, "n3": 6} {
		if got := len(placed[id]); got != want {
			t.Errorf("node %s holds %d of the 30 sandboxes, want %d (3/4 of its capacity); placement: %v", id, got, want, placed)
		}
		// The node's containerd holds exactly those.
		sbs, err := f.node(id).rt.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(sbs) != len(placed[id]) {
			t.Errorf("containerd of %s holds %d sandboxes, the fleet placed %d there", id, len(sbs), len(placed[id]))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// berth node ls, as root on a node's unix socket (an admin).
	out, err := exec.CommandContext(ctx, env.cliBinary, "--addr", "unix://"+f.nodes[1].sock, "node", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("berth node ls: %v: %s", err, out)
	}
	for _, want := range []string{`n1\s+ready\s+ok\s+127\.0\.0\.1:\d+\s+15/20\s`, `n2\s+ready\s+ok\s+\S+\s+9/12\s`, `n3\s+ready\s+ok\s+\S+\s+6/8\s`} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("berth node ls does not match %s:\n%s", want, out)
		}
	}
	// The fleet lists all 30 through any entry point, in pages.
	var listed int
	for sb, err := range f.alice[2].ListSandboxes(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(sb.GetId(), "fl-") {
			listed++
		}
	}
	if listed != 30 {
		t.Errorf("ListSandboxes through n3 lists %d of the 30 sandboxes", listed)
	}

	// Calls through n2, which neither created (n1 did) nor holds them.
	for _, holder := range []string{"n1", "n3"} {
		t.Run("routed-"+holder, func(t *testing.T) { routedCalls(ctx, t, f.alice[1], placed[holder][0]) })
	}
	// A reattach through a third entry point: started through one that
	// does not hold the sandbox, attached through another.
	{
		id := placed["n2"][0]
		started, err := f.alice[0].ExecBackground(ctx, id, &berthv1.ProcessSpec{ShellCommand: "printf 'one\\n'; sleep 0.3; printf 'two\\000\\377\\n'"}, client.WithExecID("bg-1"))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		ex, err := f.alice[2].Attach(ctx, id, started.GetExecId(), 0, client.WithStdout(&out))
		if err != nil {
			t.Fatal(err)
		}
		res, err := ex.Wait()
		if err != nil || res.GetExitCode() != 0 || out.String() != "one\ntwo\x00\xff\n" {
			t.Errorf("attach through n3 to bg-1 on n2 = %q, %v, %v; want %q, exit 0", out.String(), res, err, "one\ntwo\x00\xff\n")
		}
	}

	// Node 3 is killed: its sandboxes answer NODE_UNREACHABLE while its
	// lease lasts, NODE_LOST once it expired; the others keep working.
	lost := f.node("n3")
	lost.proc.cmd.Process.Kill()
	<-lost.proc.exited
	killed := time.Now()
	var cause berthv1.UnreachableCause
	for cause != berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST {
		_, err := f.alice[0].Run(ctx, placed["n3"][0], &berthv1.ProcessSpec{Argv: []string{"true"}})
		var u *client.UnreachableError
		if !errors.As(err, &u) {
			t.Fatalf("Run on a sandbox of the killed n3 = %v, want an *UnreachableError", err)
		}
		if u.Detail.GetCause() != cause {
			t.Logf("%v after the kill: %v", time.Since(killed).Round(10*time.Millisecond), u.Detail.GetCause())
		}
		cause = u.Detail.GetCause()
		// A call sent on the entry node's connection to n3 before that
		// connection saw n3 die may have reached it: ADMITTED_UNKNOWN,
		// honestly, for NODE_UNREACHABLE; once the node is known lost,
		// nothing ran.
		admitted := u.Detail.GetAdmitted()
		okAdmitted := admitted == berthv1.Admitted_ADMITTED_NOT_STARTED ||
			(admitted == berthv1.Admitted_ADMITTED_UNKNOWN && cause == berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_UNREACHABLE)
		if u.Detail.GetNodeId() != "n3" || !okAdmitted ||
			(cause != berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST && cause != berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_UNREACHABLE) {
			t.Fatalf("Run on a sandbox of the killed n3: detail %v, want cause NODE_LOST (nothing ran) or NODE_UNREACHABLE on n3", u.Detail)
		}
		// The lease was refreshed before the kill, so it expires within
		// the lease time of it; the slack covers etcd's expiry check
		// (every 500 ms), the revocation's raft round and the watch that
		// tells the entry point, on a loaded machine.
		if time.Since(killed) > fleetLeaseTTL+5*time.Second {
			t.Fatalf("the sandboxes of n3 were not NODE_LOST %v after it was killed (lease time %v)", time.Since(killed), fleetLeaseTTL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("n3's sandboxes NODE_LOST %v after its kill (lease time %v)", time.Since(killed).Round(10*time.Millisecond), fleetLeaseTTL)
	for _, entry := range []int{0, 1} {
		for _, id := range []string{placed["n1"][1], placed["n2"][1]} {
			res, err := f.alice[entry].Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"echo", "alive"}})
			if err != nil || string(res.GetStdout()) != "alive\n" {
				t.Errorf("Run on %s through n%d while n3 is lost = %v, %v", id, entry+1, res, err)
			}
		}
	}
	nodes := f.waitNodes(t, "n3 lost", func(nodes []*berthv1.Node) bool {
		for _, n := range nodes {
			if n.GetId() == "n3" {
				return n.GetState() == berthv1.NodeState_NODE_STATE_LOST && n.GetPlacedSandboxes() == 6
			}
		}
		return false
	})
	t.Logf("nodes with n3 lost: %v", nodes)
	// A new sandbox goes elsewhere meanwhile.
	if sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-while-lost", Image: env.image}); err != nil || sb.GetNodeId() == "n3" {
		t.Errorf("create while n3 is lost = %v on %s, want it on another node", err, sb.GetNodeId())
	}

	// n3 comes back: it re-adopts its sandboxes, which work again.
	lost.start(t)
	f.waitNodes(t, "n3 ready again", func(nodes []*berthv1.Node) bool {
		for _, n := range nodes {
			if n.GetId() == "n3" {
				return n.GetState() == berthv1.NodeState_NODE_STATE_READY
			}
		}
		return false
	})
	for _, id := range placed["n3"] {
		res, err := f.alice[0].Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "hostname"})
		if err != nil || string(res.GetStdout()) != id+"\n" {
			t.Errorf("Run hostname on %s through n1 after n3 came back = %v, %v", id, res, err)
		}
	}

	// 20 concurrent creates of one id through two entry points: one
	// sandbox, on one node.
	var wg sync.WaitGroup
	results := make([]*berthv1.Sandbox, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f.alice[i%2].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-once", Image: env.image, Labels: map[string]string{"k": "v"}})
		}()
	}
	wg.Wait()
	for i := range 20 {
		if errs[i] != nil {
			t.Fatalf("concurrent create %d through n%d: %v", i, i%2+1, errs[i])
		}
		if results[i].GetNodeId() != results[0].GetNodeId() || results[i].GetCreatedAt().AsTime() != results[0].GetCreatedAt().AsTime() {
			t.Errorf("concurrent create %d returned the sandbox on %s created %v; create 0: on %s created %v", i,
				results[i].GetNodeId(), results[i].GetCreatedAt().AsTime(), results[0].GetNodeId(), results[0].GetCreatedAt().AsTime())
		}
	}
	holders := 0
	for _, n := range f.nodes {
		if _, err := n.rt.Get(ctx, "fl-once"); err == nil {
			holders++
		} else if !errors.Is(err, runtime.ErrSandboxNotFound) {
			t.Fatal(err)
		}
	}
	if holders != 1 {
		t.Errorf("fl-once exists in %d nodes' containerd, want 1", holders)
	}

	// Draining n2: new sandboxes go elsewhere; its own keep working.
	if n, err := f.ops.DrainNode(ctx, "n2"); err != nil || n.GetState() != berthv1.NodeState_NODE_STATE_DRAINING {
		t.Fatalf("DrainNode n2 = %v, %v", n, err)
	}
	for i := range 3 {
		sb, err := f.alice[1].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: fmt.Sprintf("fl-drain-%d", i), Image: env.image, Resources: &berthv1.Resources{}})
		if err != nil || sb.GetNodeId() == "n2" {
			t.Errorf("create through the draining n2 = %v on %s, want another node", err, sb.GetNodeId())
		}
	}
	if res, err := f.alice[0].Run(ctx, placed["n2"][2], &berthv1.ProcessSpec{Argv: []string{"echo", "draining"}}); err != nil || string(res.GetStdout()) != "draining\n" {
		t.Errorf("Run on n2's sandbox while it drains = %v, %v", res, err)
	}
	if _, err := f.ops.UndrainNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	// A placement constraint pins a sandbox to the node labelled so.
	if sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-pinned", Image: env.image, Labels: map[string]string{"node.berth.dev/id": "n2"}}); err != nil || sb.GetNodeId() != "n2" {
		t.Errorf("create with node.berth.dev/id=n2 = %v on %q", err, sb.GetNodeId())
	}
	// A gateway: a berthd without containerd that routes every call.
	gw := f.startGateway(t)
	if sb, err := gw.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-gw", Image: env.image}); err != nil || sb.GetNodeId() == "" {
		t.Errorf("create through the gateway = %v, %v", sb, err)
	}
	if res, err := gw.Run(ctx, placed["n3"][1], &berthv1.ProcessSpec{Argv: []string{"echo", "via gateway"}}); err != nil || string(res.GetStdout()) != "via gateway\n" {
		t.Errorf("Run through the gateway = %v, %v", res, err)
	}
	if _, err := gw.GetSandbox(ctx, "fl-nosuch"); fleetReason(err) != client.ReasonSandboxNotFound {
		t.Errorf("GetSandbox of an unknown id through the gateway = %v, want SANDBOX_NOT_FOUND", err)
	}
	// The gateway lists the nodes' images from their records.
	if imgs, err := gw.ListImages(ctx); err != nil || len(imgs) != 1 || imgs[0].GetName() != env.image || len(imgs[0].GetNodeIds()) == 0 {
		t.Errorf("ListImages on the gateway = %v, %v; want %s with the nodes holding it", imgs, err, env.image)
	}
	// Deleting through another entry point removes it from its node and
	// from the fleet's records.
	if err := f.alice[2].DeleteSandbox(ctx, "fl-pinned"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.alice[0].GetSandbox(ctx, "fl-pinned"); fleetReason(err) != client.ReasonSandboxNotFound {
		t.Errorf("GetSandbox after delete through n3 = %v, want SANDBOX_NOT_FOUND", err)
	}

	// The fleet full (20 + 12 + 8 sandboxes): the next create is the
	// fleet's FLEET_BUSY, nothing started, and no node holds more than its
	// cap.
	held := func() (n int) {
		for _, nd := range f.nodes {
			sbs, err := nd.rt.List(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			n += len(sbs)
		}
		return n
	}
	for i := held(); i < 40; i++ {
		if _, err := f.alice[i%3].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: fmt.Sprintf("fl-fill-%d", i), Image: env.image}); err != nil {
			t.Fatalf("create fl-fill-%d with %d of the fleet's 40 in use: %v", i, i, err)
		}
	}
	_, err = f.alice[1].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-too-many", Image: env.image})
	var busy *client.FleetBusyError
	if !errors.As(err, &busy) || busy.Detail.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || busy.Delay() <= 0 {
		t.Errorf("create with the fleet full = %v, want a *FleetBusyError, nothing started, with a retry delay", err)
	} else if busy.Detail.GetLimit() != 40 || busy.Detail.GetInUse() != 40 {
		t.Logf("FLEET_BUSY detail %v (a node refused on its own: the fleet's view lagged)", busy.Detail)
	}
	if got := held(); got != 40 {
		t.Errorf("the fleet's containerds hold %d sandboxes after a refused create, want 40", got)
	}
	for _, nd := range f.nodes {
		sbs, _ := nd.rt.List(ctx, nil)
		if limit := map[string]int{"n1": 20, "n2": 12, "n3": 8}[nd.id]; len(sbs) > limit {
			t.Errorf("node %s holds %d sandboxes, more than its --max-sandboxes %d", nd.id, len(sbs), limit)
		}
	}
}

// routedCalls runs execs and file operations on sandbox id through c,
// an entry point that does not hold it, with exact bytes.
func routedCalls(ctx context.Context, t *testing.T, c *client.Client, id string) {
	// Run: binary output, exact.
	res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "printf 'a\\000b\\377'; printf err >&2; exit 3"})
	if err != nil || !bytes.Equal(res.GetStdout(), []byte("a\x00b\xff")) || string(res.GetStderr()) != "err" || res.GetResult().GetExitCode() != 3 {
		t.Errorf("Run = %v, %v; want stdout a\\0b\\xff, stderr err, exit 3", res, err)
	}
	// Exec with stdin: 1 MiB through cat, back exactly.
	in := make([]byte, 1<<20)
	rand.Read(in)
	var out bytes.Buffer
	ex, err := c.Exec(ctx, id, &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true}, client.WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Stdin().Write(in); err != nil {
		t.Fatal(err)
	}
	ex.Stdin().Close()
	if r, err := ex.Wait(); err != nil || r.GetExitCode() != 0 || !bytes.Equal(out.Bytes(), in) {
		t.Errorf("cat of 1 MiB of stdin: %d bytes back (equal %v), %v, %v", out.Len(), bytes.Equal(out.Bytes(), in), r, err)
	}
	// Files: write, stat, read, list, rename, remove.
	data := make([]byte, 3<<20+7)
	rand.Read(data)
	if _, err := c.WriteFile(ctx, id, "/workspace/d/blob", bytes.NewReader(data), client.WithCreateParents()); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.Stat(ctx, id, "/workspace/d/blob"); err != nil || fi.GetSizeBytes() != uint64(len(data)) {
		t.Errorf("Stat = %v, %v; want %d bytes", fi, err, len(data))
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, id, "/workspace/d/blob", &got); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Errorf("ReadFile: %d bytes (equal %v), %v", got.Len(), bytes.Equal(got.Bytes(), data), err)
	}
	if err := c.Rename(ctx, id, "/workspace/d/blob", "/workspace/d/moved", false); err != nil {
		t.Fatal(err)
	}
	infos, _, err := c.ListDir(ctx, id, "/workspace/d", 1)
	if err != nil || len(infos) != 1 || infos[0].GetDisplayName() != "moved" {
		t.Errorf("ListDir = %v, %v; want moved", infos, err)
	}
	var tarball bytes.Buffer
	if _, err := c.Download(ctx, id, "/workspace/d", &tarball); err != nil || tarball.Len() < len(data) {
		t.Errorf("Download: %d bytes, %v", tarball.Len(), err)
	}
	if err := c.Remove(ctx, id, "/workspace/d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, id, "/workspace/d"); fleetReason(err) != "FILE_NOT_FOUND" {
		t.Errorf("Stat after Remove = %v, want FILE_NOT_FOUND", err)
	}
	// PortForward: an HTTP GET of random bytes from busybox httpd in the
	// sandbox, back exactly.
	page := make([]byte, 1<<20+3)
	rand.Read(page)
	if _, err := c.WriteFile(ctx, id, "/srv/page", bytes.NewReader(page), client.WithCreateParents()); err != nil {
		t.Fatal(err)
	}
	startInSandbox(t, c, id, 8080, "httpd", "-f", "-p", "8080", "-h", "/srv")
	pc, err := c.PortForward(ctx, id, 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	fmt.Fprintf(pc, "GET /page HTTP/1.0\r\nHost: sandbox\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(pc), nil)
	if err != nil {
		t.Fatalf("PortForward GET: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, page) {
		t.Errorf("PortForward GET /page: %s, %d bytes (equal %v), %v", resp.Status, len(body), bytes.Equal(body, page), err)
	}
}

// fleetReason returns the berth reason of a client error.
func fleetReason(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}
