package network

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/e2e"
)

func testRuleset() *ruleset {
	return &ruleset{table: "berth-bt-unit", bridge: "bt-unit", subnet: netip.MustParsePrefix("10.89.0.0/16"),
		gateway: netip.MustParseAddr("10.89.0.1"), dnsUDP: 40000, dnsTCP: 40001,
		protected: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("10.89.0.0/16")}}
}

func testAttachment(t *testing.T, id, addr, veth string, maxConns uint32, allow ...string) *attachment {
	t.Helper()
	p, err := ParsePolicy("allow", allow, maxConns, netip.MustParsePrefix("10.89.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	return &attachment{ID: id, Addr: netip.MustParseAddr(addr), Veth: veth, Allow: p.Entries(), Policy: p}
}

// TestRulesetOrder checks the order that makes the policy: an entry inside a
// protected range before the protected reject, the others after it, names
// last, then the final reject; only single addresses reach the host.
func TestRulesetOrder(t *testing.T) {
	r := testRuleset()
	a := testAttachment(t, "sb-1", "10.89.0.2", "veth01", 10, "0.0.0.0/0", "169.254.169.254:80", "pypi.org:443", "192.0.2.2:22")
	got := r.attach(a)
	order := []string{
		"ct count over 10",
		"ip daddr 169.254.169.254/32 meta l4proto { tcp, udp } th dport 80 accept",
		"ip daddr @protected reject",
		"ip daddr 0.0.0.0/0 accept",
		"ip daddr @sb-sb-1-names accept",
		"ip daddr . th dport @sb-sb-1-ports accept",
		`add rule inet berth-bt-unit sb-sb-1 reject`,
		"sandboxes { 10.89.0.2 : jump sb-sb-1 }",
	}
	at := 0
	for _, want := range order {
		i := strings.Index(got[at:], want)
		if i < 0 {
			t.Fatalf("attach script lacks %q after position %d:\n%s", want, at, got)
		}
		at += i
	}
	host := got[strings.Index(got, "add chain inet berth-bt-unit sbh-sb-1"):]
	if !strings.Contains(host, "ip daddr 192.0.2.2/32 meta l4proto { tcp, udp } th dport 22 accept") ||
		!strings.Contains(host, "ip daddr 169.254.169.254/32") || strings.Contains(host, "0.0.0.0/0") {
		t.Errorf("host chain: only single addresses may reach the host:\n%s", host)
	}
}

// TestRulesetApplies loads the tables, two sandboxes, DNS elements and a
// detach into nft in a network namespace of its own (unshare -n), so the
// host's rules are never touched.
func TestRulesetApplies(t *testing.T) {
	e2e.NeedRoot(t, "a network namespace")
	if _, err := exec.LookPath("nft"); err != nil {
		e2e.Missing(t, "nft not installed (scripts/deps.sh installs nftables)")
	}
	r := testRuleset()
	a := testAttachment(t, "sb-1", "10.89.0.2", "veth01", 10, "0.0.0.0/0", "pypi.org:443", "192.0.2.2")
	b := testAttachment(t, "sb-2", "10.89.0.3", "veth02", 0, "10.0.0.0/8:5432")
	elems := []setElement{{ID: "sb-1", Addr: netip.MustParseAddr("198.51.100.7"), Port: 443, Timeout: 90 * time.Second},
		{ID: "sb-1", Addr: netip.MustParseAddr("198.51.100.8"), Timeout: 90 * time.Second}}
	script := r.define([]*attachment{a}, elems) + r.attach(b) + r.detach(a) + r.attach(a) + r.addElement(elems[0])
	cmd := exec.CommandContext(context.Background(), "unshare", "-n", "sh", "-c", "nft -f - && nft -j list table inet berth-bt-unit")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v\n%s\nscript:\n%s", err, out, script)
	}
	// The listing parses back into the element berth re-adds at restart.
	if !strings.Contains(string(out), `"concat": ["198.51.100.7", 443]`) {
		t.Errorf("listing lacks the re-added element:\n%s", out)
	}
}

func TestParseElement(t *testing.T) {
	e, ok := parseElement([]byte(`{"elem": {"val": {"concat": ["1.2.3.4", 443]}, "timeout": 120, "expires": 119}}`), true)
	if !ok || e.Addr != netip.MustParseAddr("1.2.3.4") || e.Port != 443 || e.Timeout != 119*time.Second {
		t.Errorf("parseElement(ports) = %+v, %v", e, ok)
	}
	e, ok = parseElement([]byte(`{"elem": {"val": "1.2.3.4", "timeout": 120, "expires": 7}}`), false)
	if !ok || e.Addr != netip.MustParseAddr("1.2.3.4") || e.Port != 0 || e.Timeout != 7*time.Second {
		t.Errorf("parseElement(names) = %+v, %v", e, ok)
	}
}
