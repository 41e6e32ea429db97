package filesvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rangeread"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// descriptors takes a descriptor that the agent of a runc sandbox opened
// for a read (*runtime.Runtime: pidfd_getfd(2) on the agent process, once
// proven the sandbox's). It fails, and berthd reads through the agent,
// when it cannot (a gVisor sandbox, whose descriptors are its sentry's; a
// process not proven the sandbox's; a kernel or policy without pidfd_getfd).
type descriptors interface {
	// TakesFDs reports whether TakeFD may work at all for the sandbox
	// (false under gVisor): the agent is asked for its descriptor only
	// then.
	TakesFDs(ctx context.Context, sandboxID string, pid uint32) bool
	TakeFD(ctx context.Context, sandboxID string, pid uint32, fd int32) (int, error)
}

// maxDirectReads bounds the reads berthd serves from descriptors taken
// from agents at once, and so the descriptors it holds for them: past it a
// read goes through its agent.
const maxDirectReads = 256

// directChunkBytes is the size of the chunks berthd reads from a taken
// descriptor: 1 MiB, a whole number of pages, so that the caller's writes
// of a copy begin and end on page boundaries of its file (with the
// agent's 1 MiB-16 chunks, chosen for grpc-go's buffer tiers, every write
// split a page: 13% more system time for a 1 GiB write to btrfs). The
// buffer comes from wire's own pool, whose 1 MiB class holds it exactly.
const directChunkBytes = 1 << 20

// diskFS reports whether f_type (statfs(2)) is a file system whose reads
// are served by this host's kernel from its page cache and disks: btrfs,
// ext2/3/4, xfs, overlayfs, tmpfs. Only such files are read from a taken
// descriptor: a FUSE file's read waits for a process the sandbox may run,
// a network file system's for a server, a pseudo file's size is not its
// length; those go through the agent as before.
func diskFS(fsType int64) bool {
	switch fsType {
	case unix.BTRFS_SUPER_MAGIC, unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.OVERLAYFS_SUPER_MAGIC, unix.TMPFS_MAGIC:
		return true
	}
	return false
}

// checkTaken checks a descriptor taken from an agent before berthd reads
// from it, and returns its fstat(2). The descriptor comes from the
// sandbox and is untrusted: it must be a regular file (a FIFO, socket or
// device could block a read or yield anything), of a disk file system
// (diskFS), open read-only as the agent opens it (not write-only, O_PATH
// or O_DIRECT, whose pread(2) fails: berthd would have sent the header
// and then an error the agent's own read would not give), the file the
// agent named (dev, ino of its fstat) and in the state the header
// described (size, modification time): otherwise berthd does not read it
// and the read goes through the agent.
func checkTaken(fd int, open *agentv1.OpenFile, info *berthv1.FileInfo) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return st, fmt.Errorf("not a regular file (mode %#o)", st.Mode)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return st, fmt.Errorf("fstatfs: %w", err)
	}
	if !diskFS(sfs.Type) {
		return st, fmt.Errorf("on a file system of type %#x, not a local disk's", sfs.Type)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return st, fmt.Errorf("fcntl F_GETFL: %w", err)
	}
	if flags&unix.O_ACCMODE != unix.O_RDONLY || flags&(unix.O_PATH|unix.O_DIRECT) != 0 {
		return st, fmt.Errorf("not open read-only as the agent opens a file (flags %#o)", flags)
	}
	if st.Dev != open.GetDev() || st.Ino != open.GetIno() {
		return st, fmt.Errorf("file %d:%d, not %d:%d the agent named", st.Dev, st.Ino, open.GetDev(), open.GetIno())
	}
	mtime := info.GetModifiedAt()
	if uint64(st.Size) != info.GetSizeBytes() || st.Mtim.Sec != mtime.GetSeconds() || st.Mtim.Nsec != int64(mtime.GetNanos()) {
		return st, errors.New("changed since the agent opened it")
	}
	return st, nil
}

// checkRange checks that the header's range is the one the request asks
// of a file of size bytes (from offset_bytes, at most limit_bytes, 0 to
// the end): berthd reads what the caller asked, not what the agent says.
func checkRange(header *berthv1.ReadFileHeader, req *agentv1.ReadFileRequest, size uint64) error {
	var length uint64
	if req.GetOffsetBytes() < size {
		length = size - req.GetOffsetBytes()
	}
	if limit := req.GetLimitBytes(); limit > 0 && limit < length {
		length = limit
	}
	if header.GetOffsetBytes() != req.GetOffsetBytes() || header.GetLengthBytes() != length {
		return fmt.Errorf("the header's range %d+%d is not the %d+%d asked of a file of %d bytes",
			header.GetOffsetBytes(), header.GetLengthBytes(), req.GetOffsetBytes(), length, size)
	}
	return nil
}

// readDirect serves a ReadFile of a runc sandbox's file from a descriptor
// the agent opened, with every check of its own (the path resolved in the
// sandbox's root as the workload user, the agent's directory refused),
// and hands berthd: the agent's pread(2)s, its socket writes and berthd's
// reads of them are saved. It reports false, having sent the caller
// nothing, when the read must go through the agent instead (the agent
// answered with chunks before any, or berthd could not take or would not
// read the descriptor); otherwise it did the read, with the result it
// returns. What the agent refuses (a missing file, permissions, a
// directory) comes back as its status, as before.
func (f *Service) readDirect(ctx context.Context, files agentv1.FileServiceClient, sandboxID string, pid uint32, areq *agentv1.ReadFileRequest, dest int, down grpc.ServerStream) (bool, error) {
	agentCtx, cancel := context.WithCancel(ctx)
	// Ends the agent's stream: the agent closes its copy of the descriptor.
	defer cancel()
	req := &agentv1.ReadFileRequest{Path: areq.GetPath(), OffsetBytes: areq.GetOffsetBytes(), LimitBytes: areq.GetLimitBytes(), HandFd: true}
	up, err := files.ReadFile(agentCtx, req, wire.CallOption())
	if err != nil {
		return true, f.fail(ctx, sandboxID, err)
	}
	var fr wire.Frame
	defer fr.Free()
	var header *berthv1.ReadFileHeader
	// sendHeader sends the header held back, before anything else.
	sendHeader := func() error {
		if header == nil {
			return nil
		}
		h := header
		header = nil
		return down.SendMsg(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: h}})
	}
	for {
		if err := up.RecvMsg(&fr); err != nil {
			if sendErr := sendHeader(); sendErr != nil {
				return true, f.fail(ctx, sandboxID, sendErr)
			}
			if errors.Is(err, io.EOF) {
				return true, nil
			}
			return true, f.fail(ctx, sandboxID, err)
		}
		if n, ok := fr.Chunk(readChunk); ok {
			// The agent reads itself (a pseudo file, an agent that does
			// not hand descriptors): relayed as before.
			err := sendHeader()
			if err == nil {
				f.moved("out")(n)
				err = down.SendMsg(&fr)
			}
			if err == nil {
				err = relayDown(up, down, readChunk, f.moved("out"), readPart)
			}
			if err != nil {
				return true, f.fail(ctx, sandboxID, err)
			}
			return true, nil
		}
		var msg agentv1.ReadFileResponse
		if err := fr.Decode(&msg); err != nil {
			return true, f.fail(ctx, sandboxID, err)
		}
		switch part := msg.GetPart().(type) {
		case *agentv1.ReadFileResponse_Header:
			if header != nil {
				return false, nil // a second header: not what an agent sends
			}
			header = part.Header
		case *agentv1.ReadFileResponse_OpenFile:
			if header == nil {
				return false, nil
			}
			return f.sendTaken(ctx, sandboxID, pid, part.OpenFile, header, req, dest, down, cancel)
		default:
			return false, nil
		}
	}
}

// sendTaken takes the descriptor open names from the agent, checks it
// (checkTaken) and the header's range against the request's, ends the
// agent's stream, and sends the header and the range from it. It reports
// false, having sent nothing, when the descriptor cannot be taken or
// fails a check.
func (f *Service) sendTaken(ctx context.Context, sandboxID string, pid uint32, open *agentv1.OpenFile, header *berthv1.ReadFileHeader, req *agentv1.ReadFileRequest, dest int, down grpc.ServerStream, endAgent func()) (bool, error) {
	fd, err := f.direct.fds.TakeFD(ctx, sandboxID, pid, open.GetFd())
	if err != nil {
		f.direct.log.Debug("ReadFile goes through the agent: berthd could not take its descriptor", "sandbox_id", sandboxID, "err", err)
		return false, nil
	}
	defer unix.Close(fd)
	endAgent()
	first, err := checkTaken(fd, open, header.GetInfo())
	if err == nil {
		err = checkRange(header, req, uint64(first.Size))
	}
	if err != nil {
		f.direct.log.Debug("ReadFile goes through the agent: berthd refused the descriptor it took", "sandbox_id", sandboxID, "err", err)
		return false, nil
	}
	f.obs.FileReadDirect()
	header.WrittenToDestination = dest >= 0
	if err := down.SendMsg(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: header}}); err != nil {
		return true, f.fail(ctx, sandboxID, err)
	}
	path := string(header.GetInfo().GetPath())
	if dest >= 0 {
		r := rangeread.Range{FD: fd, Path: path, First: &first, Offset: req.GetOffsetBytes(), Length: header.GetLengthBytes(), ToEnd: req.GetLimitBytes() == 0}
		if err := f.copyRange(ctx, sandboxID, dest, r); err != nil {
			return true, f.fail(ctx, sandboxID, err)
		}
		return true, nil
	}
	if err := sendRange(ctx, down, fd, &first, path, req.GetOffsetBytes(), header.GetLengthBytes(), req.GetLimitBytes() == 0, f.moved("out")); err != nil {
		return true, f.fail(ctx, sandboxID, err)
	}
	return true, nil
}

// sendRange sends length bytes of the regular file open at fd from offset
// to down as the agent does (rangeread.Send), with the agent's statuses:
// ABORTED FILE_CHANGED when the file yields fewer bytes, more (toEnd:
// reading to the end), or another size or modification time than first
// after the last chunk, FAILED_PRECONDITION FILE_REFUSED for a failing
// read. It stops when ctx ends. moved counts the bytes sent.
func sendRange(ctx context.Context, down grpc.ServerStream, fd int, first *unix.Stat_t, path string, offset, length uint64, toEnd bool, moved func(int)) error {
	r := rangeread.Range{FD: fd, Path: path, First: first, Offset: offset, Length: length, ToEnd: toEnd}
	return rangeError(rangeread.Send(ctx, func(fr *wire.Frame) error { return down.SendMsg(fr) }, readChunk, directChunkBytes, r, moved))
}

// rangeError is the agent's status for an error of reading a range:
// ABORTED FILE_CHANGED, FAILED_PRECONDITION FILE_REFUSED; any other as
// it is.
func rangeError(err error) error {
	var changedErr *tartree.ChangedError
	var pathErr *fs.PathError
	switch {
	case errors.As(err, &changedErr):
		return changed(changedErr)
	case errors.As(err, &pathErr):
		return readFailed(pathErr)
	}
	return err
}

// changed is the agent's ABORTED FILE_CHANGED for err.
func changed(err *tartree.ChangedError) error {
	return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonFileChanged, err.Error(), map[string]string{"path": tartree.Display(err.Path)})
}

// readFailed is the agent's answer to a failing pread(2) or fstat(2) of a
// regular file: FAILED_PRECONDITION FILE_REFUSED naming the errno (EIO
// above all; the agent maps a few rarer ones otherwise, see
// agent/files/errors.go).
func readFailed(err *fs.PathError) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err
	}
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonFileRefused, tartree.Display(err.Error()),
		map[string]string{"path": tartree.Display(err.Path), "errno": unix.ErrnoName(errno)})
}
