package files

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rangeread"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ReadFile streams a byte range of a regular file: a header from fstat(2)
// on the opened descriptor, then chunks of at most chunkBytes read with
// pread(2). It ends with a *changedError when the file yields fewer bytes
// than the header promised, more (when reading to the end), or a different
// size or modification time by fstat(2) after the last chunk. When berthd
// asks (hand_fd) it sends the descriptor instead of the chunks (handFD).
func (s *Service) ReadFile(req *agentv1.ReadFileRequest, stream agentv1.FileService_ReadFileServer) error {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return err
	}
	if err := s.agentOwn("path", path, true); err != nil {
		return err
	}
	var fd int
	err = s.asUser(func() error {
		// O_NONBLOCK: opening a FIFO must not hang; it is refused below.
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		return openError(path, err)
	})
	if err != nil {
		return s.toStatus(err)
	}
	defer unix.Close(fd)
	return s.toStatus(s.readFile(stream, fd, path, req.GetOffsetBytes(), req.GetLimitBytes(), req.GetHandFd()))
}

func (s *Service) readFile(stream agentv1.FileService_ReadFileServer, fd int, path string, offset, limit uint64, hand bool) error {
	var first unix.Stat_t
	if err := unix.Fstat(fd, &first); err != nil {
		return pathError("fstat", path, err)
	}
	switch first.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return pathError("read", path, unix.EISDIR)
	default:
		return &notRegularError{path, typeName(first.Mode)}
	}
	if pseudo, err := isPseudoFS(fd); err != nil {
		return pathError("fstatfs", path, err)
	} else if pseudo {
		return s.readPseudo(stream, fd, path, &first, offset, limit)
	}
	size := uint64(first.Size)
	var length uint64
	if offset < size {
		length = size - offset
	}
	if limit > 0 && limit < length {
		length = limit
	}
	if length > s.cfg.MaxReadBytes {
		return &tooLargeError{path: path, what: fmt.Sprintf("a read of %d bytes", length), limit: s.cfg.MaxReadBytes, reason: rpcstatus.ReasonFileTooLarge, flag: "max-read-bytes"}
	}
	header := &berthv1.ReadFileHeader{Info: fileInfo(path, &first, ""), OffsetBytes: offset, LengthBytes: length}
	if err := stream.Send(&agentv1.ReadFileResponse{Part: &agentv1.ReadFileResponse_Header{Header: header}}); err != nil {
		return err
	}
	if hand && length > 0 {
		return handFD(stream, fd, &first)
	}

	// Each chunk is read straight into the buffer gRPC sends it from.
	return rangeread.Send(stream.Context(), func(fr *wire.Frame) error { return stream.SendMsg(fr) }, readChunk, chunkBytes,
		rangeread.Range{FD: fd, Path: path, First: &first, Offset: offset, Length: length, ToEnd: limit == 0}, func(int) {})
}

// handTimeout is how long handFD keeps a descriptor open for berthd.
const handTimeout = 30 * time.Second

// handFD sends berthd the number of the descriptor open at fd, with the
// device and inode of the file (st, its fstat(2)), instead of the file's
// bytes, and keeps it open until berthd ends the stream (it has taken a
// copy of its own with pidfd_getfd(2) and reads the header's range from
// it, with the checks readFile makes) or handTimeout passes. The
// descriptor is the one opened as the workload user after every check of
// ReadFile; berthd checks what it took against dev and ino.
func handFD(stream agentv1.FileService_ReadFileServer, fd int, st *unix.Stat_t) error {
	open := &agentv1.OpenFile{Fd: int32(fd), Dev: st.Dev, Ino: st.Ino}
	if err := stream.Send(&agentv1.ReadFileResponse{Part: &agentv1.ReadFileResponse_OpenFile{OpenFile: open}}); err != nil {
		return err
	}
	timer := time.NewTimer(handTimeout)
	defer timer.Stop()
	select {
	case <-stream.Context().Done():
	case <-timer.C:
	}
	return nil
}

// pseudoReadBytes caps what ReadFile takes of a file of a pseudo file
// system, which it holds in memory: such files are generated text (a few
// KiB as a rule).
const pseudoReadBytes = 16 << 20

// isPseudoFS reports whether the file open at fd is on a file system whose
// files are generated when read, so that fstat(2) does not know their size
// (0 on procfs, 4096 on sysfs): procfs, sysfs, cgroup, debugfs, tracefs,
// securityfs (statfs(2) f_type).
func isPseudoFS(fd int) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return false, err
	}
	switch fs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC:
		return true, nil
	}
	return false, nil
}

// readPseudo reads the range of a pseudo file (see isPseudoFS) into memory
// first, at most pseudoReadBytes and the read cap, so that the header can
// say exactly how many bytes follow, then sends it. One read(2) sequence
// is one generation of the content: it is what the file said then.
func (s *Service) readPseudo(stream agentv1.FileService_ReadFileServer, fd int, path string, st *unix.Stat_t, offset, limit uint64) error {
	max := min(uint64(pseudoReadBytes), s.cfg.MaxReadBytes)
	if limit > 0 && limit < max {
		max = limit
	}
	var data []byte
	buf := make([]byte, chunkBytes)
	pos := offset
	// An offset past any file's size (pread(2) takes an off_t) reads
	// nothing, as for a regular file.
	for uint64(len(data)) <= max && pos <= math.MaxInt64 {
		want := min(uint64(len(buf)), max+1-uint64(len(data)))
		n, err := unix.Pread(fd, buf[:want], int64(pos))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pathError("read", path, err)
		}
		if n == 0 {
			break
		}
		data = append(data, buf[:n]...)
		pos += uint64(n)
	}
	if uint64(len(data)) > max {
		if limit > 0 && limit <= max {
			data = data[:limit]
		} else {
			return &tooLargeError{path: path, what: fmt.Sprintf("a read of more than %d bytes of a generated file (procfs, sysfs, ...: read whole, at most 16 MiB)", max), limit: max, reason: rpcstatus.ReasonFileTooLarge, flag: "max-read-bytes"}
		}
	}
	header := &berthv1.ReadFileHeader{Info: fileInfo(path, st, ""), OffsetBytes: offset, LengthBytes: uint64(len(data))}
	if err := stream.Send(&agentv1.ReadFileResponse{Part: &agentv1.ReadFileResponse_Header{Header: header}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), chunkBytes)
		if err := stream.Send(&agentv1.ReadFileResponse{Part: &agentv1.ReadFileResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}
