package connlimit

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/fdpass"
)

// accepted serves l, sending each accepted connection on the channel.
func accepted(t *testing.T, l net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range ch {
			c.Close()
		}
	})
	return ch
}

func dialFrom(t *testing.T, addr net.Addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (a read ends) within
// a second.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	ne, timeout := err.(net.Error)
	return !(timeout && ne.Timeout())
}

func TestPerPeer(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan string, 8)
	lim := New(Limits{PerPeer: 2, OnRefuse: func(p string) { refused <- p }})
	conns := accepted(t, lim.Listener(raw))

	a1, a2 := dialFrom(t, raw.Addr(), "127.0.0.1"), dialFrom(t, raw.Addr(), "127.0.0.1")
	s1, s2 := <-conns, <-conns
	a3 := dialFrom(t, raw.Addr(), "127.0.0.1")
	if got := <-refused; got != "127.0.0.1" {
		t.Errorf("refused peer = %q, want 127.0.0.1", got)
	}
	if !closedByServer(a3) {
		t.Errorf("third connection of 127.0.0.1 is open, want closed past PerPeer 2")
	}
	if closedByServer(a1) || closedByServer(a2) {
		t.Errorf("first two connections of 127.0.0.1 closed, want open")
	}
	// Another peer is not counted with the first.
	dialFrom(t, raw.Addr(), "127.0.0.2")
	if s := <-conns; Peer(s) != "127.0.0.2" {
		t.Errorf("Peer of the connection from 127.0.0.2 = %q", Peer(s))
	}
	// A closed connection frees its peer's place.
	s1.Close()
	s1.Close() // released once
	if got := lim.Open("127.0.0.1"); got != 1 {
		t.Errorf("Open(127.0.0.1) after one close = %d, want 1", got)
	}
	b := dialFrom(t, raw.Addr(), "127.0.0.1")
	select {
	case <-conns:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection of 127.0.0.1 after a close was not accepted")
	}
	if closedByServer(b) {
		t.Error("connection after a close was closed, want open")
	}
	s2.Close()
}

func TestTotalWaits(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := New(Limits{Total: 2})
	conns := accepted(t, lim.Listener(raw))
	for i := range 3 {
		dialFrom(t, raw.Addr(), fmt.Sprintf("127.0.0.%d", i+1))
	}
	first := <-conns
	<-conns
	select {
	case c := <-conns:
		t.Fatalf("third connection (%s) accepted past Total 2", c.RemoteAddr())
	case <-time.After(300 * time.Millisecond):
	}
	first.Close()
	select {
	case <-conns:
	case <-time.After(5 * time.Second):
		t.Fatal("third connection not accepted after one closed")
	}
}

func TestUnixPeerCred(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	raw, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	conns := accepted(t, New(Limits{Total: 4, PerPeer: 4}).Listener(raw))
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-conns
	if got, want := Peer(s), fmt.Sprintf("uid:%d", os.Geteuid()); got != want {
		t.Errorf("Peer = %q, want %q", got, want)
	}
	// The counted connection passes on its socket, for SO_PEERCRED.
	if _, ok := s.(syscall.Conn); !ok {
		t.Fatalf("accepted connection %T is no syscall.Conn", s)
	}
	if _, err := s.(syscall.Conn).SyscallConn(); err != nil {
		t.Errorf("SyscallConn: %v", err)
	}
	go c.Write([]byte("x"))
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Errorf("read through the counted connection: %v", err)
	}
}

// TestDescriptorsPassedOn: a counted connection of a listener whose
// connections receive descriptors (fdpass) passes its queue on, so that
// ReadFile finds a caller's destination behind the limiter.
func TestDescriptorsPassedOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	raw, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	conns := accepted(t, New(Limits{Total: 4, PerPeer: 4}).Listener(fdpass.Listener{UnixListener: raw.(*net.UnixListener)}))
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-conns
	h, ok := s.(fdpass.Holder)
	if !ok || h.Descriptors() == nil {
		t.Fatalf("accepted connection %T passes on no descriptor queue", s)
	}
	f, err := os.CreateTemp(t.TempDir(), "dest")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte("x"), unix.UnixRights(int(f.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	fd, ok := h.Descriptors().Take(st.Dev, st.Ino)
	if !ok {
		t.Fatal("the descriptor sent is not in the counted connection's queue")
	}
	unix.Close(fd)
}
