package fdpass

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// pair returns two Conns over a real socketpair(2).
func pair(t *testing.T) (client, server *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return NewConn(c.(*net.UnixConn))
	}
	client, server = conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// tempFile returns an open file and its (dev, ino).
func tempFile(t *testing.T, name string) (*os.File, uint64, uint64) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, st.Dev, st.Ino
}

// exchange writes msg on client and reads it whole on server.
func exchange(t *testing.T, client, server *Conn, msg []byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := client.Write(msg)
		errc <- err
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes differing from the %d written", len(got), len(msg))
	}
}

func TestSendTake(t *testing.T) {
	client, server := pair(t)
	f, dev, ino := tempFile(t, "dest")
	if err := client.Send(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	// 4 MiB: more than the socket takes at once, so the sendmsg is
	// partial and the rest goes as a write.
	msg := bytes.Repeat([]byte("berth"), 4<<20/5)
	exchange(t, client, server, msg)
	q := server.Descriptors()
	if got := q.Len(); got != 1 {
		t.Fatalf("queued %d descriptors, want 1", got)
	}
	if _, ok := q.Take(dev, ino+1); ok {
		t.Fatal("Take of another inode found a descriptor")
	}
	fd, ok := q.Take(dev, ino)
	if !ok {
		t.Fatal("Take found no descriptor of the file sent")
	}
	defer unix.Close(fd)
	if fd == int(f.Fd()) {
		t.Fatalf("received descriptor %d is the sender's own", fd)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("received descriptor flags %#x (%v), want FD_CLOEXEC", flags, err)
	}
	// The same open file: a write through it moves the sender's offset.
	if _, err := unix.Write(fd, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 3 {
		t.Errorf("sender's offset after a write through the received descriptor = %d, want 3", off)
	}
	if got := q.Len(); got != 0 {
		t.Errorf("queued %d descriptors after Take, want 0", got)
	}
	// A write without Send carries none.
	exchange(t, client, server, []byte("more"))
	if got := q.Len(); got != 0 {
		t.Errorf("queued %d descriptors after a plain write, want 0", got)
	}
}

// pipeEnd returns a pipe's read end (non-blocking) and its write end.
func pipeEnd(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]) })
	return p[0], p[1]
}

// writersOpen reports whether a pipe's write end is still open anywhere:
// a read of the empty pipe then gives EAGAIN, not EOF.
func writersOpen(t *testing.T, r int) bool {
	t.Helper()
	var b [1]byte
	n, err := unix.Read(r, b[:])
	switch {
	case errors.Is(err, unix.EAGAIN):
		return true
	case err == nil && n == 0:
		return false
	}
	t.Fatalf("read of the pipe: %d, %v", n, err)
	return false
}

func TestQueueBound(t *testing.T) {
	client, server := pair(t)
	var reads []int
	for range MaxQueued + 2 {
		r, w := pipeEnd(t)
		if err := client.Send(w); err != nil {
			t.Fatal(err)
		}
		unix.Close(w)
		exchange(t, client, server, []byte("x"))
		reads = append(reads, r)
	}
	if got := server.Descriptors().Len(); got != MaxQueued {
		t.Fatalf("queued %d descriptors, want %d", got, MaxQueued)
	}
	for i, r := range reads {
		if got, want := writersOpen(t, r), i >= 2; got != want {
			t.Errorf("pipe %d: write end open = %v, want %v (the oldest closed past the bound)", i, got, want)
		}
	}
	server.Close()
	for i, r := range reads {
		if writersOpen(t, r) {
			t.Errorf("pipe %d: write end still open after the connection closed", i)
		}
	}
}

func TestPendingBoundAndClose(t *testing.T) {
	client, _ := pair(t)
	r, w := pipeEnd(t)
	defer unix.Close(w)
	for range MaxQueued {
		if err := client.Send(w); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.Send(w); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("Send past the bound = %v, want ErrTooManyPending", err)
	}
	unix.Close(w)
	if !writersOpen(t, r) {
		t.Fatal("pending duplicates closed before the connection")
	}
	client.Close()
	if writersOpen(t, r) {
		t.Error("pending duplicates still open after the connection closed")
	}
	if err := client.Send(r); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close = %v, want net.ErrClosed", err)
	}
}

func TestTruncated(t *testing.T) {
	client, server := pair(t)
	// One sendmsg of more descriptors than a read has room for.
	var fds, reads []int
	for range MaxQueued + 2 {
		r, w := pipeEnd(t)
		fds, reads = append(fds, w), append(reads, r)
	}
	raw, err := client.UnixConn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte("y"), unix.UnixRights(fds...), nil, 0)
		return true
	}); err != nil || serr != nil {
		t.Fatalf("sendmsg: %v %v", err, serr)
	}
	closeAll(fds)
	var b [1]byte
	if _, err := io.ReadFull(server, b[:]); err != nil {
		t.Fatal(err)
	}
	q := server.Descriptors()
	if got := q.Truncated(); got != 1 {
		t.Errorf("Truncated() = %d, want 1", got)
	}
	if got := q.Len(); got != MaxQueued {
		t.Errorf("queued %d descriptors, want the %d that fit", got, MaxQueued)
	}
	for i, r := range reads {
		if got, want := writersOpen(t, r), i < MaxQueued; got != want {
			t.Errorf("pipe %d: write end open = %v, want %v", i, got, want)
		}
	}
}

func TestReadEnd(t *testing.T) {
	client, server := pair(t)
	exchange(t, client, server, []byte("last"))
	client.Close()
	var b [8]byte
	if n, err := server.Read(b[:]); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("Read after the peer closed = %d, %v; want 0, io.EOF", n, err)
	}
	server.Close()
	if n, err := server.Read(b[:]); n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %d, %v; want 0, net.ErrClosed", n, err)
	}
}
