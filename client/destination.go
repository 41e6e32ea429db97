package client

import (
	"context"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/berth-sandbox/berth/internal/fdpass"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// fdCreds are the client's transport credentials on a unix socket:
// grpc-go's local credentials, with each connection wrapped to send
// descriptors beside its bytes (fdpass.Conn) and remembered as the one
// ReadFile sends its destination on.
type fdCreds struct {
	credentials.TransportCredentials
	conns *fdConns
}

func (c fdCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := raw.(*net.UnixConn)
	if !ok {
		return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	}
	fc := fdpass.NewConn(uc)
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, fc)
	if err != nil {
		return nil, nil, err
	}
	c.conns.set(fc)
	return conn, info, nil
}

func (c fdCreds) Clone() credentials.TransportCredentials {
	return fdCreds{TransportCredentials: c.TransportCredentials.Clone(), conns: c.conns}
}

// fdConns is the connection a Client's unix socket calls go on (a
// grpc.ClientConn of one address has one at a time: the newest), and the
// destinations of the ReadFiles under way.
type fdConns struct {
	mu      sync.Mutex
	current *fdpass.Conn
	// busy holds the (dev, ino) of each destination under way: berthd
	// takes a descriptor by them, so a second ReadFile into the same file
	// while one is under way is streamed, never given the other's
	// descriptor (and its file offset).
	busy map[[2]uint64]bool
}

// connected reports whether a handshake made a connection yet.
func (f *fdConns) connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current != nil
}

// awaitConnection waits until the client's connection is ready, or
// failing, or ctx ends.
func (c *Client) awaitConnection(ctx context.Context) {
	for {
		s := c.conn.GetState()
		switch s {
		case connectivity.Ready, connectivity.TransientFailure, connectivity.Shutdown:
			return
		case connectivity.Idle:
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (f *fdConns) set(c *fdpass.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.current = c
}

// destination sends w's descriptor on the current connection for a
// ReadFile to name, when w is a file berthd may write into (a regular
// file open for writing without O_APPEND) and the client is connected
// over a unix socket. It returns the request's destination and a
// function to call once the ReadFile ended, or nil when the read is to
// be streamed.
func (f *fdConns) destination(w any) (*berthv1.ReadFileDestination, func()) {
	file, ok := w.(*os.File)
	if f == nil || !ok {
		return nil, nil
	}
	f.mu.Lock()
	conn := f.current
	f.mu.Unlock()
	if conn == nil {
		return nil, nil
	}
	rc, err := file.SyscallConn()
	if err != nil {
		return nil, nil
	}
	var (
		key  [2]uint64
		sent bool
	)
	ctlErr := rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return
		}
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil || flags&unix.O_ACCMODE == unix.O_RDONLY || flags&unix.O_APPEND != 0 {
			return
		}
		key = [2]uint64{st.Dev, st.Ino}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.busy[key] {
			return
		}
		if conn.Send(int(fd)) != nil {
			return
		}
		if f.busy == nil {
			f.busy = map[[2]uint64]bool{}
		}
		f.busy[key] = true
		sent = true
	})
	if ctlErr != nil || !sent {
		return nil, nil
	}
	return &berthv1.ReadFileDestination{Dev: key[0], Ino: key[1]}, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.busy, key)
	}
}
