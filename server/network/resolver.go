package network

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// The resolver is what a sandbox's /etc/resolv.conf names: it listens on
// the gateway address (nftables redirects port 53 there to its ports) and
// answers a sandbox's query only for a name its allow-list names. For such
// a name it asks the upstream resolvers from the host, opens every IPv4
// address of the answer in the sandbox's nftables sets (for the entry's
// port, or all ports) with a timeout covering the answer's TTL, and only
// then answers, so the sandbox's connection finds the address open. A name
// outside the allow-list is REFUSED; AAAA queries get no addresses (IPv4
// only). Names never open protected ranges or the host: those rules come
// first.
const (
	// minOpen and maxTTL bound how long a DNS answer keeps an address
	// open: the answer's TTL, at least minOpen, and TTLs are cut to maxTTL
	// in answers, so a client never caches an address past its opening.
	minOpen = time.Minute
	maxTTL  = time.Hour
	// openGrace is added to every opening: a client that got the answer
	// near its end still connects.
	openGrace = time.Minute
	// upstreamTimeout bounds one upstream exchange.
	upstreamTimeout = 3 * time.Second
	// maxInFlight bounds the queries of one sandbox in progress at once;
	// more are answered SERVFAIL at once.
	maxInFlight = 16
)

type resolver struct {
	m                *Manager
	log              *slog.Logger
	udp, tcp         *dns.Server
	udpPort, tcpPort uint16
	wg               sync.WaitGroup

	mu       sync.Mutex
	inFlight map[netip.Addr]int
}

// startResolver listens on the gateway address (UDP and TCP, ports chosen
// by the kernel) and serves until close.
func startResolver(m *Manager, log *slog.Logger) (*resolver, error) {
	r := &resolver{m: m, log: log, inFlight: make(map[netip.Addr]int)}
	addr := netip.AddrPortFrom(m.gateway, 0).String()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return nil, err
	}
	r.udpPort = uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	r.tcpPort = uint16(l.Addr().(*net.TCPAddr).Port)
	handler := dns.HandlerFunc(r.serve)
	r.udp = &dns.Server{PacketConn: pc, Handler: handler}
	r.tcp = &dns.Server{Listener: l, Handler: handler, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	for _, s := range []*dns.Server{r.udp, r.tcp} {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := s.ActivateAndServe(); err != nil {
				log.Error("network: resolver stopped", slog.Any("error", err))
			}
		}()
	}
	return r, nil
}

func (r *resolver) close() {
	r.udp.Shutdown()
	r.tcp.Shutdown()
	r.wg.Wait()
}

// serve answers one query of a sandbox.
func (r *resolver) serve(w dns.ResponseWriter, req *dns.Msg) {
	resp := r.answer(w, req)
	if resp == nil {
		return
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

func (r *resolver) answer(w dns.ResponseWriter, req *dns.Msg) *dns.Msg {
	fail := func(rcode int) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		return m
	}
	src, ok := remoteAddr(w.RemoteAddr())
	if !ok {
		return fail(dns.RcodeRefused)
	}
	r.m.mu.Lock()
	a := r.m.byAddr[src]
	r.m.mu.Unlock()
	if a == nil || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		return fail(dns.RcodeRefused)
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	rules := a.Policy.NameRules(name)
	if len(rules) == 0 {
		r.log.Debug("network: name not in the allow-list", slog.String("sandbox_id", a.ID), slog.String("name", name))
		return fail(dns.RcodeRefused)
	}
	if q.Qtype == dns.TypeAAAA {
		m := new(dns.Msg)
		m.SetReply(req) // no addresses: sandboxes have IPv4 only
		return m
	}
	if !r.enter(src) {
		return fail(dns.RcodeServerFailure)
	}
	defer r.leave(src)
	up := new(dns.Msg)
	up.SetQuestion(dns.Fqdn(name), q.Qtype)
	up.RecursionDesired = true
	resp, err := r.exchange(up)
	if err != nil {
		r.log.Warn("network: upstream resolvers did not answer", slog.String("name", name), slog.Any("error", err))
		return fail(dns.RcodeServerFailure)
	}
	resp.Id = req.Id
	resp.Question = req.Question
	resp.Ns, resp.Extra = nil, nil
	var elems []setElement
	for _, rr := range resp.Answer {
		if rr.Header().Ttl > uint32(maxTTL/time.Second) {
			rr.Header().Ttl = uint32(maxTTL / time.Second)
		}
		arec, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(arec.A.To4())
		if !ok {
			continue
		}
		open := max(time.Duration(arec.Hdr.Ttl)*time.Second, minOpen) + openGrace
		for _, rl := range rules {
			elems = append(elems, setElement{ID: a.ID, Addr: addr, Port: rl.Port, Timeout: open})
		}
	}
	if len(elems) > 0 {
		if err := r.m.open(context.Background(), elems); err != nil {
			r.log.Error("network: open resolved addresses", slog.String("sandbox_id", a.ID), slog.String("name", name), slog.Any("error", err))
			return fail(dns.RcodeServerFailure)
		}
	}
	return resp
}

func remoteAddr(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		return ip, ok
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		return ip, ok
	}
	return netip.Addr{}, false
}

func (r *resolver) enter(src netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inFlight[src] >= maxInFlight {
		return false
	}
	r.inFlight[src]++
	return true
}

func (r *resolver) leave(src netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inFlight[src]--; r.inFlight[src] <= 0 {
		delete(r.inFlight, src)
	}
}

// exchange asks each upstream in turn, over UDP and again over TCP when
// the answer was truncated.
func (r *resolver) exchange(q *dns.Msg) (*dns.Msg, error) {
	var last error = fmt.Errorf("no upstream resolvers configured")
	for _, up := range r.m.cfg.DNSUpstreams {
		c := &dns.Client{Net: "udp", Timeout: upstreamTimeout}
		resp, _, err := c.Exchange(q, up)
		if err == nil && resp.Truncated {
			c.Net = "tcp"
			resp, _, err = c.Exchange(q, up)
		}
		if err == nil {
			return resp, nil
		}
		last = fmt.Errorf("%s: %w", up, err)
	}
	return nil, last
}

// open adds elems to their sandboxes' sets, or extends them: an element
// berth knows to be open until later than needed stays as it is; one open
// for less is deleted and added again in the same transaction (re-adding
// alone would not extend its timeout).
func (m *Manager) open(ctx context.Context, elems []setElement) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var script, addOnly strings.Builder
	var changed []setElement
	for _, e := range elems {
		if m.attached[e.ID] == nil {
			continue // detached meanwhile
		}
		k := elementKey{e.ID, e.Addr, e.Port}
		exp, known := m.opened[k]
		if known && exp.After(now.Add(e.Timeout/2)) {
			continue
		}
		if known && exp.After(now.Add(time.Second)) {
			script.WriteString(m.rules.deleteElement(e))
		}
		script.WriteString(m.rules.addElement(e))
		addOnly.WriteString(m.rules.addElement(e))
		changed = append(changed, e)
	}
	if len(changed) == 0 {
		return nil
	}
	if err := nft(ctx, script.String()); err != nil {
		// An element berth thought open had just expired: add only.
		if err := nft(ctx, addOnly.String()); err != nil {
			return err
		}
	}
	for _, e := range changed {
		m.opened[elementKey{e.ID, e.Addr, e.Port}] = now.Add(e.Timeout)
	}
	return nil
}
