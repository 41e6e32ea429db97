package agentconn

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// liveConn is berthd's end of one connection to an agent: it knows whether
// the connection ended and when the agent last sent anything on it. A
// connection joins one berthd to one agent process (the listener's
// accepted socket), so what an agent proved on it holds for as long as it
// stays open.
type liveConn struct {
	net.Conn
	ended    atomic.Bool
	lastRead atomic.Int64 // time.Now().UnixNano() of the last read that returned data
}

func newLiveConn(c net.Conn) *liveConn {
	l := &liveConn{Conn: c}
	l.lastRead.Store(time.Now().UnixNano())
	return l
}

func (c *liveConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	if err != nil {
		c.ended.Store(true)
	}
	return n, err
}

func (c *liveConn) Close() error {
	c.ended.Store(true)
	return c.Conn.Close()
}

// SyscallConn is the unix connection's (Unread's SIOCOUTQ).
func (c *liveConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// proof is an Info answer that proved the sandbox's secret (or had none to
// prove) and named bootID, on conn.
type proof struct {
	conn   *liveConn
	bootID string
}

// current returns the connection gRPC last dialed to socketPath, and how
// many connections to it were dialed so far.
func (p *Pool) current(socketPath string) (*liveConn, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, _ := p.sockets[socketPath].(*liveConn)
	return c, p.dials[socketPath]
}

// noteProof records that an Info call answered with bootID (and the proof
// of the secret, when the sandbox has one) on the connection it went over:
// the connection that was current (was, after dials dials) both before and
// after the call, or the first one, dialed during the call. gRPC keeps one
// connection per agent and dials another only once it ended. When the
// connection the call went over is not known so, nothing is recorded.
func (p *Pool) noteProof(socketPath string, was *liveConn, dials uint64, bootID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, _ := p.sockets[socketPath].(*liveConn)
	if c == nil || c.ended.Load() || (c != was && (was != nil || p.dials[socketPath] != dials+1)) {
		return
	}
	p.proven[socketPath] = proof{conn: c, bootID: bootID}
}

// Proven returns the boot id an agent proved (Info, see NewPool) on the
// connection to socketPath that is still open, when it sent berthd
// something on it within the last `within`: a request sent on it now goes
// to that agent process, which was working a moment ago. ok is false when
// the connection ended or was dialed anew since the proof, or when the
// agent has been silent longer.
func (p *Pool) Proven(socketPath string, within time.Duration) (bootID string, ok bool) {
	p.mu.Lock()
	pr, found := p.proven[socketPath]
	c, _ := p.sockets[socketPath].(*liveConn)
	p.mu.Unlock()
	if !found || c != pr.conn || c.ended.Load() || time.Since(time.Unix(0, c.lastRead.Load())) > within {
		return "", false
	}
	return pr.bootID, true
}
