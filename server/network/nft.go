package network

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// berth's nftables rules live in two tables of its own, named for its
// bridge ("berth-<bridge>"), in the inet family (filtering what sandboxes
// send, NAT) and the bridge family (frames between sandboxes, spoofed
// sources). Nothing else on the host is touched: base chains accept by
// policy and decide only about packets of berth's bridge.
//
// They are written with the nft command as whole transactions (`nft -f`
// applies a file atomically): the text is what an operator reads back with
// `nft list table inet berth-berth0`. (github.com/google/nftables needs
// every expression assembled by hand as kernel bytecode; the text here is
// shorter to review and is the form operators debug.)

// nftTimeout bounds one nft run.
const nftTimeout = 30 * time.Second

// ruleset describes the tables of one berth network.
type ruleset struct {
	table     string // table name in both families
	bridge    string
	subnet    netip.Prefix
	gateway   netip.Addr
	protected []netip.Prefix // never reached unless an entry lies inside one
	dnsUDP    uint16         // resolver ports on the gateway address
	dnsTCP    uint16
}

// Set and chain names. Per-sandbox names carry the sandbox id, which is
// [a-z0-9-], 1 to 63 bytes: nft identifiers as they are (nft 1.0 takes no
// quoted chain or set names).
func sbChain(id string) string     { return "sb-" + id }
func sbHostChain(id string) string { return "sbh-" + id }
func sbNames(id string) string     { return "sb-" + id + "-names" }
func sbPorts(id string) string     { return "sb-" + id + "-ports" }

const reject = "reject with icmpx type admin-prohibited"

// define returns the script that creates both tables from nothing
// (deleting what there was) with the sandboxes given. Frames of the
// bridge's ports are recognized by the ports' names (set portnames): the
// bridge family's "meta ibrname" needs a kernel module not every kernel
// has.
func (r *ruleset) define(sandboxes []*attachment, elements []setElement) string {
	var b strings.Builder
	// "add table" then "delete table": the delete always finds one.
	fmt.Fprintf(&b, "add table inet %s\ndelete table inet %s\n", r.table, r.table)
	fmt.Fprintf(&b, "add table bridge %s\ndelete table bridge %s\n", r.table, r.table)
	br := strconv.Quote(r.bridge)
	fmt.Fprintf(&b, `table inet %[1]s {
	set protected {
		type ipv4_addr; flags interval;
		elements = { %[2]s }
	}
	map sandboxes {
		type ipv4_addr : verdict;
	}
	map hostaccess {
		type ipv4_addr : verdict;
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		oifname %[3]s ct state established,related accept
		oifname %[3]s %[4]s
		iifname %[3]s ct state established,related accept
		iifname %[3]s ip saddr vmap @sandboxes
		iifname %[3]s %[4]s
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname %[3]s ct state established,related accept
		iifname %[3]s ip daddr %[5]s udp dport %[6]d accept
		iifname %[3]s ip daddr %[5]s tcp dport %[7]d accept
		iifname %[3]s ip saddr vmap @hostaccess
		iifname %[3]s %[4]s
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname %[3]s ip daddr %[5]s udp dport 53 dnat ip to %[5]s:%[6]d
		iifname %[3]s ip daddr %[5]s tcp dport 53 dnat ip to %[5]s:%[7]d
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %[8]s oifname != %[3]s masquerade
	}
}
table bridge %[1]s {
	set ports {
		type ifname . ipv4_addr;
	}
	set portnames {
		type ifname;
	}
	chain prerouting {
		type filter hook prerouting priority filter; policy accept;
		iifname @portnames ether type ip6 drop
		iifname @portnames ether type ip iifname . ip saddr != @ports drop
		iifname @portnames ether type arp iifname . arp saddr ip != @ports drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname @portnames drop
	}
}
`, r.table, prefixList(r.protected), br, reject, r.gateway, r.dnsUDP, r.dnsTCP, r.subnet)
	for _, a := range sandboxes {
		b.WriteString(r.attach(a))
	}
	for _, e := range elements {
		b.WriteString(r.addElement(e))
	}
	return b.String()
}

func prefixList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}

// attach returns the commands that open a's allow-list for its address.
func (r *ruleset) attach(a *attachment) string {
	var b strings.Builder
	t := "inet " + r.table
	id := a.ID
	fmt.Fprintf(&b, "add set %s %s { type ipv4_addr; flags timeout; size %d; }\n", t, sbNames(id), maxNameAddrs)
	fmt.Fprintf(&b, "add set %s %s { type ipv4_addr . inet_service; flags timeout; size %d; }\n", t, sbPorts(id), maxNameAddrs)
	chain := sbChain(id)
	fmt.Fprintf(&b, "add chain %s %s\n", t, chain)
	rule := func(format string, args ...any) {
		fmt.Fprintf(&b, "add rule %s %s %s\n", t, chain, fmt.Sprintf(format, args...))
	}
	if a.Policy.MaxConnections > 0 {
		rule("ct state new ct count over %d %s", a.Policy.MaxConnections, reject)
	}
	var inside, outside []Rule
	for _, rl := range a.Policy.Allow {
		if rl.IsName() {
			continue
		}
		if r.isProtected(rl.Prefix) {
			inside = append(inside, rl)
		} else {
			outside = append(outside, rl)
		}
	}
	for _, rl := range inside {
		rule("%s", accept(rl))
	}
	rule("ip daddr @protected %s", reject)
	for _, rl := range outside {
		rule("%s", accept(rl))
	}
	rule("ip daddr @%s accept", sbNames(id))
	rule("meta l4proto { tcp, udp } ip daddr . th dport @%s accept", sbPorts(id))
	rule("%s", reject)
	fmt.Fprintf(&b, "add element %s sandboxes { %s : jump %s }\n", t, a.Addr, chain)

	// Host addresses only as single addresses: a range never opens the
	// host (the input hook sees only packets for the host itself).
	var host []Rule
	for _, rl := range a.Policy.Allow {
		if !rl.IsName() && rl.Prefix.IsSingleIP() {
			host = append(host, rl)
		}
	}
	if len(host) > 0 {
		hchain := sbHostChain(id)
		fmt.Fprintf(&b, "add chain %s %s\n", t, hchain)
		for _, rl := range host {
			fmt.Fprintf(&b, "add rule %s %s %s\n", t, hchain, accept(rl))
		}
		fmt.Fprintf(&b, "add element %s hostaccess { %s : jump %s }\n", t, a.Addr, hchain)
	}
	fmt.Fprintf(&b, "add element bridge %s ports { %s . %s }\n", r.table, q(a.Veth), a.Addr)
	fmt.Fprintf(&b, "add element bridge %s portnames { %s }\n", r.table, q(a.Veth))
	return b.String()
}

// detach returns the commands that remove what attach added.
func (r *ruleset) detach(a *attachment) string {
	var b strings.Builder
	t := "inet " + r.table
	id := a.ID
	fmt.Fprintf(&b, "delete element %s sandboxes { %s }\n", t, a.Addr)
	fmt.Fprintf(&b, "flush chain %s %s\ndelete chain %s %s\n", t, sbChain(id), t, sbChain(id))
	for _, rl := range a.Policy.Allow {
		if !rl.IsName() && rl.Prefix.IsSingleIP() {
			fmt.Fprintf(&b, "delete element %s hostaccess { %s }\n", t, a.Addr)
			fmt.Fprintf(&b, "flush chain %s %s\ndelete chain %s %s\n", t, sbHostChain(id), t, sbHostChain(id))
			break
		}
	}
	fmt.Fprintf(&b, "delete set %s %s\ndelete set %s %s\n", t, sbNames(id), t, sbPorts(id))
	fmt.Fprintf(&b, "delete element bridge %s ports { %s . %s }\n", r.table, q(a.Veth), a.Addr)
	fmt.Fprintf(&b, "delete element bridge %s portnames { %s }\n", r.table, q(a.Veth))
	return b.String()
}

// isProtected reports whether p lies inside a protected range.
func (r *ruleset) isProtected(p netip.Prefix) bool {
	for _, pr := range r.protected {
		if pr.Bits() <= p.Bits() && pr.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// accept is the rule text accepting traffic to rl's range and port.
func accept(rl Rule) string {
	if rl.Port == 0 {
		return fmt.Sprintf("ip daddr %s accept", rl.Prefix)
	}
	return fmt.Sprintf("ip daddr %s meta l4proto { tcp, udp } th dport %d accept", rl.Prefix, rl.Port)
}

// q quotes an nft identifier or string.
func q(s string) string { return strconv.Quote(s) }

// setElement is one address opened for a sandbox by a DNS answer: in its
// names set (Port 0) or its ports set.
type setElement struct {
	ID      string
	Addr    netip.Addr
	Port    uint16
	Timeout time.Duration
}

func (r *ruleset) elementText(e setElement) (set, elem string) {
	if e.Port == 0 {
		return sbNames(e.ID), e.Addr.String()
	}
	return sbPorts(e.ID), fmt.Sprintf("%s . %d", e.Addr, e.Port)
}

func (r *ruleset) addElement(e setElement) string {
	set, elem := r.elementText(e)
	return fmt.Sprintf("add element inet %s %s { %s timeout %ds }\n", r.table, set, elem, int(e.Timeout.Seconds()))
}

func (r *ruleset) deleteElement(e setElement) string {
	set, elem := r.elementText(e)
	return fmt.Sprintf("delete element inet %s %s { %s }\n", r.table, set, elem)
}

// nft runs `nft -f -` with script as one transaction.
func nft(ctx context.Context, script string) error {
	ctx, cancel := context.WithTimeout(ctx, nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// nftJSON runs `nft -j args...` and returns its output.
func nftJSON(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, nftTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", append([]string{"-j"}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft -j %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// tableExists reports whether `inet table` exists.
func tableExists(ctx context.Context, table string) bool {
	_, err := nftJSON(ctx, "list", "table", "inet", table)
	return err == nil
}

// readElements returns the addresses DNS answers opened in the table's
// per-sandbox sets, with the time each has left, so that a rebuild keeps
// them.
func readElements(ctx context.Context, table string) ([]setElement, error) {
	out, err := nftJSON(ctx, "list", "table", "inet", table)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Nftables []struct {
			Set *struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parse nft -j list table: %w", err)
	}
	var elems []setElement
	for _, item := range doc.Nftables {
		s := item.Set
		if s == nil || !strings.HasPrefix(s.Name, "sb-") {
			continue
		}
		var id string
		var ports bool
		switch {
		case strings.HasSuffix(s.Name, "-names"):
			id = strings.TrimSuffix(strings.TrimPrefix(s.Name, "sb-"), "-names")
		case strings.HasSuffix(s.Name, "-ports"):
			id, ports = strings.TrimSuffix(strings.TrimPrefix(s.Name, "sb-"), "-ports"), true
		default:
			continue
		}
		for _, raw := range s.Elem {
			e, ok := parseElement(raw, ports)
			if !ok {
				continue
			}
			e.ID = id
			elems = append(elems, e)
		}
	}
	return elems, nil
}

// parseElement reads one element of nft's JSON: {"elem": {"val": V,
// "expires": S}} where V is an address or {"concat": [addr, port]}.
func parseElement(raw json.RawMessage, ports bool) (setElement, bool) {
	var el struct {
		Elem struct {
			Val     json.RawMessage `json:"val"`
			Expires int64           `json:"expires"`
		} `json:"elem"`
	}
	if json.Unmarshal(raw, &el) != nil || el.Elem.Expires <= 0 {
		return setElement{}, false
	}
	e := setElement{Timeout: time.Duration(el.Elem.Expires) * time.Second}
	if !ports {
		var s string
		if json.Unmarshal(el.Elem.Val, &s) != nil {
			return setElement{}, false
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return setElement{}, false
		}
		e.Addr = a
		return e, true
	}
	var c struct {
		Concat []json.RawMessage `json:"concat"`
	}
	if json.Unmarshal(el.Elem.Val, &c) != nil || len(c.Concat) != 2 {
		return setElement{}, false
	}
	var s string
	var port uint16
	if json.Unmarshal(c.Concat[0], &s) != nil || json.Unmarshal(c.Concat[1], &port) != nil {
		return setElement{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || port == 0 {
		return setElement{}, false
	}
	e.Addr, e.Port = a, port
	return e, true
}

// removeTables deletes both tables; missing ones are not an error.
func removeTables(ctx context.Context, table string) error {
	return nft(ctx, fmt.Sprintf("add table inet %[1]s\ndelete table inet %[1]s\nadd table bridge %[1]s\ndelete table bridge %[1]s\n", table))
}
