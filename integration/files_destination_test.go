package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/fdpass"
	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// destFile creates a host file holding prefix, open read-write at its end.
func destFile(t *testing.T, prefix string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "dest"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	return f
}

// wantFileContent checks that the file at path holds want and that f's
// offset is at wantOffset.
func wantFileContent(t *testing.T, f *os.File, want []byte, wantOffset int64, what string) {
	t.Helper()
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: the destination holds %d bytes (equal %v), want %d", what, len(got), bytes.Equal(got, want), len(want))
	}
	if off, err := f.Seek(0, io.SeekCurrent); err != nil || off != wantOffset {
		t.Errorf("%s: the destination's offset = %d (%v), want %d", what, off, err, wantOffset)
	}
}

// TestReadFileDestination reads a runc sandbox's file into host files
// through client.ReadFile over berthd's unix socket: berthd writes into
// the caller's descriptor itself (header.written_to_destination), byte
// exact, after what the file already held and advancing its offset, for
// whole files and ranges; a destination berthd must not or cannot write
// into (read-only, O_APPEND, a pipe) goes the streamed way with the same
// bytes or the writer's own error.
func TestReadFileDestination(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c, direct := directServer(t)
	id := sb.GetId()
	const chunk = 1 << 20
	data := randomData(3*chunk + 5)
	size := uint64(len(data))
	path := "/workspace/d.bin"
	if _, err := c.WriteFile(fileCtx(t), id, path, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]uint64{{0, 0}, {0, 1}, {1, chunk}, {chunk - 1, 2*chunk + 3}, {size - 1, 10}, {17, 0}, {size, 0}, {size + 5, 0}} {
		f := destFile(t, "prefix")
		before := direct.n.Load()
		var progress uint64
		h, err := c.ReadFile(fileCtx(t), id, path, f, client.WithRange(r[0], r[1]), client.WithTransferProgress(func(n uint64) { progress = n }))
		off := min(r[0], size)
		end := size
		if r[1] > 0 {
			end = min(off+r[1], end)
		}
		if err != nil || h.GetLengthBytes() != end-off || h.GetOffsetBytes() != r[0] {
			t.Fatalf("ReadFile range %v into a file = header %v, %v; want %d bytes", r, h, err, end-off)
		}
		// An empty range is not read from a descriptor (the agent
		// answers it with its header alone).
		if wantCopied := end > off; h.GetWrittenToDestination() != wantCopied || (direct.n.Load() > before) != wantCopied {
			t.Errorf("ReadFile range %v: written_to_destination %v, direct reads %d -> %d; want %v", r, h.GetWrittenToDestination(), before, direct.n.Load(), wantCopied)
		}
		if end > off && progress != end-off {
			t.Errorf("ReadFile range %v: progress reported %d bytes, want %d", r, progress, end-off)
		}
		wantFileContent(t, f, append([]byte("prefix"), data[off:end]...), int64(6+end-off), "range")
	}

	// Twice into the same file, one after the other: the second goes
	// after the first, as two w.Write loops would.
	f := destFile(t, "")
	for range 2 {
		if h, err := c.ReadFile(fileCtx(t), id, path, f); err != nil || !h.GetWrittenToDestination() {
			t.Fatalf("ReadFile into a file = %v, %v", h, err)
		}
	}
	wantFileContent(t, f, append(append([]byte{}, data...), data...), int64(2*size), "twice")

	// Read-only: not sent; w.Write fails as it would for any writer.
	ro, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	h, err := c.ReadFile(fileCtx(t), id, path, ro)
	if !errors.Is(err, syscall.EBADF) || h.GetWrittenToDestination() {
		t.Errorf("ReadFile into a read-only file = header %v, %v; want the streamed path's EBADF from w.Write", h, err)
	}

	// O_APPEND: streamed, appended.
	app, err := os.OpenFile(f.Name(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if h, err := c.ReadFile(fileCtx(t), id, path, app, client.WithRange(0, 100)); err != nil || h.GetWrittenToDestination() {
		t.Errorf("ReadFile into an O_APPEND file = header %v, %v; want it streamed", h, err)
	}
	got, _ := os.ReadFile(f.Name())
	if want := append(append(append([]byte{}, data...), data...), data[:100]...); !bytes.Equal(got, want) {
		t.Errorf("ReadFile into an O_APPEND file: the file holds %d bytes, want %d", len(got), len(want))
	}

	// A pipe: streamed.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(pr)
		read <- b
	}()
	h, err = c.ReadFile(fileCtx(t), id, path, pw)
	pw.Close()
	if b := <-read; err != nil || h.GetWrittenToDestination() || !bytes.Equal(b, data) {
		t.Errorf("ReadFile into a pipe = %d bytes (equal %v), header %v, %v; want the file, streamed", len(b), bytes.Equal(b, data), h, err)
	}
}

// TestReadFileDestinationChanged appends to a sandbox's file while berthd
// writes it into a host file: the read ends ABORTED FILE_CHANGED, as the
// streamed read does, never OK with a copy of a file that changed.
func TestReadFileDestinationChanged(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c, _ := directServer(t)
	id := sb.GetId()
	path := "/workspace/big"
	if r := run(t, id, "dd", "if=/dev/urandom", "of="+path, "bs=1048576", "count=256"); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("dd: %s", r.GetStderr())
	}
	// The append must land while the copy runs: it starts once the
	// destination has its first bytes; a copy that finished first (a
	// very fast host) is tried again.
	for attempt := range 3 {
		f := destFile(t, "")
		type result struct {
			h   *berthv1.ReadFileHeader
			err error
		}
		done := make(chan result, 1)
		go func() {
			h, err := c.ReadFile(context.Background(), id, path, f)
			done <- result{h, err}
		}()
		deadline := time.Now().Add(time.Minute)
		for {
			st, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() > 0 || time.Now().After(deadline) {
				break
			}
			select {
			case res := <-done:
				t.Fatalf("ReadFile ended before the destination had a byte: %v, %v", res.h, res.err)
			case <-time.After(time.Millisecond):
			}
		}
		if r := run(t, id, "sh", "-c", "echo more >> "+path); r.GetResult().GetExitCode() != 0 {
			t.Fatalf("append: %s", r.GetStderr())
		}
		res := <-done
		if !res.h.GetWrittenToDestination() {
			t.Fatalf("ReadFile of 256 MiB into a file was not written by berthd: %v, %v", res.h, res.err)
		}
		var ce *client.Error
		if errors.As(res.err, &ce) && ce.Code == codes.Aborted && ce.Reason == client.ReasonFileChanged {
			return
		}
		if res.err != nil {
			t.Fatalf("ReadFile of a file appended to during the copy = %v, want ABORTED FILE_CHANGED", res.err)
		}
		t.Logf("attempt %d: the copy ended before the append", attempt)
		// The file grew: the next attempt copies from a fresh file.
		if r := run(t, id, "sh", "-c", "head -c 268435456 "+path+" > "+path+".new && mv "+path+".new "+path); r.GetResult().GetExitCode() != 0 {
			t.Fatalf("renew: %s", r.GetStderr())
		}
	}
	t.Fatal("3 copies of 256 MiB each ended before an append of the file that began after their first byte")
}

// TestReadFileDestinationConnections: berthd takes a destination only
// from the connection that sent its descriptor. A request naming a
// descriptor that another connection sent is streamed and the file is
// left alone; over TCP nothing is sent and the read is streamed.
func TestReadFileDestinationConnections(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	addr := startServer(t, server.Config{TaskRestartLimit: -1})
	id := sb.GetId()
	data := randomData(1<<20 + 7)
	path := "/workspace/c.bin"
	c := dialClient(t, addr)
	if _, err := c.WriteFile(fileCtx(t), id, path, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	// A new client's first call: the descriptor waits for the connection.
	first := destFile(t, "")
	if h, err := dialClient(t, addr).ReadFile(fileCtx(t), id, path, first); err != nil || !h.GetWrittenToDestination() {
		t.Errorf("a new client's first call, ReadFile into a file = header %v, %v; want it written by berthd", h, err)
	}
	wantFileContent(t, first, data, int64(len(data)), "first call")
	sockPath, _ := server.UnixPath(addr)
	// Two raw connections; a's socket passes descriptors.
	var a *fdpass.Conn
	dialA := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", sockPath)
		if err != nil {
			return nil, err
		}
		a = fdpass.NewConn(conn.(*net.UnixConn))
		return a, nil
	})
	connA, err := grpc.NewClient("passthrough:///berthd", append(wire.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()), dialA)...)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close()
	connB, err := grpc.NewClient(addr, append(wire.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close()
	// A first call makes a's connection.
	if _, err := berthv1.NewFileServiceClient(connA).Stat(fileCtx(t), &berthv1.StatRequest{SandboxId: id, Location: &berthv1.StatRequest_Path{Path: path}}); err != nil {
		t.Fatal(err)
	}
	f := destFile(t, "x")
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if err := a.Send(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	req := &berthv1.ReadFileRequest{SandboxId: id, Location: &berthv1.ReadFileRequest_Path{Path: path},
		Destination: &berthv1.ReadFileDestination{Dev: st.Dev, Ino: st.Ino}}
	// readRaw reads with req on conn and returns the header and the
	// bytes of the chunks.
	readRaw := func(conn *grpc.ClientConn) (*berthv1.ReadFileHeader, []byte) {
		t.Helper()
		stream, err := berthv1.NewFileServiceClient(conn).ReadFile(fileCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		var h *berthv1.ReadFileHeader
		var chunks []byte
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return h, chunks
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg.GetHeader() != nil {
				h = msg.GetHeader()
			}
			chunks = append(chunks, msg.GetChunk()...)
		}
	}
	// A call on a's connection carries the descriptor to berthd, which
	// queues it there. Connection b's request names it: streamed, the
	// file untouched.
	if _, err := berthv1.NewFileServiceClient(connA).Stat(fileCtx(t), &berthv1.StatRequest{SandboxId: id, Location: &berthv1.StatRequest_Path{Path: path}}); err != nil {
		t.Fatal(err)
	}
	h, chunks := readRaw(connB)
	if h.GetWrittenToDestination() || !bytes.Equal(chunks, data) {
		t.Errorf("ReadFile on another connection naming a's descriptor = header %v, %d bytes streamed; want the file streamed", h, len(chunks))
	}
	wantFileContent(t, f, []byte("x"), 1, "another connection")
	h, chunks = readRaw(connA)
	if !h.GetWrittenToDestination() || len(chunks) != 0 {
		t.Errorf("ReadFile on the connection that sent the descriptor = header %v, %d bytes streamed; want it written", h, len(chunks))
	}
	wantFileContent(t, f, append([]byte("x"), data...), int64(1+len(data)), "the sending connection")
	// Taken once: the same request again is streamed.
	if h, chunks = readRaw(connA); h.GetWrittenToDestination() || !bytes.Equal(chunks, data) {
		t.Errorf("a second ReadFile naming a taken descriptor = header %v, %d bytes streamed; want it streamed", h, len(chunks))
	}

	// Over TCP (TLS), the client sends nothing and the read is streamed.
	as := startAuthServer(t)
	trust, err := client.TLSConfigFromFiles(as.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tc := dialClient(t, as.tcpAddr, client.WithTLS(trust), client.WithToken(opsToken))
	tsb := createSandbox(t, tc, nil)
	if _, err := tc.WriteFile(fileCtx(t), tsb.GetId(), path, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	g := destFile(t, "tcp")
	if h, err := tc.ReadFile(fileCtx(t), tsb.GetId(), path, g); err != nil || h.GetWrittenToDestination() {
		t.Errorf("ReadFile over TCP into a file = header %v, %v; want it streamed", h, err)
	}
	wantFileContent(t, g, append([]byte("tcp"), data...), int64(3+len(data)), "TCP")
	if strings.HasPrefix(as.tcpAddr, "unix") {
		t.Fatalf("the auth server's TCP address is %s", as.tcpAddr)
	}
}

// TestReadFileDestinationFleet: a call that a node or a gateway forwards
// to the node holding the sandbox cannot carry the caller's descriptor
// (it stayed on the caller's connection to the first berthd): the holder
// finds none on its connection from the forwarder and streams, and the
// client writes the bytes itself. Through the holder's own unix socket
// the holder writes them.
func TestReadFileDestinationFleet(t *testing.T) {
	need(t)
	f := startFleet(t, []int{2, 2}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	holder := f.nodes[1]
	sb, err := f.ops.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fl-dest", Image: env.image, Labels: map[string]string{"node.berth.dev/id": holder.id}})
	if err != nil || sb.GetNodeId() != holder.id {
		t.Fatalf("create on %s = %v, %v", holder.id, sb, err)
	}
	data := randomData(2<<20 + 3)
	path := "/workspace/f.bin"
	if _, err := f.ops.WriteFile(ctx, sb.GetId(), path, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	f.startGateway(t)
	for _, entry := range []struct {
		name, sock  string
		wantWritten bool
	}{
		{"another node", f.nodes[0].sock, false},
		{"the gateway", filepath.Join(filepath.Dir(f.nodes[0].sock), "gw.sock"), false},
		{"the holder", holder.sock, true},
	} {
		// As ops, who created the sandbox (root on a node's socket is
		// a principal of its own).
		c := dialClient(t, "unix://"+entry.sock, client.WithToken(opsToken))
		dst := destFile(t, "p")
		h, err := c.ReadFile(ctx, sb.GetId(), path, dst)
		if err != nil || h.GetWrittenToDestination() != entry.wantWritten {
			t.Errorf("ReadFile through %s into a file = header %v, %v; want written_to_destination %v", entry.name, h, err, entry.wantWritten)
		}
		wantFileContent(t, dst, append([]byte("p"), data...), int64(1+len(data)), entry.name)
	}
	if t.Failed() {
		for _, line := range strings.Split(holder.proc.log.String(), "\n") {
			if strings.Contains(line, "ReadFile") {
				t.Log(line)
			}
		}
	}
}

// TestReadFileDestinationGVisor: berthd does not open a gVisor sandbox's
// files itself, so a ReadFile into a host file is streamed there, with
// the same bytes.
func TestReadFileDestinationGVisor(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	c, _ := directServer(t)
	data := randomData(1<<20 + 9)
	if _, err := c.WriteFile(fileCtx(t), sb.GetId(), "/workspace/g.bin", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	f := destFile(t, "g")
	h, err := c.ReadFile(fileCtx(t), sb.GetId(), "/workspace/g.bin", f, client.WithRange(1, 0))
	if err != nil || h.GetWrittenToDestination() {
		t.Errorf("ReadFile in gVisor into a file = header %v, %v; want it streamed", h, err)
	}
	wantFileContent(t, f, append([]byte("g"), data[1:]...), int64(len(data)), "gVisor")
}

// TestReadFileDestinationOtherPrincipal: a caller who does not own the
// sandbox gets NOT_FOUND with its descriptor sent as well as streamed,
// and berthd writes nothing into its file (the descriptor is taken off
// the connection before the sandbox is looked up, and only closed);
// the owner's own ReadFile into a file is still copied by berthd.
func TestReadFileDestinationOtherPrincipal(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	alice := dialClient(t, a.unixAddr, client.WithToken(aliceToken))
	bob := dialClient(t, a.unixAddr, client.WithToken(bobToken))
	ctx := fileCtx(t)
	sb, err := alice.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alice.DeleteSandbox(context.Background(), sb.GetId()) })
	data := randomData(64<<10 + 3)
	path := "/workspace/secret.bin"
	if _, err := alice.WriteFile(ctx, sb.GetId(), path, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // more than one: no descriptor left behind answers a later call
		f := destFile(t, "bob's ")
		if _, err := bob.ReadFile(ctx, sb.GetId(), path, f); !isClientReason(err, codes.NotFound, client.ReasonSandboxNotFound) {
			t.Errorf("bob's ReadFile %d of alice's sandbox into his file: %v, want NOT_FOUND SANDBOX_NOT_FOUND", i, err)
		}
		wantFileContent(t, f, []byte("bob's "), 6, "bob's file after his refused ReadFile")
	}
	own := destFile(t, "")
	if h, err := alice.ReadFile(ctx, sb.GetId(), path, own); err != nil || !h.GetWrittenToDestination() {
		t.Errorf("alice's ReadFile into her file = header %v, %v; want it written by berthd", h, err)
	}
	wantFileContent(t, own, data, int64(len(data)), "alice's file")
}
