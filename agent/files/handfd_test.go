package files_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// handRead is a ReadFile with hand_fd: the header, then either the
// descriptor the agent hands (taken into this process with pidfd_getfd(2),
// as berthd does, while the stream is open) or the chunks.
type handRead struct {
	header *agentv1.ReadFileResponse
	open   *agentv1.OpenFile
	taken  int // -1 when none
	data   []byte
}

func (a *testAgent) handRead(t *testing.T, req *agentv1.ReadFileRequest) (*handRead, error) {
	t.Helper()
	req.HandFd = true
	stream, err := a.files.ReadFile(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	r := &handRead{taken: -1}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		switch {
		case msg.GetHeader() != nil:
			r.header = msg
		case msg.GetOpenFile() != nil:
			if r.header == nil || r.open != nil {
				t.Fatalf("open_file %v out of order (header %v)", msg, r.header)
			}
			r.open = msg.GetOpenFile()
			pidfd, err := unix.PidfdOpen(a.cmd.Process.Pid, 0)
			if err != nil {
				t.Fatal(err)
			}
			r.taken, err = unix.PidfdGetfd(pidfd, int(r.open.GetFd()), 0)
			unix.Close(pidfd)
			if err != nil {
				t.Fatalf("pidfd_getfd of the agent's descriptor %d: %v", r.open.GetFd(), err)
			}
			t.Cleanup(func() { unix.Close(r.taken) })
			// berthd ends the stream once it took the descriptor.
			return r, nil
		default:
			r.data = append(r.data, msg.GetChunk()...)
		}
	}
}

// TestReadFileHandsDescriptor: asked to (hand_fd), the agent sends the
// header and then the descriptor it opened, which is the file named by
// its dev and inode, read-only, holding the file's bytes; an empty range
// and a procfs file come as before (header, chunks), and what the agent
// refuses it refuses as before.
func TestReadFileHandsDescriptor(t *testing.T) {
	a := startAgent(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 100_000)
	path := filepath.Join(a.dir, "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte(path), OffsetBytes: 7, LimitBytes: 1000})
	if err != nil || r.open == nil {
		t.Fatalf("ReadFile with hand_fd = %+v, %v; want the header and the descriptor", r, err)
	}
	if h := r.header.GetHeader(); h.GetOffsetBytes() != 7 || h.GetLengthBytes() != 1000 || h.GetInfo().GetSizeBytes() != uint64(len(data)) {
		t.Errorf("header = %v, want offset 7, length 1000, size %d", h, len(data))
	}
	var st, want unix.Stat_t
	if err := unix.Fstat(r.taken, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	if st.Dev != want.Dev || st.Ino != want.Ino || r.open.GetDev() != want.Dev || r.open.GetIno() != want.Ino {
		t.Errorf("descriptor of %d:%d, named %d:%d; want the file %d:%d", st.Dev, st.Ino, r.open.GetDev(), r.open.GetIno(), want.Dev, want.Ino)
	}
	flags, err := unix.FcntlInt(uintptr(r.taken), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("descriptor flags %#x, %v; want read-only", flags, err)
	}
	buf := make([]byte, 1000)
	if n, err := unix.Pread(r.taken, buf, 7); err != nil || n != 1000 || !bytes.Equal(buf, data[7:1007]) {
		t.Errorf("pread of the descriptor = %d, %v; want the file's bytes 7..1007", n, err)
	}

	// Nothing to read: no descriptor.
	empty := filepath.Join(a.dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte(empty)}); err != nil || r.open != nil || r.header.GetHeader().GetLengthBytes() != 0 {
		t.Errorf("ReadFile with hand_fd of an empty file = %+v, %v; want the header alone", r, err)
	}
	// A generated file: its size is not its length; read by the agent.
	if r, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte("/proc/self/status")}); err != nil || r.open != nil || !bytes.Contains(r.data, []byte("Name:")) {
		t.Errorf("ReadFile with hand_fd of /proc/self/status = %+v, %v; want its chunks", r, err)
	}
	// Refused as without hand_fd.
	if _, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte(filepath.Join(a.dir, "missing"))}); status.Code(err) != codes.NotFound {
		t.Errorf("ReadFile with hand_fd of a missing file: %v, want NOT_FOUND", err)
	}
	if _, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte(a.dir)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ReadFile with hand_fd of a directory: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := a.handRead(t, &agentv1.ReadFileRequest{Path: []byte(filepath.Join(a.run, "a.sock"))}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ReadFile with hand_fd of the agent's socket: %v, want PERMISSION_DENIED", err)
	}
}
