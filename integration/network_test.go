package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/network"
)

// The network tests reach only addresses in network namespaces they make
// themselves: "outside" is a namespace joined to the host by a veth pair,
// with test servers on its addresses, standing in for the world beyond the
// host; its DNS is a fake resolver in this process. Bridges, nftables
// tables and namespaces carry random names and are removed at cleanup.

// randHex returns n random bytes as hex.
func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freeSubnet returns a random /24 of 100.64.0.0/10 (shared address space,
// which hosts rarely route) that no route of the host overlaps.
func freeSubnet(t testing.TB) netip.Prefix {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		n, _ := rand.Int(rand.Reader, big.NewInt(64*256))
		v := n.Int64()
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + v/256), byte(v % 256), 0}), 24)
		clash := false
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			rp, ok := netip.AddrFromSlice(r.Dst.IP.To4())
			ones, _ := r.Dst.Mask.Size()
			if ok && ones > 0 && netip.PrefixFrom(rp, ones).Overlaps(p) {
				clash = true
			}
		}
		if !clash {
			return p
		}
	}
	t.Fatal("no free /24 in 100.64.0.0/10")
	return netip.Prefix{}
}

// fakeDNS answers A queries from a table, on 127.0.0.1.
type fakeDNS struct {
	addr string
	mu   sync.Mutex
	a    map[string][]netip.Addr
}

func startFakeDNS(t testing.TB) *fakeDNS {
	t.Helper()
	f := &fakeDNS{a: make(map[string][]netip.Addr)}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		f.mu.Lock()
		addrs, ok := f.a[strings.TrimSuffix(q.Name, ".")]
		f.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, a := range addrs {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: a.AsSlice()})
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return f
}

func (f *fakeDNS) set(name string, addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.a[name] = addrs
}

// outside is a network namespace joined to the host by a veth pair, with a
// server on port 80 of each of its addresses that writes its address.
type outside struct {
	name, hostIf          string
	host, allowed, denied netip.Addr // a /24: the host's end and two servers
	linkHost, linkLocal   netip.Addr // a link-local /30, like cloud metadata's
	servers               []net.Listener
}

func newOutside(t testing.TB) *outside {
	t.Helper()
	r := randHex(3)
	subnet := freeSubnet(t)
	base := subnet.Addr().As4()
	at := func(last byte) netip.Addr { b := base; b[3] = last; return netip.AddrFrom4(b) }
	n, _ := rand.Int(rand.Reader, big.NewInt(160))
	ll := byte(n.Int64() + 1) // 169.254.1-160.x: never 169.254.169.254
	o := &outside{name: "bnt" + r, hostIf: "bnh" + r, host: at(1), allowed: at(2), denied: at(3),
		linkHost: netip.AddrFrom4([4]byte{169, 254, ll, 1}), linkLocal: netip.AddrFrom4([4]byte{169, 254, ll, 2})}
	peer := "bnp" + r
	t.Cleanup(func() {
		for _, l := range o.servers {
			l.Close()
		}
		exec.Command("ip", "link", "del", o.hostIf).Run()
		exec.Command("ip", "netns", "del", o.name).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", o.name},
		{"link", "add", o.hostIf, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", o.name},
		{"addr", "add", o.host.String() + "/24", "dev", o.hostIf},
		{"addr", "add", o.linkHost.String() + "/30", "dev", o.hostIf},
		{"link", "set", o.hostIf, "up"},
		{"-n", o.name, "addr", "add", o.allowed.String() + "/24", "dev", peer},
		{"-n", o.name, "addr", "add", o.denied.String() + "/24", "dev", peer},
		{"-n", o.name, "addr", "add", o.linkLocal.String() + "/30", "dev", peer},
		{"-n", o.name, "link", "set", peer, "up"},
		{"-n", o.name, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// Replies to the sandboxes come back in here: forwarding on the test's
	// own interface only (the host's global setting is left alone).
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+o.hostIf+"/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// allowed:81 holds connections open until the client closes its side.
	hold, err := listenIn("/run/netns/"+o.name, netip.AddrPortFrom(o.allowed, 81).String())
	if err != nil {
		t.Fatal(err)
	}
	o.servers = append(o.servers, hold)
	go func() {
		for {
			c, err := hold.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	for _, a := range []netip.Addr{o.allowed, o.denied, o.linkLocal} {
		l, err := listenIn("/run/netns/"+o.name, netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		o.servers = append(o.servers, l)
		go serveBanner(l, a.String())
	}
	return o
}

// listenIn listens on addr in the network namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetNS(nsPath, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	return l, err
}

// serveBanner answers every connection with banner and a newline.
func serveBanner(l net.Listener, banner string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		fmt.Fprintln(c, banner)
		c.Close()
	}
}

// netEnv is a berthd subprocess with a sandbox network of its own.
type netEnv struct {
	*berthEnv
	proc  *berthdProc
	flags []string
	cfg   network.Config
	dns   *fakeDNS
}

func newNetEnv(t *testing.T, name string) *netEnv {
	t.Helper()
	rt, ns, stateDir := newNamespaceRuntime(t, name)
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, name+".sock")}
	ne := &netEnv{berthEnv: e, dns: startFakeDNS(t)}
	ne.cfg = network.Config{Bridge: "bt" + randHex(4), Subnet: freeSubnet(t), StateDir: filepath.Join(stateDir, "net"), DNSUpstreams: []string{ne.dns.addr}}
	ne.flags = []string{"--network-bridge", ne.cfg.Bridge, "--network-subnet", ne.cfg.Subnet.String(), "--network-dns", ne.dns.addr}
	// Registered before berthd's own cleanup, so it runs after berthd is
	// killed: the sandboxes, then everything of the network.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sbs, _ := rt.List(ctx, nil)
		for _, sb := range sbs {
			rt.Delete(ctx, sb.ID)
		}
		m, err := network.New(ne.cfg, discardLog())
		if err != nil {
			t.Errorf("network cleanup: %v", err)
			return
		}
		if err := m.Remove(ctx); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
		if _, err := netlink.LinkByName(ne.cfg.Bridge); err == nil {
			t.Errorf("bridge %s left behind", ne.cfg.Bridge)
		}
	})
	ne.proc = startBerthd(t, e, ne.flags...)
	e.importBase(t)
	return ne
}

// restart kills berthd (SIGKILL) and starts it again with the same flags.
func (ne *netEnv) restart(t *testing.T) {
	t.Helper()
	ne.proc.cmd.Process.Kill()
	<-ne.proc.exited
	ne.proc = startBerthd(t, ne.berthEnv, ne.flags...)
}

// create makes a sandbox of policy (nil: NONE) and deletes it at cleanup.
func (ne *netEnv) create(t testing.TB, policy *berthv1.NetworkPolicy) *berthv1.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := ne.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Network: policy})
	if err != nil {
		t.Fatalf("CreateSandbox(%v): %v", policy, err)
	}
	sb := resp.GetSandbox()
	t.Cleanup(func() {
		ne.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()})
	})
	return sb
}

func egress(allow ...string) *berthv1.NetworkPolicy {
	return &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: allow}
}

// sh runs a shell command in a sandbox of ne and returns its output and
// exit code.
func (ne *netEnv) sh(t testing.TB, id, cmd string) (string, int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := ne.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	if err != nil {
		t.Fatalf("Run(%q) in %s: %v", cmd, id, err)
	}
	return string(resp.GetStdout()) + string(resp.GetStderr()), resp.GetResult().GetExitCode()
}

// reaches reports whether the sandbox gets the banner of the server at
// addr (host:port) with busybox nc; a refused connection fails at once.
func (ne *netEnv) reaches(t testing.TB, id, host string, port int, banner string) bool {
	t.Helper()
	out, code := ne.sh(t, id, fmt.Sprintf("nc -w 3 %s %d </dev/null", host, port))
	got := code == 0 && strings.TrimSpace(out) == banner
	if !got && code == 0 && banner != "" {
		t.Logf("nc %s %d from %s: %q (want %q)", host, port, id, out, banner)
	}
	return got
}

// TestNetworkEgress: an EGRESS sandbox reaches what its allow-list names
// (an address:port, a name through berth's resolver) and nothing else: not
// another address or port, not a name outside its list, not the host's own
// addresses, not another sandbox, not link-local addresses (cloud metadata)
// even with 0.0.0.0/0 allowed, unless an entry names one. A NONE sandbox
// has only lo.
func TestNetworkEgress(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "net-"+randHex(2))
	o := newOutside(t)
	ne.dns.set("named.test", o.denied)
	ne.dns.set("other.test", o.allowed)
	// A listener on every host address, as berthd's or containerd's TCP
	// endpoints would be.
	hostLis, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLis.Close()
	go serveBanner(hostLis, "host")
	hostPort := hostLis.Addr().(*net.TCPAddr).Port
	gateway := ne.cfg.Subnet.Addr().Next().String()

	narrow := ne.create(t, egress(o.allowed.String()+":80", "named.test:80"))
	wide := ne.create(t, egress("0.0.0.0/0"))
	meta := ne.create(t, egress(o.linkLocal.String()+":80"))
	none := ne.create(t, nil)
	if narrow.GetNetworkAddress() == "" || !ne.cfg.Subnet.Contains(netip.MustParseAddr(narrow.GetNetworkAddress())) {
		t.Fatalf("network_address = %q, want one in %s", narrow.GetNetworkAddress(), ne.cfg.Subnet)
	}
	if got := narrow.GetNetwork().GetAllow(); strings.Join(got, ",") != o.allowed.String()+":80,named.test:80" {
		t.Errorf("network.allow = %v, want the list normalized", got)
	}
	// A listener in the meta sandbox, for its neighbours to try.
	bg, err := ne.sandboxes.Run(context.Background(), &berthv1.RunRequest{SandboxId: meta.GetId(), Process: &berthv1.ProcessSpec{
		ShellCommand: "nohup setsid nc -ll -p 8000 -e echo sandbox >/dev/null 2>&1 &"}})
	if err != nil || bg.GetResult().GetExitCode() != 0 {
		t.Fatalf("start a listener in %s: %v %v", meta.GetId(), err, bg)
	}

	cases := []struct {
		what        string
		sb          *berthv1.Sandbox
		host        string
		port        int
		banner      string
		wantReached bool
	}{
		{"an allowed address:port", narrow, o.allowed.String(), 80, o.allowed.String(), true},
		{"an address not in the list", narrow, o.denied.String(), 80, o.denied.String(), false},
		{"a name in the list (opens its address)", narrow, "named.test", 80, o.denied.String(), true},
		{"a name not in the list", narrow, "other.test", 80, o.allowed.String(), false},
		{"the gateway (a host address)", narrow, gateway, hostPort, "host", false},
		{"the host's address on the outside link", narrow, o.host.String(), hostPort, "host", false},
		{"0.0.0.0/0: outside", wide, o.denied.String(), 80, o.denied.String(), true},
		{"0.0.0.0/0: the gateway (a host address)", wide, gateway, hostPort, "host", false},
		{"0.0.0.0/0: the host's address on the outside link", wide, o.host.String(), hostPort, "host", false},
		{"0.0.0.0/0: link-local (where cloud metadata is)", wide, o.linkLocal.String(), 80, o.linkLocal.String(), false},
		{"0.0.0.0/0: another sandbox", wide, meta.GetNetworkAddress(), 8000, "sandbox", false},
		{"a link-local address the list names", meta, o.linkLocal.String(), 80, o.linkLocal.String(), true},
		{"NONE: outside", none, o.allowed.String(), 80, o.allowed.String(), false},
	}
	for _, c := range cases {
		if got := ne.reaches(t, c.sb.GetId(), c.host, c.port, c.banner); got != c.wantReached {
			t.Errorf("%s: %s:%d from %s: reached %v, want %v", c.what, c.host, c.port, c.sb.GetId(), got, c.wantReached)
		}
	}
	// The listener in the sandbox did run: its own address reaches it.
	if !ne.reaches(t, meta.GetId(), "127.0.0.1", 8000, "sandbox") {
		t.Error("the sandbox's own listener does not answer on 127.0.0.1:8000")
	}
	out, _ := ne.sh(t, narrow.GetId(), "nslookup other.test "+gateway+" 2>&1; cat /etc/resolv.conf")
	if !strings.Contains(out, "REFUSED") || !strings.Contains(out, "nameserver "+gateway) {
		t.Errorf("a name not in the list: nslookup and resolv.conf say %q, want REFUSED and nameserver %s", out, gateway)
	}
	out, _ = ne.sh(t, none.GetId(), "ls /sys/class/net; ip route")
	if strings.TrimSpace(out) != "lo" {
		t.Errorf("a NONE sandbox's interfaces and routes: %q, want only lo", out)
	}
}

// TestNetworkRequests: bad allow-lists name their field; NONE takes none.
func TestNetworkRequests(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "netr-"+randHex(2))
	ctx := context.Background()
	create := func(p *berthv1.NetworkPolicy) error {
		resp, err := ne.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Network: p})
		if err == nil {
			ne.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
		}
		return err
	}
	inside := ne.cfg.Subnet.Addr().Next().Next().String()
	for _, c := range []struct {
		p     *berthv1.NetworkPolicy
		field string
	}{
		{egress("ok.example", "no spaces.example"), "network.allow[1]"},
		{egress("::1"), "network.allow[0]"},
		{egress(inside), "network.allow[0]"},
		{egress("x.example:0"), "network.allow[0]"},
		{&berthv1.NetworkPolicy{Allow: []string{"10.0.0.0/8"}}, "network.allow"},
		{&berthv1.NetworkPolicy{Mode: 7}, "network.mode"},
	} {
		wantStatus(t, create(c.p), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, c.field)
	}
	// Without a network, EGRESS is refused by name; NONE works.
	wantStatus(t, createIn(env.sandboxes, egress("10.0.0.0/8")), codes.FailedPrecondition, rpcstatus.ReasonNetworkUnavailable, "")
}

func createIn(sandboxes berthv1.SandboxServiceClient, p *berthv1.NetworkPolicy) error {
	resp, err := sandboxes.CreateSandbox(context.Background(), &berthv1.CreateSandboxRequest{Image: env.image, Network: p})
	if err == nil {
		sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
	}
	return err
}

// TestNetworkCleanup: 50 EGRESS sandboxes created and deleted leave no
// interface on the bridge, no rule, set element or chain, no lease, no
// namespace and no record.
func TestNetworkCleanup(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "netc-"+randHex(2))
	const n = 50
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 5)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := ne.sandboxes.CreateSandbox(context.Background(), &berthv1.CreateSandboxRequest{Image: env.image,
				Network: egress("example.test:443", "192.0.2.0/24", "198.51.100.1")})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			ids[i] = resp.GetSandbox().GetId()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if got := bridgePorts(t, ne.cfg.Bridge); len(got) != n {
		t.Errorf("bridge %s has %d ports with %d sandboxes", ne.cfg.Bridge, len(got), n)
	}
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := ne.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
				t.Errorf("delete %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	checkNetworkEmpty(t, ne)
}

// checkNetworkEmpty fails when anything of a sandbox is left in ne's
// network.
func checkNetworkEmpty(t *testing.T, ne *netEnv) {
	t.Helper()
	if got := bridgePorts(t, ne.cfg.Bridge); len(got) != 0 {
		t.Errorf("interfaces left on bridge %s: %v", ne.cfg.Bridge, got)
	}
	table := "berth-" + ne.cfg.Bridge
	for _, family := range []string{"inet", "bridge"} {
		out, err := exec.Command("nft", "-j", "list", "table", family, table).Output()
		if err != nil {
			t.Fatalf("nft list table %s %s: %v", family, table, err)
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatal(err)
		}
		for _, item := range doc.Nftables {
			var obj struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			}
			for kind, raw := range item {
				json.Unmarshal(raw, &obj)
				if strings.HasPrefix(obj.Name, "sb") {
					t.Errorf("nft %s %s left: %s %s", family, table, kind, obj.Name)
				}
				if (kind == "set" || kind == "map") && obj.Name != "protected" && len(obj.Elem) > 0 {
					t.Errorf("nft %s %s: %s %s keeps %d elements", family, table, kind, obj.Name, len(obj.Elem))
				}
			}
		}
	}
	for _, dir := range []string{"netns", "sandboxes", "resolv", filepath.Join("ipam", "berth-"+ne.cfg.Bridge)} {
		entries, _ := os.ReadDir(filepath.Join(ne.cfg.StateDir, dir))
		for _, e := range entries {
			if dir == "ipam/berth-"+ne.cfg.Bridge && (e.Name() == "lock" || strings.HasPrefix(e.Name(), "last_reserved_ip")) {
				continue
			}
			t.Errorf("left in %s: %s", dir, e.Name())
		}
	}
	results, _ := filepath.Glob("/var/lib/cni/results/berth-" + ne.cfg.Bridge + "-*")
	if len(results) > 0 {
		t.Errorf("libcni results left: %v", results)
	}
}

// bridgePorts returns the names of the interfaces attached to bridge.
func bridgePorts(t testing.TB, bridge string) []string {
	t.Helper()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// TestNetworkRestart: berthd killed and started again keeps an EGRESS
// sandbox's connectivity — a connection open across the restart carries
// bytes both ways, an address its resolver opened before is still open
// without a new lookup, new lookups work — and removes the network of a
// sandbox that went while it was down.
func TestNetworkRestart(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "netk-"+randHex(2))
	o := newOutside(t)
	ne.dns.set("named.test", o.denied)
	sb := ne.create(t, egress("named.test:80", o.allowed.String()+":80", o.allowed.String()+":82"))
	if !ne.reaches(t, sb.GetId(), "named.test", 80, o.denied.String()) {
		t.Fatal("named.test does not answer before the restart")
	}
	gone := ne.create(t, egress("192.0.2.1"))

	// A connection from the sandbox to allowed:82, open across the
	// restart: nc reads its stdin from a FIFO that later execs write to
	// and writes what it receives to /tmp/across.
	lis, err := listenIn("/run/netns/"+o.name, netip.AddrPortFrom(o.allowed, 82).String())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := lis.Accept(); err == nil {
			accepted <- c
		}
	}()
	if out, code := ne.sh(t, sb.GetId(), fmt.Sprintf(
		"mkfifo /tmp/in && setsid sh -c 'sleep 600 >/tmp/in & nc %s 82 </tmp/in >/tmp/across' >/dev/null 2>&1 &", o.allowed)); code != 0 {
		t.Fatalf("start nc in the sandbox: exit %d: %s", code, out)
	}
	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox's connection to allowed:82 did not arrive")
	}
	defer conn.Close()
	// across checks, bounded, that each direction carries a line.
	across := func(when, line, want string) {
		t.Helper()
		if _, err := fmt.Fprintln(conn, line); err != nil {
			t.Fatalf("%s: write to the sandbox's connection: %v", when, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := ne.sh(t, sb.GetId(), "cat /tmp/across")
			if out == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the sandbox received %q over its open connection, want %q", when, out, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, code := ne.sh(t, sb.GetId(), "echo up-"+line+" >/tmp/in"); code != 0 {
			t.Fatalf("%s: write to nc's FIFO failed", when)
		}
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 64)
		n, err := io.ReadAtLeast(conn, buf, len("up-"+line+"\n"))
		if got := string(buf[:n]); err != nil || got != "up-"+line+"\n" {
			t.Fatalf("%s: read %q (%v) from the sandbox over its open connection, want %q", when, got, err, "up-"+line+"\n")
		}
	}
	across("before the restart", "before", "before\n")

	ne.proc.cmd.Process.Kill()
	<-ne.proc.exited
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ne.rt.Delete(ctx, gone.GetId()); err != nil { // behind berthd's back
		t.Fatal(err)
	}
	ne.proc = startBerthd(t, ne.berthEnv, ne.flags...)

	across("after the restart", "after", "before\nafter\n")
	if !ne.reaches(t, sb.GetId(), o.denied.String(), 80, o.denied.String()) {
		t.Error("after the restart, the address named.test opened is closed")
	}
	if !ne.reaches(t, sb.GetId(), o.allowed.String(), 80, o.allowed.String()) {
		t.Error("after the restart, the allowed address is closed")
	}
	ne.dns.set("named.test", o.linkLocal) // a protected address: never opened by a name
	if ne.reaches(t, sb.GetId(), "named.test", 80, o.linkLocal.String()) {
		t.Error("after the restart, a name opened a link-local address")
	}
	ne.dns.set("named.test", o.denied)
	if !ne.reaches(t, sb.GetId(), "named.test", 80, o.denied.String()) {
		t.Error("after the restart, named.test does not resolve or answer")
	}
	got, err := ne.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
	if err != nil || got.GetSandbox().GetNetworkAddress() != sb.GetNetworkAddress() {
		t.Errorf("after the restart: network_address %q (%v), want %q", got.GetSandbox().GetNetworkAddress(), err, sb.GetNetworkAddress())
	}
	// The sandbox that went while berthd was down left nothing.
	if _, err := os.Stat(filepath.Join(ne.cfg.StateDir, "netns", gone.GetId())); !os.IsNotExist(err) {
		t.Errorf("network namespace of %s (gone while berthd was down): %v, want it removed", gone.GetId(), err)
	}
	if ports := bridgePorts(t, ne.cfg.Bridge); len(ports) != 1 {
		t.Errorf("bridge ports after the restart: %v, want the one live sandbox's", ports)
	}
	if _, err := ne.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	checkNetworkEmpty(t, ne)
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestNetworkMaxConnections: with max_connections 2 and two connections
// open, a third is refused; once one closes, a new one opens.
func TestNetworkMaxConnections(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "netm-"+randHex(2))
	o := newOutside(t)
	p := egress(o.allowed.String())
	p.MaxConnections = 2
	sb := ne.create(t, p)
	id := sb.GetId()
	// Two connections held open by the server on port 81, in background
	// execs of their own.
	var jobs []string
	for range 2 {
		st, err := ne.sandboxes.Run(context.Background(), &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{
			ShellCommand: fmt.Sprintf("setsid sh -c 'sleep 600 | nc %s 81' >/dev/null 2>&1 & echo $!", o.allowed)}})
		if err != nil || st.GetResult().GetExitCode() != 0 {
			t.Fatalf("open a held connection: %v %v", err, st)
		}
		jobs = append(jobs, strings.TrimSpace(string(st.GetStdout())))
	}
	established := func() int {
		out, _ := ne.sh(t, id, fmt.Sprintf("netstat -tn | grep -c '%s:81 *ESTABLISHED'", o.allowed))
		n := 0
		fmt.Sscan(out, &n)
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for established() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two held connections did not open")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ne.reaches(t, id, o.allowed.String(), 80, o.allowed.String()) {
		t.Error("a third connection opened with max_connections 2 and two open")
	}
	// Each job leads a session of its own: kill its process group.
	ne.sh(t, id, "kill -9 -- -"+jobs[0]+" -"+jobs[1])
	for established() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the held connections did not close")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The kernel forgets a closed connection once its conntrack entry is
	// gone (TIME_WAIT/CLOSE); poll, bounded, for a new one to open.
	for !ne.reaches(t, id, o.allowed.String(), 80, o.allowed.String()) {
		if time.Now().After(deadline.Add(2 * time.Minute)) {
			t.Fatal("no new connection opened after the held ones closed")
		}
		time.Sleep(time.Second)
	}
}

// TestNetworkBandwidth: bandwidth caps become token buckets (tc tbf) on the
// sandbox's host interface (what it receives) and on an ifb device fed
// from it (what it sends); both go with the sandbox. The sandbox is made
// by `berth sandbox create` with every network flag.
func TestNetworkBandwidth(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "netb-"+randHex(2))
	out, err := exec.Command(env.cliBinary, "--addr", "unix://"+ne.sock, "sandbox", "create", "--image", env.image,
		"--egress", "192.0.2.0/24", "--egress", "pypi.example:443", "--max-connections", "7",
		"--egress-bytes-per-second", "1000000", "--ingress-bytes-per-second", "2000000").CombinedOutput()
	if err != nil {
		t.Fatalf("berth sandbox create --egress ...: %v: %s", err, out)
	}
	got, err := ne.sandboxes.GetSandbox(context.Background(), &berthv1.GetSandboxRequest{SandboxId: strings.TrimSpace(string(out))})
	if err != nil {
		t.Fatalf("GetSandbox of what berth sandbox create printed (%q): %v", out, err)
	}
	sb := got.GetSandbox()
	t.Cleanup(func() {
		ne.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()})
	})
	want := &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: []string{"192.0.2.0/24", "pypi.example:443"},
		MaxConnections: 7, EgressBytesPerSecond: 1_000_000, IngressBytesPerSecond: 2_000_000}
	if !proto.Equal(sb.GetNetwork(), want) {
		t.Errorf("Sandbox.network = %v, want %v (the CLI's flags)", sb.GetNetwork(), want)
	}
	ports := bridgePorts(t, ne.cfg.Bridge)
	if len(ports) != 1 {
		t.Fatalf("bridge ports: %v", ports)
	}
	tc := func(dev string) string {
		out, err := exec.Command("tc", "qdisc", "show", "dev", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("tc qdisc show dev %s: %v: %s", dev, err, out)
		}
		return string(out)
	}
	if q := tc(ports[0]); !strings.Contains(q, "qdisc tbf") || !strings.Contains(q, "rate 16Mbit") {
		t.Errorf("qdiscs of the sandbox's host interface %s: %q, want tbf at 16Mbit (2 MB/s in)", ports[0], q)
	}
	ifbs, err := exec.Command("ip", "-o", "link", "show", "type", "ifb").Output()
	if err != nil {
		t.Fatal(err)
	}
	var ifb string
	for _, line := range strings.Split(string(ifbs), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "bwp") {
			name := strings.TrimSuffix(f[1], ":")
			if strings.Contains(tc(name), "rate 8Mbit") {
				ifb = name
			}
		}
	}
	if ifb == "" {
		t.Fatalf("no ifb device with a tbf at 8Mbit (1 MB/s out) among %q", ifbs)
	}
	if _, err := ne.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(ifb); err == nil {
		t.Errorf("ifb device %s left after the delete", ifb)
	}
	checkNetworkEmpty(t, ne)
}
