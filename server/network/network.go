// Package network gives sandboxes of network mode EGRESS a network: a
// network namespace of their own with one interface on berth's bridge (CNI:
// the bridge, host-local and loopback plugins driven through containerd's
// go-cni), nftables rules berth owns that let through only what the
// sandbox's allow-list names, and a DNS resolver on the bridge that answers
// only allow-listed names and opens the addresses it returns. Sandboxes of
// mode NONE never reach this package: they keep the runtime's own empty
// network namespace (only lo).
//
// Deny by default: a sandbox reaches nothing but its allow-list; never the
// host's own addresses (unless an entry names one address exactly), never
// the protected ranges (link-local with cloud metadata 169.254.169.254,
// loopback, multicast, the sandboxes' own subnet, Config.Deny) unless an
// entry lies inside one, and never another sandbox: frames between bridge
// ports are dropped and routed connections into sandboxes are refused.
// Nothing comes in: only replies to the sandbox's own connections.
//
// State: one record per attached sandbox in Config.StateDir (its address,
// host interface and allow-list), the pinned network namespaces, host-local's
// leases and libcni's result cache. A restarted berthd re-adopts the
// sandboxes still alive (Start) and removes everything of the others.
package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/vishvananda/netlink"
)

// Defaults of Config.
const (
	DefaultBridge = "berth0"
	// DefaultSubnet is the sandboxes' IPv4 network: 65534 addresses.
	DefaultSubnet = "10.89.0.0/16"
)

// DefaultPluginDirs are where CNI plugins are looked for: Debian's
// containernetworking-plugins, then the upstream release's place.
var DefaultPluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// maxNameAddrs bounds the addresses DNS answers may open per sandbox and
// set (nftables set size): a sandbox resolving names without end cannot
// grow the kernel's tables without bound.
const maxNameAddrs = 4096

// ErrUnavailable wraps why EGRESS sandboxes cannot be made (berthd has no
// working network: plugins or nft missing, the bridge could not be set up).
var ErrUnavailable = errors.New("egress network unavailable")

// Config configures a Manager. Two berthds on one host need different
// Bridge and Subnet values.
type Config struct {
	// Bridge is the host bridge sandboxes attach to, 1 to 15 characters
	// of [a-zA-Z0-9_-]. It also names the nftables tables
	// ("berth-<Bridge>", families inet and bridge) and the CNI network.
	// Default DefaultBridge.
	Bridge string
	// Subnet is the sandboxes' IPv4 network; its first address is the
	// bridge's (the sandboxes' gateway and resolver). Default
	// DefaultSubnet.
	Subnet netip.Prefix
	// StateDir holds the network's state: records, pinned network
	// namespaces, IPAM leases, resolv.conf files. Required; keep it on a
	// tmpfs (it describes what lives until reboot), e.g. /run/berth/net.
	StateDir string
	// PluginDirs are searched for the CNI plugins bridge, host-local,
	// loopback and bandwidth. Default DefaultPluginDirs.
	PluginDirs []string
	// DNSUpstreams are the resolvers ("host:port") berth's resolver asks
	// for allow-listed names, from the host. Default: the nameservers of
	// the host's /etc/resolv.conf, port 53.
	DNSUpstreams []string
	// Deny are more IPv4 ranges sandboxes never reach unless an entry lies
	// inside one (e.g. the operator's own infrastructure).
	Deny []netip.Prefix
}

var bridgeName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,15}$`)

func (c *Config) setDefaults() error {
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if !bridgeName.MatchString(c.Bridge) {
		return fmt.Errorf("bridge name %q: want 1 to 15 characters of [a-zA-Z0-9_-]", c.Bridge)
	}
	if !c.Subnet.IsValid() {
		c.Subnet = netip.MustParsePrefix(DefaultSubnet)
	}
	if !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 29 {
		return fmt.Errorf("subnet %s: want an IPv4 network of /29 or larger", c.Subnet)
	}
	c.Subnet = c.Subnet.Masked()
	if c.StateDir == "" {
		return errors.New("network state directory is empty")
	}
	if len(c.PluginDirs) == 0 {
		c.PluginDirs = DefaultPluginDirs
	}
	if len(c.DNSUpstreams) == 0 {
		c.DNSUpstreams = hostNameservers("/etc/resolv.conf")
	}
	return nil
}

// Attachment is what a sandbox's container needs to join its network.
type Attachment struct {
	// NetNS is the path of the pinned network namespace to join.
	NetNS string
	// ResolvConf is a host file to bind-mount read-only at
	// /etc/resolv.conf: berth's resolver on the gateway.
	ResolvConf string
	// Addr is the sandbox's IPv4 address.
	Addr netip.Addr
}

// attachment is the record of one attached sandbox, kept as JSON in
// StateDir/sandboxes/<id>.json.
type attachment struct {
	ID             string     `json:"id"`
	Addr           netip.Addr `json:"addr"`
	Veth           string     `json:"veth"` // host side of its veth pair
	Allow          []string   `json:"allow"`
	MaxConnections uint32     `json:"max_connections,omitempty"`
	EgressRate     uint64     `json:"egress_bytes_per_second,omitempty"`
	IngressRate    uint64     `json:"ingress_bytes_per_second,omitempty"`
	Policy         Policy     `json:"-"`
}

// Manager attaches sandboxes to berth's network. It is safe for concurrent
// use.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	rules   *ruleset
	cni     gocni.CNI
	gateway netip.Addr
	res     *resolver

	mu       sync.Mutex // serializes nft transactions and guards the maps
	attached map[string]*attachment
	byAddr   map[netip.Addr]*attachment
	opened   map[elementKey]time.Time // DNS-opened set elements: when they expire
}

// elementKey names one set element of a sandbox.
type elementKey struct {
	id   string
	addr netip.Addr
	port uint16
}

// New checks what the network needs (the CNI plugins, nft) and returns a
// Manager; Start sets the network up. Errors wrap ErrUnavailable.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "bandwidth"} {
		if !pluginExists(cfg.PluginDirs, plugin) {
			return nil, fmt.Errorf("%w: CNI plugin %s not found in %s (Debian: apt-get install containernetworking-plugins)", ErrUnavailable, plugin, strings.Join(cfg.PluginDirs, ", "))
		}
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("%w: nft not found (Debian: apt-get install nftables)", ErrUnavailable)
	}
	gateway := cfg.Subnet.Addr().Next()
	m := &Manager{cfg: cfg, log: log, gateway: gateway,
		attached: make(map[string]*attachment), byAddr: make(map[netip.Addr]*attachment), opened: make(map[elementKey]time.Time)}
	protected := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"), // link-local: cloud metadata (169.254.169.254)
		netip.MustParsePrefix("224.0.0.0/3"),    // multicast, reserved, broadcast
		cfg.Subnet,
	}
	m.rules = &ruleset{table: "berth-" + cfg.Bridge, bridge: cfg.Bridge, subnet: cfg.Subnet, gateway: gateway,
		protected: append(protected, cfg.Deny...)}
	conf, err := m.cniConfList()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	m.cni, err = gocni.New(gocni.WithPluginDir(cfg.PluginDirs), gocni.WithMinNetworkCount(2),
		gocni.WithConfListBytes(conf), gocni.WithLoNetwork)
	if err != nil {
		return nil, fmt.Errorf("%w: CNI configuration: %v", ErrUnavailable, err)
	}
	return m, nil
}

func pluginExists(dirs []string, name string) bool {
	for _, d := range dirs {
		if st, err := os.Stat(filepath.Join(d, name)); err == nil && st.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// cniConfList is the CNI network: the bridge plugin on Config.Bridge
// (which Start creates with the gateway address, so the plugin neither
// assigns it nor turns on the host's IP forwarding) with host-local
// addresses and a default route through the gateway, then the bandwidth
// plugin, which does nothing unless a sandbox's policy sets a rate.
func (m *Manager) cniConfList() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "berth-" + m.cfg.Bridge,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": m.cfg.Bridge, "isGateway": false, "ipMasq": false, "hairpinMode": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": m.cfg.Subnet.String(), "gateway": m.gateway.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": m.dir("ipam"),
			},
		}, map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}}},
	}
	return json.Marshal(conf)
}

// bandwidth is p's rates for the bandwidth plugin: bits per second, with
// bursts of a tenth of a second (at least 64 KiB, above any MTU).
func bandwidth(p Policy) gocni.BandWidth {
	var bw gocni.BandWidth
	burst := func(rate uint64) uint64 { return max(rate*8/10, 64<<10*8) }
	if r := p.IngressBytesPerSecond; r > 0 {
		bw.IngressRate, bw.IngressBurst = r*8, burst(r)
	}
	if r := p.EgressBytesPerSecond; r > 0 {
		bw.EgressRate, bw.EgressBurst = r*8, burst(r)
	}
	return bw
}

// Subnet returns the sandboxes' network.
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

// Gateway returns the bridge's address: the sandboxes' gateway and
// resolver.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// Bridge returns the bridge's name.
func (m *Manager) Bridge() string { return m.cfg.Bridge }

// Table returns the name of berth's nftables tables (inet and bridge).
func (m *Manager) Table() string { return m.rules.table }

func (m *Manager) dir(parts ...string) string {
	return filepath.Join(append([]string{m.cfg.StateDir}, parts...)...)
}

func (m *Manager) netnsPath(id string) string  { return m.dir("netns", id) }
func (m *Manager) recordPath(id string) string { return m.dir("sandboxes", id+".json") }
func (m *Manager) resolvPath(id string) string { return m.dir("resolv", id+".conf") }

// Start sets the network up and re-adopts the attached sandboxes whose ids
// live holds: the bridge (created with the gateway address when missing),
// the resolver, and both nftables tables rebuilt in one transaction with
// the live sandboxes' rules and the addresses DNS answers had opened for
// them (so a berthd restart keeps their connectivity). Everything of
// sandboxes not in live — records, namespaces, leases, rules — is removed.
func (m *Manager) Start(ctx context.Context, live map[string]bool) error {
	for _, d := range []string{"netns", "sandboxes", "resolv", "ipam"} {
		if err := os.MkdirAll(m.dir(d), 0o700); err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	if err := m.ensureBridge(); err != nil {
		return fmt.Errorf("%w: bridge %s: %v", ErrUnavailable, m.cfg.Bridge, err)
	}
	res, err := startResolver(m, m.log)
	if err != nil {
		return fmt.Errorf("%w: resolver: %v", ErrUnavailable, err)
	}
	m.res = res
	m.rules.dnsUDP, m.rules.dnsTCP = res.udpPort, res.tcpPort

	records, err := m.readRecords()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var keep, orphans []*attachment
	for _, a := range records {
		if live[a.ID] && a.Addr.IsValid() {
			keep = append(keep, a)
		} else {
			orphans = append(orphans, a)
		}
	}
	var preserved []setElement
	if tableExists(ctx, m.rules.table) {
		elems, err := readElements(ctx, m.rules.table)
		if err != nil {
			m.log.Warn("network: cannot read the addresses DNS answers opened; sandboxes re-resolve", slog.Any("error", err))
		}
		for _, e := range elems {
			if live[e.ID] && recordsHold(keep, e.ID) {
				preserved = append(preserved, e)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := nft(ctx, m.rules.define(keep, preserved)); err != nil {
		return fmt.Errorf("%w: nftables: %v", ErrUnavailable, err)
	}
	now := time.Now()
	for _, a := range keep {
		m.attached[a.ID], m.byAddr[a.Addr] = a, a
	}
	for _, e := range preserved {
		m.opened[elementKey{e.ID, e.Addr, e.Port}] = now.Add(e.Timeout)
	}
	for _, a := range orphans {
		m.log.Info("network: removing the network of a sandbox that is gone", slog.String("sandbox_id", a.ID), slog.String("addr", a.Addr.String()))
		m.release(ctx, a.ID)
	}
	m.removeStrays(ctx, live)
	if len(keep) > 0 {
		m.log.Info("network: re-adopted sandboxes", slog.Int("count", len(keep)), slog.Int("dns_addresses", len(preserved)))
	}
	if fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(fwd)) != "1" {
		m.log.Warn("network: net.ipv4.ip_forward is 0: EGRESS sandboxes reach only networks whose interfaces forward IPv4 "+
			"(berth turns forwarding on for its bridge only); set net.ipv4.ip_forward=1 for the rest", slog.String("bridge", m.cfg.Bridge))
	}
	return nil
}

func recordsHold(as []*attachment, id string) bool {
	for _, a := range as {
		if a.ID == id {
			return true
		}
	}
	return false
}

// ensureBridge creates the bridge when missing, gives it the gateway
// address, turns IPv4 forwarding on for it alone and IPv6 off, and brings
// it up. An existing link of the name that is not a bridge is an error.
func (m *Manager) ensureBridge() error {
	link, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.cfg.Bridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		if link, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return err
		}
	}
	if _, ok := link.(*netlink.Bridge); !ok {
		return fmt.Errorf("%s exists and is a %s, not a bridge", m.cfg.Bridge, link.Type())
	}
	addr := &netlink.Addr{IPNet: netipNet(netip.PrefixFrom(m.gateway, m.cfg.Subnet.Bits()))}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s: %w", addr.IPNet, err)
	}
	for path, value := range map[string]string{
		"/proc/sys/net/ipv4/conf/" + m.cfg.Bridge + "/forwarding":   "1",
		"/proc/sys/net/ipv6/conf/" + m.cfg.Bridge + "/disable_ipv6": "1",
	} {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return netlink.LinkSetUp(link)
}

// Attach gives sandbox id its network: a pinned namespace with eth0 on the
// bridge and lo up, its rules, its resolv.conf. On failure nothing of it
// is left. Errors wrap ErrUnavailable when the network is not started.
func (m *Manager) Attach(ctx context.Context, id string, p Policy) (att Attachment, retErr error) {
	if m.res == nil {
		return Attachment{}, fmt.Errorf("%w: the network is not started", ErrUnavailable)
	}
	// Leftovers of an earlier sandbox of the id (a crash mid-attach).
	m.mu.Lock()
	m.release(ctx, id)
	m.mu.Unlock()
	defer func() {
		if retErr != nil {
			m.mu.Lock()
			m.release(context.WithoutCancel(ctx), id)
			m.mu.Unlock()
		}
	}()
	ns := m.netnsPath(id)
	if err := createNetNS(ns); err != nil {
		return Attachment{}, err
	}
	var opts []gocni.NamespaceOpts
	if p.EgressBytesPerSecond > 0 || p.IngressBytesPerSecond > 0 {
		opts = append(opts, gocni.WithCapabilityBandWidth(bandwidth(p)))
	}
	result, err := m.cni.Setup(ctx, id, ns, opts...)
	if err != nil {
		return Attachment{}, fmt.Errorf("CNI setup of %s: %w", id, err)
	}
	a := &attachment{ID: id, Allow: p.Entries(), MaxConnections: p.MaxConnections,
		EgressRate: p.EgressBytesPerSecond, IngressRate: p.IngressBytesPerSecond, Policy: p}
	if cfg := result.Interfaces["eth0"]; cfg != nil && len(cfg.IPConfigs) > 0 {
		a.Addr, _ = netip.AddrFromSlice(cfg.IPConfigs[0].IP.To4())
	}
	// The bridge plugin lists the bridge, the host's veth, the sandbox's
	// eth0; the bandwidth plugin may add its ifb device after them.
	for _, raw := range result.Raw() {
		for _, in := range raw.Interfaces {
			if in.Sandbox == "" && in.Name != m.cfg.Bridge && a.Veth == "" {
				a.Veth = in.Name
			}
		}
	}
	if !a.Addr.IsValid() || a.Veth == "" {
		return Attachment{}, fmt.Errorf("CNI setup of %s returned no address or host interface", id)
	}
	resolv := fmt.Sprintf("# berth: the sandbox's resolver answers only allow-listed names\nnameserver %s\noptions ndots:1 timeout:2 attempts:2\n", m.gateway)
	if err := os.WriteFile(m.resolvPath(id), []byte(resolv), 0o644); err != nil {
		return Attachment{}, err
	}
	if err := writeRecord(m.recordPath(id), a); err != nil {
		return Attachment{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := nft(ctx, m.rules.attach(a)); err != nil {
		return Attachment{}, fmt.Errorf("rules of %s: %w", id, err)
	}
	m.attached[id], m.byAddr[a.Addr] = a, a
	return Attachment{NetNS: ns, ResolvConf: m.resolvPath(id), Addr: a.Addr}, nil
}

// Detach removes sandbox id's network: rules, interfaces, lease,
// namespace and files. A sandbox without one (mode NONE) costs a stat.
func (m *Manager) Detach(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.release(ctx, id)
}

// release is Detach under m.mu; it goes on past failures and returns the
// first.
func (m *Manager) release(ctx context.Context, id string) error {
	a := m.attached[id]
	if a == nil {
		a, _ = readRecord(m.recordPath(id))
	}
	_, nsErr := os.Stat(m.netnsPath(id))
	if a == nil && errors.Is(nsErr, fs.ErrNotExist) {
		return nil
	}
	var first error
	note := func(err error) {
		if err != nil {
			m.log.Error("network: detach", slog.String("sandbox_id", id), slog.Any("error", err))
			if first == nil {
				first = err
			}
		}
	}
	if a != nil && m.attached[id] != nil {
		if err := nft(ctx, m.rules.detach(a)); err != nil {
			// Something of it was missing: rebuild without it.
			m.log.Warn("network: removing rules one by one failed; rebuilding the tables", slog.String("sandbox_id", id), slog.Any("error", err))
			delete(m.attached, id)
			note(m.rebuild(ctx))
		}
		delete(m.attached, id)
		delete(m.byAddr, a.Addr)
		for k := range m.opened {
			if k.id == id {
				delete(m.opened, k)
			}
		}
	}
	netnsArg := m.netnsPath(id)
	if nsErr != nil {
		netnsArg = "" // gone: the plugins release the lease only
	}
	note(m.cni.Remove(ctx, id, netnsArg))
	note(removeNetNS(m.netnsPath(id)))
	for _, f := range []string{m.resolvPath(id), m.recordPath(id)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			note(err)
		}
	}
	return first
}

// rebuild rewrites both tables from m.attached and m.opened, under m.mu.
func (m *Manager) rebuild(ctx context.Context) error {
	as := make([]*attachment, 0, len(m.attached))
	for _, a := range m.attached {
		as = append(as, a)
	}
	now := time.Now()
	var elems []setElement
	for k, exp := range m.opened {
		if left := exp.Sub(now); left >= time.Second && m.attached[k.id] != nil {
			elems = append(elems, setElement{ID: k.id, Addr: k.addr, Port: k.port, Timeout: left})
		}
	}
	return nft(ctx, m.rules.define(as, elems))
}

// removeStrays removes namespaces and leases that no adopted record names
// (a berthd that died mid-attach or mid-detach).
func (m *Manager) removeStrays(ctx context.Context, live map[string]bool) {
	entries, _ := os.ReadDir(m.dir("netns"))
	for _, e := range entries {
		// Without a record its rules cannot be rebuilt: a sandbox
		// using it (a crash between pinning and recording) has no working
		// network either way.
		if id := e.Name(); m.attached[id] == nil {
			m.log.Info("network: removing a stray network namespace", slog.String("sandbox_id", id), slog.Bool("sandbox_alive", live[id]))
			m.release(ctx, id)
		}
	}
	leases, _ := os.ReadDir(m.dir("ipam", "berth-"+m.cfg.Bridge))
	for _, l := range leases {
		if _, err := netip.ParseAddr(l.Name()); err != nil {
			continue // host-local's lock and last_reserved_ip files
		}
		b, err := os.ReadFile(m.dir("ipam", "berth-"+m.cfg.Bridge, l.Name()))
		if err != nil {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		id = strings.TrimSpace(id)
		if m.attached[id] == nil {
			m.log.Info("network: releasing a stray address lease", slog.String("sandbox_id", id), slog.String("addr", l.Name()))
			if err := m.cni.Remove(ctx, id, ""); err != nil {
				m.log.Error("network: release lease", slog.String("sandbox_id", id), slog.Any("error", err))
			}
		}
	}
}

// Addr returns the address of sandbox id, if attached.
func (m *Manager) Addr(id string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.attached[id]; a != nil {
		return a.Addr, true
	}
	return netip.Addr{}, false
}

// Close stops the resolver. Sandboxes keep their network and rules for the
// next berthd to adopt.
func (m *Manager) Close() {
	if m.res != nil {
		m.res.close()
	}
}

// Remove tears the whole network down: every sandbox's network, both
// tables, the bridge and the state directory. For tests and uninstalling;
// sandboxes still running lose their network.
func (m *Manager) Remove(ctx context.Context) error {
	m.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	records, _ := m.readRecords()
	ids := map[string]bool{}
	for _, a := range records {
		ids[a.ID] = true
	}
	for id := range m.attached {
		ids[id] = true
	}
	entries, _ := os.ReadDir(m.dir("netns"))
	for _, e := range entries {
		ids[e.Name()] = true
	}
	for id := range ids {
		if err := m.release(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeTables(ctx, m.rules.table); err != nil {
		errs = append(errs, err)
	}
	if link, err := netlink.LinkByName(m.cfg.Bridge); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w", m.cfg.Bridge, err))
		}
	}
	if err := os.RemoveAll(m.cfg.StateDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func writeRecord(path string, a *attachment) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readRecord(path string) (*attachment, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var a attachment
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("record %s: %w", path, err)
	}
	for _, e := range a.Allow {
		r, err := ParseRule(e)
		if err != nil {
			return nil, fmt.Errorf("record %s: %w", path, err)
		}
		a.Policy.Allow = append(a.Policy.Allow, r)
	}
	a.Policy.MaxConnections = a.MaxConnections
	a.Policy.EgressBytesPerSecond, a.Policy.IngressBytesPerSecond = a.EgressRate, a.IngressRate
	return &a, nil
}

func (m *Manager) readRecords() ([]*attachment, error) {
	entries, err := os.ReadDir(m.dir("sandboxes"))
	if err != nil {
		return nil, err
	}
	var out []*attachment
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		a, err := readRecord(m.dir("sandboxes", e.Name()))
		if err != nil {
			m.log.Error("network: unreadable record; its sandbox is treated as gone", slog.Any("error", err))
			id := strings.TrimSuffix(e.Name(), ".json")
			a = &attachment{ID: id}
		}
		out = append(out, a)
	}
	return out, nil
}

// hostNameservers returns the nameservers of a resolv.conf as host:53.
func hostNameservers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
