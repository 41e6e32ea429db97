package files

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// defaultFileMode is the mode of a new file written without one.
const defaultFileMode = 0o644

// WriteFile stores the content of a stream: a header, then chunks. In
// REPLACE mode the content goes to a temporary file in the target's
// directory, created as the workload user, which is fsynced and renamed
// over the target; in APPEND mode to the target itself (O_APPEND), fsynced.
// With create_parents and missing parents, the temporary file is made in
// a staged copy of the missing directories beside the first of them
// (".<name>.berth-<random>.tmp"), which one rename(2) puts in place at the
// end: the new directories and the file appear together or not at all.
// The response is sent only then, with the content's SHA-256 when the
// header asked for it. On any failure the temporary file and
// the staged or created directories are removed.
func (s *Service) WriteFile(stream agentv1.FileService_WriteFileServer) error {
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return invalid("header", "the stream ended before the header")
		}
		return s.toStatus(err)
	}
	h := first.GetHeader()
	if h == nil {
		return invalid("header", "the first message must be the header")
	}
	w, err := s.newWrite(h)
	if err != nil {
		return err
	}
	if err := s.asUser(w.open); err != nil {
		w.abort()
		return s.toStatus(err)
	}
	resp, err := w.copy(stream)
	if err != nil {
		w.abort()
		return s.toStatus(err)
	}
	return stream.SendAndClose(resp)
}

// write is one WriteFile in progress.
type write struct {
	s       *Service
	path    string
	dir     string
	h       *agentv1.WriteFileHeader
	mode    uint32
	appends bool

	fd      int // -1 when not open
	tmp     string
	created []string // parent directories this write created (appending)
	// With create_parents and missing parents: the staged directories,
	// top first (staged[0] becomes top), and O_PATH descriptors of them.
	staged  []string
	top     string
	dirFDs  []int
	sum     hash.Hash // nil unless the header asked for the SHA-256
	written uint64
}

// newWrite validates a header.
func (s *Service) newWrite(h *agentv1.WriteFileHeader) (*write, error) {
	path, err := cleanPath("header.path", h.GetPath())
	if err != nil {
		return nil, err
	}
	if err := s.agentOwn("header.path", path, true); err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, invalid("header.path", `"/" is a directory`)
	}
	// An owner the sandbox's user namespace does not map cannot be given
	// (chown(2) fails EINVAL): refused before any byte moves.
	if h.Uid != nil && !readIDMap("uid_map").maps(int(h.GetUid())) {
		return nil, invalid("header.uid", fmt.Sprintf("%d is not mapped in the sandbox's user namespace (/proc/self/uid_map), so no file can be owned by it", h.GetUid()))
	}
	if h.Gid != nil && !readIDMap("gid_map").maps(int(h.GetGid())) {
		return nil, invalid("header.gid", fmt.Sprintf("%d is not mapped in the sandbox's user namespace (/proc/self/gid_map), so no file can be owned by it", h.GetGid()))
	}
	w := &write{s: s, path: path, dir: filepath.Dir(path), h: h, mode: defaultFileMode, fd: -1}
	if h.GetWantSha256() {
		w.sum = sha256.New()
	}
	if h.Mode != nil {
		if w.mode = h.GetMode(); w.mode > 0o7777 {
			return nil, invalid("header.mode", "must be at most 07777 (permission bits, setuid, setgid, sticky)")
		}
	}
	switch h.GetWriteMode() {
	case berthv1.WriteMode_WRITE_MODE_UNSPECIFIED, berthv1.WriteMode_WRITE_MODE_REPLACE:
	case berthv1.WriteMode_WRITE_MODE_APPEND:
		w.appends = true
	default:
		return nil, invalid("header.write_mode", fmt.Sprintf("unknown write mode %d", h.GetWriteMode()))
	}
	if h.SizeBytes != nil && h.GetSizeBytes() > s.cfg.MaxWriteBytes {
		return nil, s.toStatus(&tooLargeError{path: path, what: fmt.Sprintf("a write of %d bytes", h.GetSizeBytes()), limit: s.cfg.MaxWriteBytes, reason: rpcstatus.ReasonFileTooLarge, flag: "max-write-bytes"})
	}
	if d := s.cfg.DiskBytes; d > 0 && h.SizeBytes != nil && h.GetSizeBytes() > d {
		return nil, s.toStatus(&quotaError{path: path, what: fmt.Sprintf("a write of %d bytes", h.GetSizeBytes()), limit: d})
	}
	return w, nil
}

// open opens the file to write: the temporary file, in the target's
// directory or in staged parents, or the target when appending. It runs
// as the workload user.
func (w *write) open() error {
	if w.h.GetCreateParents() {
		ancestor, missing, err := missingParents(w.dir)
		switch {
		case err != nil:
			return err
		case len(missing) > 0 && w.appends:
			if w.created, err = mkdirAll(w.dir, defaultDirMode); err != nil {
				return err
			}
		case len(missing) > 0:
			return w.openStaged(ancestor, missing)
		}
	}
	if w.appends {
		return w.openAppend()
	}
	var st unix.Stat_t
	switch err := unix.Lstat(w.path, &st); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return pathError("write", w.path, unix.EISDIR)
	case err == nil && w.h.Mode == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		w.mode = st.Mode & 0o7777 // a replaced file keeps its mode
	case err != nil && !errors.Is(err, unix.ENOENT):
		return pathError("lstat", w.path, err)
	}
	for range 10 {
		name := filepath.Join(w.dir, tempName(filepath.Base(w.path)))
		fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			// Name the target: the temporary file is an implementation
			// detail (ENOENT: a missing parent; EACCES: the directory).
			return pathError("create", w.path, err)
		}
		w.fd, w.tmp = fd, name
		return w.chmod()
	}
	return pathError("create temporary file for", w.path, unix.EEXIST)
}

// missingParents returns the nearest existing ancestor of dir and the
// names of the missing directories below it down to dir, top first. A
// component that exists but is not a directory fails with ENOTDIR naming
// it, whichever component it is (as without create_parents and as
// MakeDir).
func missingParents(dir string) (string, []string, error) {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		err := unix.Stat(p, &st)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return p, missing, nil
		case err == nil:
			return "", nil, pathError("mkdir", p, unix.ENOTDIR)
		case errors.Is(err, unix.ENOTDIR) && p != "/":
			missing = nil // a component above is not a directory: find it
		case errors.Is(err, unix.ENOENT) && p != "/":
			missing = append([]string{filepath.Base(p)}, missing...)
		default:
			return "", nil, pathError("stat", p, err)
		}
	}
}

// openStaged makes the missing parents in a staging directory beside the
// first of them and the temporary file in it, under its final name.
func (w *write) openStaged(ancestor string, missing []string) error {
	w.top = filepath.Join(ancestor, missing[0])
	staging := filepath.Join(ancestor, tempName(missing[0]))
	for i, p := 0, staging; i < len(missing); i++ {
		if i > 0 {
			p = filepath.Join(p, missing[i])
		}
		if err := mkdir(p, defaultDirMode); err != nil {
			return pathError("create", w.path, errnoOr(err))
		}
		w.staged = append(w.staged, p)
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError("open", p, err)
		}
		w.dirFDs = append(w.dirFDs, fd)
	}
	name := filepath.Join(w.staged[len(w.staged)-1], filepath.Base(w.path))
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return pathError("create", w.path, err)
	}
	w.fd, w.tmp = fd, name
	return w.chmod()
}

// errnoOr returns the errno err carries, or err.
func errnoOr(err error) error {
	if errno, ok := errnoOf(err); ok {
		return errno
	}
	return err
}

// openAppend opens the target for appending, creating it with the mode
// when missing.
func (w *write) openAppend() error {
	flags := unix.O_WRONLY | unix.O_APPEND | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	fd, err := unix.Open(w.path, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
	created := err == nil
	if errors.Is(err, unix.EEXIST) {
		fd, err = unix.Open(w.path, flags, 0)
	}
	if err != nil {
		return openError(w.path, err)
	}
	w.fd = fd
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pathError("fstat", w.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return &notRegularError{w.path, typeName(st.Mode)}
	}
	if created {
		return w.chmod()
	}
	w.mode = st.Mode & 0o7777 // an existing file keeps its mode
	return nil
}

// chmod sets the new file's mode exactly (open(2) applies the umask).
func (w *write) chmod() error {
	return pathError("chmod", w.path, unix.Fchmod(w.fd, w.mode))
}

// chown gives the file and the directories created for it the requested
// owner, when the header asks for one other than the workload user. It runs
// with the agent's own identity (CAP_CHOWN).
func (w *write) chown() error {
	if w.h.Uid == nil && w.h.Gid == nil {
		return nil
	}
	uid, gid := int(w.s.cfg.UID), int(w.s.cfg.GID)
	if w.h.Uid != nil {
		uid = int(w.h.GetUid())
	}
	if w.h.Gid != nil {
		gid = int(w.h.GetGid())
	}
	if err := unix.Fchown(w.fd, uid, gid); err != nil {
		return pathError("chown", w.path, err)
	}
	// chown(2) clears setuid and setgid bits: set the mode again.
	if err := unix.Fchmod(w.fd, w.mode); err != nil {
		return pathError("chmod", w.path, err)
	}
	for _, d := range w.created {
		if err := unix.Lchown(d, uid, gid); err != nil {
			return pathError("chown", d, err)
		}
	}
	for i, fd := range w.dirFDs {
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return pathError("chown", w.staged[i], err)
		}
	}
	return nil
}

// copy receives the chunks, writes them, and commits the file.
func (w *write) copy(stream agentv1.FileService_WriteFileServer) (*agentv1.WriteFileResponse, error) {
	if err := w.chown(); err != nil {
		return nil, err
	}
	h, limit := w.h, w.s.cfg.MaxWriteBytes
	in := wire.Receiver{Field: writeChunk}
	defer in.Free()
	for {
		var msg agentv1.WriteFileRequest
		data, chunk, err := in.Recv(stream.RecvMsg, &msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if !chunk {
			if msg.GetHeader() != nil {
				return nil, invalid("header", "only chunks may follow the header")
			}
			data = msg.GetChunk()
		}
		next := w.written + uint64(len(data))
		if h.SizeBytes != nil && next > h.GetSizeBytes() {
			return nil, invalid("header.size_bytes", fmt.Sprintf("the stream carries more than the %d bytes declared", h.GetSizeBytes()))
		}
		if next > limit {
			return nil, &tooLargeError{path: w.path, what: fmt.Sprintf("a write of more than %d bytes", limit), limit: limit, reason: rpcstatus.ReasonFileTooLarge, flag: "max-write-bytes"}
		}
		if d := w.s.cfg.DiskBytes; d > 0 && next > d {
			return nil, &quotaError{path: w.path, what: fmt.Sprintf("a write of more than %d bytes", d), limit: d}
		}
		if err := writeAll(w.fd, data); err != nil {
			return nil, pathError("write", w.path, err)
		}
		if w.sum != nil {
			w.sum.Write(data)
		}
		w.written = next
	}
	if h.SizeBytes != nil && w.written != h.GetSizeBytes() {
		return nil, invalid("header.size_bytes", fmt.Sprintf("declared %d bytes but the stream carried %d", h.GetSizeBytes(), w.written))
	}
	if err := unix.Fsync(w.fd); err != nil {
		return nil, pathError("fsync", w.path, err)
	}
	if !w.appends {
		if err := w.commit(); err != nil {
			return nil, err
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err != nil {
		return nil, pathError("fstat", w.path, err)
	}
	unix.Close(w.fd)
	w.fd = -1
	resp := &berthv1.WriteFileResponse{WrittenBytes: w.written, Info: fileInfo(w.path, &st, "")}
	if w.sum != nil {
		resp.Sha256 = hex.EncodeToString(w.sum.Sum(nil))
	}
	return &agentv1.WriteFileResponse{Result: resp}, nil
}

// commit renames the temporary file over the target, or the staged
// parents into place, and syncs the directory that changed.
func (w *write) commit() error {
	if len(w.staged) == 0 {
		if err := w.s.asUser(func() error { return pathError("rename", w.path, unix.Rename(w.tmp, w.path)) }); err != nil {
			return err
		}
		w.tmp = ""
		return syncDir(w.dir, w.fd)
	}
	err := w.s.asUser(func() error {
		err := unix.Renameat2(unix.AT_FDCWD, w.staged[0], unix.AT_FDCWD, w.top, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EINVAL) {
			// The file system cannot refuse to replace: check, then rename.
			var st unix.Stat_t
			if err = unix.EEXIST; unix.Lstat(w.top, &st) != nil {
				err = unix.Rename(w.staged[0], w.top)
			}
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) {
			return pathError("rename", w.path, err)
		}
		// A parent was made meanwhile (a concurrent write): make what is
		// still missing and move just the file.
		created, err := mkdirAll(w.dir, defaultDirMode)
		if err != nil {
			return err
		}
		w.created = created
		return pathError("rename", w.path, unix.Rename(w.tmp, w.path))
	})
	if err != nil {
		return err
	}
	w.tmp = ""
	for _, fd := range w.dirFDs {
		unix.Close(fd)
	}
	w.dirFDs = nil
	if w.created != nil {
		w.removeStaged() // what is left of them
	}
	w.staged = nil // else they are the target's parents now
	return syncDir(filepath.Dir(w.top), w.fd)
}

// removeStaged removes the staged directories: as the workload user, and
// when that fails (they were given another owner) as the agent itself
// (os.RemoveAll, which follows no symlink, of a directory of random name
// this write made).
func (w *write) removeStaged() {
	if len(w.staged) == 0 {
		return
	}
	var err error
	_ = w.s.asUser(func() error {
		err = os.RemoveAll(w.staged[0])
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(w.staged[0])
	}
}

// abort undoes a failed write: it closes the file, removes the temporary
// file and the directories staged or created for it.
func (w *write) abort() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
	for _, fd := range w.dirFDs {
		unix.Close(fd)
	}
	w.dirFDs = nil
	_ = w.s.asUser(func() error {
		if w.tmp != "" && len(w.staged) == 0 {
			_ = unix.Unlink(w.tmp)
		}
		removeDirs(w.created)
		return nil
	})
	w.removeStaged()
	w.staged = nil
}

// writeAll writes all of data to fd.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// syncDir makes a rename in dir durable: fsync(2) of the directory. When
// the directory cannot be opened for reading (a write-only directory), it
// syncs the whole file system of fd instead (syncfs(2)).
func syncDir(dir string, fd int) error {
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("syncfs", dir, unix.Syncfs(fd))
	}
	defer unix.Close(d)
	return pathError("fsync", dir, unix.Fsync(d))
}

// tempName returns a name for a temporary file beside the file base:
// ".<base>.berth-<12 hex digits>.tmp", with base cut short so that the
// whole name stays within NAME_MAX (a name of 255 bytes is valid, its
// temporary file must be too).
func tempName(base string) string {
	const extra = len(".") + len(".berth-") + 12 + len(".tmp")
	if len(base) > nameMax-extra {
		base = base[:nameMax-extra]
	}
	return "." + base + ".berth-" + randomSuffix() + ".tmp"
}

// randomSuffix returns 12 random hex digits for temporary names.
func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
