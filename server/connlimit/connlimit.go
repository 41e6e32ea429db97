// Package connlimit caps the connections a server holds before it has
// read a byte from them: in all, over every listener a Limiter wraps, and
// per peer (a TCP client's IP address, an IPv6 client's /64, a unix socket
// client's uid by SO_PEERCRED, unix(7)).
//
// The total cap works as golang.org/x/net/netutil.LimitListener does: past
// it, Accept waits for a connection to close and new connections wait in
// the kernel's backlog. It is not that listener because its connections
// hide the socket (syscall.Conn), which the unix socket's authentication
// reads SO_PEERCRED from; these connections pass it on.
//
// The per-peer cap closes a connection past it as soon as it is accepted,
// so that one peer cannot fill the total cap or the backlog for the others.
package connlimit

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/fdpass"
)

// Limits are a Limiter's caps; 0 is no cap.
type Limits struct {
	// Total is the most connections open at once over every listener of
	// the Limiter; past it Accept waits for one to close.
	Total int
	// PerPeer is the most connections one peer (see Peer) holds open at
	// once; one more is closed as soon as it is accepted.
	PerPeer int
	// OnRefuse, when not nil, is called with the peer of each connection
	// closed past PerPeer, from Accept's goroutine.
	OnRefuse func(peer string)
}

// Limiter holds the counts of the connections of the listeners it wraps.
type Limiter struct {
	limits Limits
	sem    chan struct{} // nil: no total cap
	mu     sync.Mutex
	open   map[string]int // by peer
}

// New returns a Limiter with limits.
func New(limits Limits) *Limiter {
	lim := &Limiter{limits: limits, open: map[string]int{}}
	if limits.Total > 0 {
		lim.sem = make(chan struct{}, limits.Total)
	}
	return lim
}

// Listener returns l with lim's caps; its connections count until closed.
func (lim *Limiter) Listener(l net.Listener) net.Listener {
	return &listener{Listener: l, lim: lim, done: make(chan struct{})}
}

// Open returns how many connections peer holds open.
func (lim *Limiter) Open(peer string) int {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	return lim.open[peer]
}

type listener struct {
	net.Listener
	lim       *Limiter
	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

func (l *listener) Accept() (net.Conn, error) {
	if l.lim.sem != nil {
		select {
		case l.lim.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			l.releaseTotal()
			return nil, err
		}
		peer := Peer(c)
		if !l.lim.take(peer) {
			c.Close()
			if l.lim.limits.OnRefuse != nil {
				l.lim.limits.OnRefuse(peer)
			}
			continue
		}
		return &conn{Conn: c, release: func() { l.lim.drop(peer); l.releaseTotal() }}, nil
	}
}

func (l *listener) releaseTotal() {
	if l.lim.sem != nil {
		<-l.lim.sem
	}
}

func (l *listener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// take counts a connection of peer, or reports false when peer holds
// PerPeer.
func (lim *Limiter) take(peer string) bool {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if lim.limits.PerPeer > 0 && lim.open[peer] >= lim.limits.PerPeer {
		return false
	}
	lim.open[peer]++
	return true
}

func (lim *Limiter) drop(peer string) {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if lim.open[peer]--; lim.open[peer] <= 0 {
		delete(lim.open, peer)
	}
}

// conn is a counted connection; it passes on its socket (syscall.Conn)
// for SO_PEERCRED.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

var errNoSocket = errors.New("connection exposes no socket")

// Descriptors passes on the descriptors the connection received
// (fdpass.Holder): nil when it receives none.
func (c *conn) Descriptors() *fdpass.Queue {
	if h, ok := c.Conn.(fdpass.Holder); ok {
		return h.Descriptors()
	}
	return nil
}

func (c *conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T: %w", c.Conn, errNoSocket)
	}
	return sc.SyscallConn()
}

// Peer names the peer of c as its caps count it: "uid:N" on a unix socket
// (the uid that connected, SO_PEERCRED), the IP address over TCP, the /64
// of an IPv6 address (one host commonly holds all of one), "unknown" when
// the socket does not tell.
func Peer(c net.Conn) string {
	if c.LocalAddr().Network() == "unix" {
		if sc, ok := c.(syscall.Conn); ok {
			if raw, err := sc.SyscallConn(); err == nil {
				var (
					cred *unix.Ucred
					cerr error
				)
				if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err == nil && cerr == nil {
					return fmt.Sprintf("uid:%d", cred.Uid)
				}
			}
		}
		return "unknown"
	}
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return "unknown"
	}
	addr := ap.Addr().Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}
