package filesvc

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// describe returns what an honest agent says of the file open at fd: its
// OpenFile and the header's FileInfo.
func describe(t *testing.T, fd int) (*agentv1.OpenFile, *berthv1.FileInfo) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return &agentv1.OpenFile{Fd: int32(fd), Dev: st.Dev, Ino: st.Ino},
		&berthv1.FileInfo{SizeBytes: uint64(st.Size), ModifiedAt: &timestamppb.Timestamp{Seconds: st.Mtim.Sec, Nanos: int32(st.Mtim.Nsec)}}
}

func openFD(t *testing.T, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// hostileFiles makes, in a temporary directory on a file system berthd
// reads directly, a 10-byte regular file (its descriptor good) and opens
// what an agent could hand instead of it: a FIFO (whose read would wait
// for a writer), a socket, a directory, a device, a procfs file, another
// regular file of the same bytes, an empty file, and the good file itself
// opened so that pread(2) fails (write-only, O_PATH, O_DIRECT).
func hostileFiles(t *testing.T) (good int, hostile map[string]int) {
	t.Helper()
	dir := t.TempDir()
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if !diskFS(sfs.Type) {
		t.Fatalf("the test's temporary directory %s is on file system type %#x, not one berthd reads directly", dir, sfs.Type)
	}
	for name, data := range map[string]string{"f": "0123456789", "g": "0123456789", "empty": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pair[0]); unix.Close(pair[1]) })
	return openFD(t, filepath.Join(dir, "f"), unix.O_RDONLY), map[string]int{
		"fifo":       openFD(t, filepath.Join(dir, "fifo"), unix.O_RDONLY|unix.O_NONBLOCK),
		"socket":     pair[0],
		"directory":  openFD(t, dir, unix.O_RDONLY|unix.O_DIRECTORY),
		"device":     openFD(t, "/dev/zero", unix.O_RDONLY),
		"procfs":     openFD(t, "/proc/self/status", unix.O_RDONLY),
		"other file": openFD(t, filepath.Join(dir, "g"), unix.O_RDONLY),
		"empty file": openFD(t, filepath.Join(dir, "empty"), unix.O_RDONLY),
		"write-only": openFD(t, filepath.Join(dir, "f"), unix.O_WRONLY),
		"O_PATH":     openFD(t, filepath.Join(dir, "f"), unix.O_PATH),
		"O_DIRECT":   openFD(t, filepath.Join(dir, "f"), unix.O_RDONLY|unix.O_DIRECT),
	}
}

// TestCheckTakenRefuses: berthd reads a descriptor taken from an agent
// only when it is the regular file of a disk file system the agent named,
// as the header described it, open for reading as the agent opens it. A
// FIFO (whose read would wait for a writer), a socket, a directory, a
// device, a pseudo file, a file other than the one named, the named file
// open so that a read fails, and a file that changed since are refused,
// and the read goes through the agent.
func TestCheckTakenRefuses(t *testing.T) {
	good, hostile := hostileFiles(t)
	open, info := describe(t, good)
	if _, err := checkTaken(good, open, info); err != nil {
		t.Fatalf("checkTaken of the regular file the agent named: %v", err)
	}
	for name, fd := range hostile {
		// Each described by the agent as what it is, or (a regular
		// file) as the good one: a reused number.
		o, in := describe(t, fd)
		if name == "other file" || name == "empty file" {
			o, in = open, info
		}
		if _, err := checkTaken(fd, o, in); err == nil {
			t.Errorf("checkTaken accepted a %s", name)
		}
	}
	// The file changed since the header: its size, its time.
	bigger := &berthv1.FileInfo{SizeBytes: info.GetSizeBytes() + 1, ModifiedAt: info.GetModifiedAt()}
	later := &berthv1.FileInfo{SizeBytes: info.GetSizeBytes(), ModifiedAt: &timestamppb.Timestamp{Seconds: info.GetModifiedAt().GetSeconds() + 1}}
	for _, in := range []*berthv1.FileInfo{bigger, later} {
		if _, err := checkTaken(good, open, in); err == nil || !strings.Contains(err.Error(), "changed") {
			t.Errorf("checkTaken of a file that changed since the header (%v) = %v, want refused", in, err)
		}
	}
}

// chunkSink is a ReadFile stream that keeps what is sent.
type chunkSink struct {
	grpc.ServerStream
	ctx    context.Context
	data   bytes.Buffer
	chunks int
	sizes  []int // of each chunk
}

func (s *chunkSink) Context() context.Context { return s.ctx }

func (s *chunkSink) SendMsg(m any) error {
	fr, ok := m.(*wire.Frame)
	if !ok {
		return status.Errorf(codes.Internal, "sent %T, want chunk frames", m)
	}
	if _, ok := fr.Chunk(readChunk); !ok {
		return status.Error(codes.Internal, "sent a frame that is not a chunk")
	}
	var buf []byte
	d := fr.Data(&buf)
	s.data.Write(d)
	s.chunks++
	s.sizes = append(s.sizes, len(d))
	return nil
}

// pageBytes is the page size of the hosts berth runs on (x86-64, arm64
// with 4 KiB pages).
const pageBytes = 4096

// TestSendRange reads ranges of a regular file from its descriptor as
// the agent would: exact bytes at chunk boundaries and for an offset and
// length, chunks of whole pages, and ABORTED FILE_CHANGED for a
// descriptor without the data its size promised (a file truncated, an
// empty file), a file that grew while read to its end, and one whose
// size changed.
func TestSendRange(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 2*directChunkBytes+3)
	for i := range data {
		data[i] = byte(i*7 + i/251)
	}
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fd := openFD(t, path, unix.O_RDONLY)
	var first unix.Stat_t
	if err := unix.Fstat(fd, &first); err != nil {
		t.Fatal(err)
	}
	n := uint64(len(data))
	for _, r := range []struct{ offset, length uint64 }{
		{0, 0}, {0, 1}, {0, directChunkBytes - 1}, {0, directChunkBytes}, {0, directChunkBytes + 1}, {0, n},
		{5, 100}, {directChunkBytes, directChunkBytes + 3}, {n - 1, 1},
	} {
		sink := &chunkSink{ctx: context.Background()}
		var moved int
		if err := sendRange(sink.ctx, sink, fd, &first, path, r.offset, r.length, r.offset+r.length == n, func(k int) { moved += k }); err != nil {
			t.Fatalf("sendRange(%d, %d): %v", r.offset, r.length, err)
		}
		want := data[r.offset : r.offset+r.length]
		if !bytes.Equal(sink.data.Bytes(), want) || moved != len(want) {
			t.Errorf("sendRange(%d, %d) = %d bytes (counted %d), equal %v; want %d", r.offset, r.length, sink.data.Len(), moved, bytes.Equal(sink.data.Bytes(), want), len(want))
		}
		if wantChunks := (len(want) + directChunkBytes - 1) / directChunkBytes; sink.chunks != wantChunks {
			t.Errorf("sendRange(%d, %d) sent %d chunks, want %d", r.offset, r.length, sink.chunks, wantChunks)
		}
	}

	// The caller writes the chunks one after the other from its offset 0:
	// each but the last a whole number of pages, so that no write of a
	// 1 GiB copy starts or ends inside a page of its destination (btrfs
	// paid 13% more system time for 1 MiB-16 writes than for 1 MiB ones).
	sink := &chunkSink{ctx: context.Background()}
	if err := sendRange(sink.ctx, sink, fd, &first, path, 5, n-5, true, func(int) {}); err != nil {
		t.Fatal(err)
	}
	for i, size := range sink.sizes[:len(sink.sizes)-1] {
		if size%pageBytes != 0 {
			t.Errorf("chunk %d of %d is %d bytes, want a multiple of %d", i, len(sink.sizes), size, pageBytes)
		}
	}

	wantChanged := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.Aborted || rpcstatus.Reason(err) != rpcstatus.ReasonFileChanged || !strings.Contains(status.Convert(err).Message(), path) {
			t.Errorf("%s: %v, want ABORTED FILE_CHANGED naming %s", what, err, path)
		}
	}
	sink = &chunkSink{ctx: context.Background()}
	// Grown while read to its end.
	if err := os.WriteFile(path, append(data, 'x'), 0o600); err != nil {
		t.Fatal(err)
	}
	wantChanged("a file that grew", sendRange(sink.ctx, sink, fd, &first, path, 0, n, true, func(int) {}))
	// Grown: a range read sees the size change.
	wantChanged("a range of a file whose size changed", sendRange(sink.ctx, sink, fd, &first, path, 0, 10, false, func(int) {}))
	// No data where the size promised some: truncated, or empty.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	wantChanged("a truncated file", sendRange(sink.ctx, sink, fd, &first, path, 0, n, true, func(int) {}))

	// The call's end stops the read.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sink = &chunkSink{ctx: ctx}
	if err := sendRange(ctx, sink, fd, &first, path, 0, n, true, func(int) {}); err != context.Canceled || sink.chunks != 0 {
		t.Errorf("sendRange after the call ended = %v after %d chunks, want context.Canceled before any", err, sink.chunks)
	}
}

// fakeAgent is an agent's FileService whose ReadFile answers with msgs,
// then io.EOF; it records the request.
type fakeAgent struct {
	agentv1.FileServiceClient
	msgs []*agentv1.ReadFileResponse
	req  *agentv1.ReadFileRequest
}

func (a *fakeAgent) ReadFile(ctx context.Context, req *agentv1.ReadFileRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.ReadFileResponse], error) {
	a.req = req
	return &fakeStream{ctx: ctx, msgs: a.msgs}, nil
}

type fakeStream struct {
	grpc.ClientStream
	ctx  context.Context
	msgs []*agentv1.ReadFileResponse
}

func (s *fakeStream) Recv() (*agentv1.ReadFileResponse, error) { panic("RecvMsg only") }

func (s *fakeStream) RecvMsg(m any) error {
	if len(s.msgs) == 0 {
		return io.EOF
	}
	b, err := proto.Marshal(s.msgs[0])
	if err != nil {
		return err
	}
	s.msgs = s.msgs[1:]
	*m.(*wire.Frame) = *wire.FrameOf(b)
	return nil
}

// fakeFDs hands out a duplicate of fd as the agent's descriptor and
// remembers the number it gave.
type fakeFDs struct {
	fd    int
	taken int
}

func (d *fakeFDs) TakesFDs(context.Context, string, uint32) bool { return true }

func (d *fakeFDs) TakeFD(context.Context, string, uint32, int32) (int, error) {
	n, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	d.taken = n
	return n, err
}

type countingObserver struct{ direct int }

func (*countingObserver) FileBytes(string, int) {}
func (o *countingObserver) FileReadDirect()     { o.direct++ }

// recordingSink is a ReadFile stream that keeps the header and the bytes.
type recordingSink struct {
	chunkSink
	header *berthv1.ReadFileHeader
}

func (s *recordingSink) SendMsg(m any) error {
	if msg, ok := m.(*berthv1.ReadFileResponse); ok {
		s.header = msg.GetHeader()
		return nil
	}
	return s.chunkSink.SendMsg(m)
}

// TestReadDirectHostileDescriptors: whatever descriptor an agent hands
// berthd, berthd reads only a regular file of a disk file system that is
// the one the header described; for a FIFO, a socket, a directory, a
// device, a procfs file, another file, a file without the data (empty
// where the header said 10 bytes) or the file itself open write-only,
// O_PATH or O_DIRECT (a pread(2) would fail) it sends the caller nothing, closes
// what it took and reports that the read must go through the agent.
func TestReadDirectHostileDescriptors(t *testing.T) {
	good, hostile := hostileFiles(t)
	open, info := describe(t, good)
	info.Path = []byte("/workspace/f")
	header := &berthv1.ReadFileHeader{Info: info, LengthBytes: 10}
	agentSays := []*agentv1.ReadFileResponse{
		{Part: &agentv1.ReadFileResponse_Header{Header: header}},
		{Part: &agentv1.ReadFileResponse_OpenFile{OpenFile: open}},
	}
	read := func(fd int) (bool, error, *recordingSink, *fakeFDs, *countingObserver) {
		fds := &fakeFDs{fd: fd}
		obs := &countingObserver{}
		f := New(nil, nil, obs, WithDirectReads(fds, slog.New(slog.NewTextHandler(io.Discard, nil))))
		agent := &fakeAgent{msgs: agentSays}
		sink := &recordingSink{chunkSink: chunkSink{ctx: context.Background()}}
		done, err := f.readDirect(context.Background(), agent, "sb", 1, &agentv1.ReadFileRequest{Path: []byte("/workspace/f")}, -1, sink)
		if !agent.req.GetHandFd() {
			t.Errorf("berthd did not ask the agent for its descriptor")
		}
		return done, err, sink, fds, obs
	}

	done, err, sink, fds, obs := read(good)
	if !done || err != nil || sink.data.String() != "0123456789" || sink.header.GetLengthBytes() != 10 || obs.direct != 1 {
		t.Errorf("readDirect of the regular file = %v, %v, header %v, %q, direct %d; want the file, counted", done, err, sink.header, sink.data.String(), obs.direct)
	}
	if _, err := unix.FcntlInt(uintptr(fds.taken), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("the descriptor taken is still open after the read (%v)", err)
	}
	for name, fd := range hostile {
		done, err, sink, fds, obs := read(fd)
		if done || err != nil || sink.header != nil || sink.chunks != 0 || obs.direct != 0 {
			t.Errorf("readDirect of a %s = %v, %v, sent header %v and %d chunks; want nothing sent, through the agent", name, done, err, sink.header, sink.chunks)
		}
		if _, err := unix.FcntlInt(uintptr(fds.taken), unix.F_GETFD, 0); err != unix.EBADF {
			t.Errorf("the %s taken is still open after it was refused (%v)", name, err)
		}
	}
}

// TestCheckRange: berthd reads the range the caller asked of the file as
// it found it, whatever range the agent's header claims.
func TestCheckRange(t *testing.T) {
	for _, tt := range []struct {
		offset, limit, size uint64
		hOffset, hLength    uint64
		ok                  bool
	}{
		{0, 0, 10, 0, 10, true},
		{3, 0, 10, 3, 7, true},
		{3, 4, 10, 3, 4, true},
		{12, 0, 10, 12, 0, true},
		{0, 0, 10, 0, 1 << 40, false}, // more than the file holds
		{0, 5, 10, 0, 10, false},      // more than the caller asked
		{0, 0, 10, 2, 8, false},       // another offset
		{3, 0, 10, 3, 10, false},
	} {
		h := &berthv1.ReadFileHeader{OffsetBytes: tt.hOffset, LengthBytes: tt.hLength}
		req := &agentv1.ReadFileRequest{OffsetBytes: tt.offset, LimitBytes: tt.limit}
		if err := checkRange(h, req, tt.size); (err == nil) != tt.ok {
			t.Errorf("checkRange(header %d+%d, asked %d limit %d of %d bytes) = %v, want ok %v", tt.hOffset, tt.hLength, tt.offset, tt.limit, tt.size, err, tt.ok)
		}
	}
}
