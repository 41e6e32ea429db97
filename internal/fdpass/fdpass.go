// Package fdpass carries open file descriptors beside the bytes of a unix
// socket connection (SCM_RIGHTS, unix(7)), for ReadFile's copy into a
// caller's own file: the client's Conn attaches a descriptor queued with
// Send to its next write, the server's Conn keeps the descriptors its
// reads receive in a small bounded Queue, from which a handler takes the
// one a request names by (st_dev, st_ino).
//
// The descriptors travel in band, on the connection gRPC already uses, so
// a descriptor is always in the server's queue by the time the request
// sent after it is handled (the socket delivers the two in order), and a
// descriptor can only ever be taken by a request of the connection that
// carried it.
package fdpass

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxQueued is how many received descriptors a connection keeps that no
// request took: past it the oldest is closed. A client sends one per
// ReadFile it asks to copy, just before the request, so a few suffice.
const MaxQueued = 4

// oobBytes is the room each read leaves for ancillary data: MaxQueued
// descriptors in one SCM_RIGHTS message. More arrive truncated
// (MSG_CTRUNC): the kernel closes those that do not fit.
var oobBytes = unix.CmsgSpace(MaxQueued * 4)

// Queue holds the descriptors a connection received, oldest first, at
// most MaxQueued. Its methods are safe for concurrent use.
type Queue struct {
	mu     sync.Mutex
	fds    []int
	closed bool
	// truncated counts reads whose ancillary data did not fit
	// (MSG_CTRUNC).
	truncated int
}

// put adds fds, closing the oldest past MaxQueued, or all of them once
// the queue is closed.
func (q *Queue) put(fds []int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		closeAll(fds)
		return
	}
	q.fds = append(q.fds, fds...)
	if over := len(q.fds) - MaxQueued; over > 0 {
		closeAll(q.fds[:over])
		q.fds = append(q.fds[:0], q.fds[over:]...)
	}
}

// Take removes and returns the newest queued descriptor whose fstat(2)
// has dev and ino; the caller owns it (closes it). It reports false when
// none has.
func (q *Queue) Take(dev, ino uint64) (int, bool) {
	if q == nil {
		return -1, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := len(q.fds) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if unix.Fstat(q.fds[i], &st) != nil || st.Dev != dev || st.Ino != ino {
			continue
		}
		fd := q.fds[i]
		q.fds = append(q.fds[:i], q.fds[i+1:]...)
		return fd, true
	}
	return -1, false
}

// Len is the number of descriptors queued.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.fds)
}

// Truncated is the number of reads whose ancillary data the kernel
// truncated (MSG_CTRUNC): descriptors sent that never reached the queue.
func (q *Queue) Truncated() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.truncated
}

// close closes every queued descriptor and those that arrive later.
func (q *Queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	closeAll(q.fds)
	q.fds = nil
	q.closed = true
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Holder is a connection that receives descriptors: a Conn, or a wrapper
// of one that passes its Descriptors on.
type Holder interface {
	Descriptors() *Queue
}

// Conn is a unix socket connection that passes descriptors: its Read
// receives with recvmsg(2) (MSG_CMSG_CLOEXEC, as Go's net package sets)
// and queues the SCM_RIGHTS descriptors that arrive; its Write attaches
// the descriptors given to Send to its next sendmsg(2). Every other
// method is the socket's, SyscallConn included.
type Conn struct {
	*net.UnixConn
	queue Queue
	oob   []byte // Read's; Reads are not concurrent (net.Conn's readers are one goroutine)

	wmu     sync.Mutex
	pending []int // Send's duplicates, sent with the next Write
	wclosed bool  // Close ran: Send refuses
}

// NewConn wraps c.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{UnixConn: c, oob: make([]byte, oobBytes)}
}

// Descriptors returns the queue of descriptors c received.
func (c *Conn) Descriptors() *Queue { return &c.queue }

// Read reads bytes as net.Conn does, queuing any descriptors that came
// with them.
func (c *Conn) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := c.UnixConn.ReadMsgUnix(p, c.oob)
	if oobn > 0 {
		c.queue.put(rights(c.oob[:oobn]))
	}
	if flags&unix.MSG_CTRUNC != 0 {
		c.queue.mu.Lock()
		c.queue.truncated++
		c.queue.mu.Unlock()
	}
	// ReadMsgUnix, unlike Read, gives a failing recvmsg's -1 and the end
	// of the stream as 0 bytes without io.EOF.
	n = max(n, 0)
	if n == 0 && err == nil && len(p) > 0 {
		err = io.EOF
	}
	return n, err
}

// rights returns the descriptors of the SCM_RIGHTS messages in oob; any
// other control message is ignored.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// ErrTooManyPending refuses a Send while MaxQueued descriptors wait for a
// write.
var ErrTooManyPending = errors.New("fdpass: too many descriptors wait to be sent")

// Send queues a duplicate of fd to go with c's next Write (which gRPC
// makes for whatever it sends next on the connection: at the latest the
// bytes of a request made after Send returns). The caller keeps fd.
func (c *Conn) Send(fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fdpass: duplicate descriptor %d: %w", fd, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		unix.Close(dup)
		return net.ErrClosed
	}
	if len(c.pending) >= MaxQueued {
		unix.Close(dup)
		return ErrTooManyPending
	}
	c.pending = append(c.pending, dup)
	return nil
}

// Write writes p as net.Conn does; the descriptors Send queued go with
// its first bytes.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	fds := c.pending
	c.pending = nil
	c.wmu.Unlock()
	if len(fds) == 0 || len(p) == 0 {
		if len(fds) > 0 {
			c.wmu.Lock()
			c.pending = append(fds, c.pending...)
			c.wmu.Unlock()
		}
		return c.UnixConn.Write(p)
	}
	n, _, err := c.UnixConn.WriteMsgUnix(p, unix.UnixRights(fds...), nil)
	closeAll(fds)
	if err != nil || n == len(p) {
		return n, err
	}
	// A stream socket may take part of a sendmsg: the rest as a write.
	m, err := c.UnixConn.Write(p[n:])
	return n + m, err
}

// Close closes the socket and every descriptor received or waiting to be
// sent.
func (c *Conn) Close() error {
	err := c.UnixConn.Close()
	c.queue.close()
	c.wmu.Lock()
	closeAll(c.pending)
	c.pending = nil
	c.wclosed = true
	c.wmu.Unlock()
	return err
}

// Listener hands out its unix socket connections as Conns.
type Listener struct {
	*net.UnixListener
}

// Accept implements net.Listener.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.UnixListener.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return NewConn(c), nil
}
