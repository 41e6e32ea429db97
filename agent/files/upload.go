package files

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Upload extracts a tar stream into a directory, as the workload user,
// resolving every entry beneath the directory (see beneath). It answers
// after syncfs(2) of the directory's file system.
func (s *Service) Upload(stream agentv1.FileService_UploadServer) error {
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
	dir, err := cleanPath("header.path", h.GetPath())
	if err != nil {
		return err
	}
	switch h.GetCompression() {
	case berthv1.Compression_COMPRESSION_UNSPECIFIED, berthv1.Compression_COMPRESSION_NONE, berthv1.Compression_COMPRESSION_GZIP:
	default:
		return invalid("header.compression", fmt.Sprintf("unknown compression %d", h.GetCompression()))
	}
	in := &chunkReader{recv: func() ([]byte, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if msg.GetHeader() != nil {
			return nil, invalid("header", "only chunks may follow the header")
		}
		return msg.GetChunk(), nil
	}}
	x := &extraction{s: s, limit: s.cfg.MaxArchiveBytes}
	err = s.asUser(func() error {
		if _, err := mkdirAll(dir, defaultDirMode); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return pathError("extract into", dir, unix.ENOTDIR)
			}
			return err
		}
		b, err := openBeneath(dir)
		if err != nil {
			return err
		}
		defer b.close()
		x.b = b
		return x.run(in, h.GetCompression())
	})
	if err != nil {
		return s.toStatus(err)
	}
	// Take whatever follows the archive (tar pads to records), so that the
	// caller's sends all succeed.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return s.toStatus(err)
	}
	x.resp.ArchiveBytes = in.n
	return stream.SendAndClose(&agentv1.UploadResponse{Result: &x.resp})
}

// chunkReader reads the chunks of a client stream as one byte stream.
type chunkReader struct {
	recv func() ([]byte, error)
	buf  []byte
	n    uint64 // bytes received
	err  error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.buf, r.err = r.recv()
		r.n += uint64(len(r.buf))
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// extraction is one Upload being extracted.
type extraction struct {
	s       *Service
	b       *beneath
	limit   uint64
	resp    berthv1.UploadResponse
	entries int            // archive entries seen
	dirs    []dirMeta      // directory entries, fixed up last
	dirAt   map[string]int // index in dirs by name: a repeated entry updates its record
	copyBuf []byte         // file contents move through it: one write(2) per chunk, not per 32 KiB
}

// dirMeta is a directory entry's mode and times, applied after its
// contents were written (a read-only directory must not stop its own
// extraction). It keeps only these: a tar header also holds its pax
// records, up to 1 MiB each, which an archive of many directory entries
// would otherwise pile up in the agent's memory.
type dirMeta struct {
	raw          string // the entry's name as archived, for errors
	name         string
	mode         uint32
	atime, mtime unix.Timespec
}

func (x *extraction) run(in *chunkReader, c berthv1.Compression) error {
	br := bufio.NewReaderSize(in, 64<<10)
	var r io.Reader = br
	if c == berthv1.Compression_COMPRESSION_GZIP || c == berthv1.Compression_COMPRESSION_UNSPECIFIED && isGzip(br) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return archiveError("gzip: " + err.Error())
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if in.err != nil && !errors.Is(in.err, io.EOF) {
				return in.err // the stream broke, or a protocol error
			}
			return archiveError(fmt.Sprintf("after %d entries: %v", x.count(), err))
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.fixDir(x.dirs[i]); err != nil {
			return err
		}
	}
	return x.sync()
}

// isGzip reports whether the stream starts with gzip's magic bytes (RFC
// 1952 section 2.3.1).
func isGzip(br *bufio.Reader) bool {
	magic, _ := br.Peek(2)
	return len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
}

// archiveError is an INVALID_ARGUMENT status for an unreadable archive.
func archiveError(why string) error {
	return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonArchiveInvalid, "the upload is not a readable tar archive: "+why, nil)
}

func (x *extraction) count() uint64 {
	r := &x.resp
	return r.Files + r.Directories + r.Symlinks + r.HardLinks
}

// entryName validates an entry's name and returns it cleaned and
// relative; "." names the directory itself.
func entryName(name string) (string, error) {
	switch {
	case name == "":
		return "", &entryError{name, rpcstatus.ReasonTarEntryUnsafe, "has an empty name"}
	case strings.HasPrefix(name, "/"):
		return "", &entryError{name, rpcstatus.ReasonTarEntryUnsafe, "is an absolute path"}
	case hasDotDot(name):
		return "", &entryError{name, rpcstatus.ReasonTarEntryUnsafe, `has a ".." component`}
	case longComponent(name) != "":
		return "", &entryError{name, rpcstatus.ReasonTarEntryInvalid, "has a name component longer than Linux allows (NAME_MAX, 255 bytes)"}
	}
	return path.Clean(name), nil
}

// hasDotDot reports whether a slash-separated name has a ".." component.
func hasDotDot(name string) bool {
	for part := range strings.SplitSeq(name, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// entry extracts one archive entry.
func (x *extraction) entry(hdr *tar.Header, content io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if x.entries++; x.entries > x.s.cfg.MaxListEntries {
		return &tooLargeError{path: x.b.path, what: fmt.Sprintf("an archive of more than %d entries", x.s.cfg.MaxListEntries), limit: uint64(x.s.cfg.MaxListEntries), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
	}
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if err := x.apply(name, hdr, content); err != nil {
		if _, isErrno := errnoOf(err); !isErrno && !errors.Is(err, errEscape) {
			return err
		}
		return x.entryErr(hdr.Name, name, err)
	}
	return nil
}

// entryErr names the entry in err: a resolution that left the directory
// becomes TAR_ENTRY_UNSAFE, a file system error names the entry's path.
func (x *extraction) entryErr(raw, name string, err error) error {
	var entry *entryError
	if errors.As(err, &entry) || rpcstatus.Reason(err) != "" {
		return err
	}
	var tooLarge *tooLargeError
	if errors.As(err, &tooLarge) {
		return err
	}
	if errors.Is(err, errEscape) || errors.Is(err, unix.ELOOP) {
		why := "would be written through a symlink out of the target directory"
		if x.b.fallback {
			why = "would be written through a symlink (openat2 is unavailable, so no symlink is followed)"
		}
		return &entryError{raw, rpcstatus.ReasonTarEntryUnsafe, why}
	}
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return err
	}
	return pathError("extract", x.b.full(name), err)
}

func (x *extraction) apply(name string, hdr *tar.Header, content io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeDir:
		fd, err := x.b.mkdirAll(name)
		if err != nil {
			return err
		}
		unix.Close(fd)
		x.addDir(name, hdr)
		x.resp.Directories++
		return nil
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
		return x.file(name, hdr, content)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeLink:
		return x.link(name, hdr)
	}
	return &entryError{hdr.Name, rpcstatus.ReasonTarEntryInvalid, fmt.Sprintf("has type %q (devices, FIFOs and other special files are not extracted)", hdr.Typeflag)}
}

// parentOf returns an O_PATH descriptor of name's directory, made when
// missing, after removing whatever non-directory is at name (tar replaces
// entries).
func (x *extraction) parentOf(name string) (int, string, error) {
	parent, base, err := x.dirOf(name)
	if err != nil {
		return -1, "", err
	}
	if err := x.replace(parent, base, name); err != nil {
		unix.Close(parent)
		return -1, "", err
	}
	return parent, base, nil
}

// dirOf returns an O_PATH descriptor of name's directory, made when
// missing, and name's last component.
func (x *extraction) dirOf(name string) (int, string, error) {
	if name == "." {
		return -1, "", pathError("extract", x.b.path, unix.EISDIR)
	}
	parent, err := x.b.mkdirAll(path.Dir(name))
	if err != nil {
		return -1, "", err
	}
	return parent, path.Base(name), nil
}

// replace removes whatever non-directory is at base in parent.
func (x *extraction) replace(parent int, base, name string) error {
	if err := unix.Unlinkat(parent, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathError("replace", x.b.full(name), err)
	}
	return nil
}

func (x *extraction) file(name string, hdr *tar.Header, content io.Reader) error {
	if x.resp.ContentBytes+uint64(hdr.Size) > x.limit {
		return &tooLargeError{path: x.b.full(name), what: fmt.Sprintf("an archive of more than %d content bytes", x.limit), limit: x.limit, reason: rpcstatus.ReasonFileTooLarge, flag: "max-archive-bytes"}
	}
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return pathError("create", x.b.full(name), err)
	}
	if x.copyBuf == nil {
		x.copyBuf = make([]byte, chunkBytes)
	}
	n, err := io.CopyBuffer(fdWriter(fd), content, x.copyBuf)
	if err != nil {
		unix.Close(fd)
		if _, isErrno := errnoOf(err); isErrno {
			return pathError("write", x.b.full(name), err)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return archiveError(fmt.Sprintf("entry %q: %v", display(hdr.Name), err))
		}
		return err
	}
	err = unix.Fchmod(fd, uint32(hdr.Mode)&0o1777)
	unix.Close(fd)
	if err != nil {
		return pathError("chmod", x.b.full(name), err)
	}
	x.resp.Files++
	x.resp.ContentBytes += uint64(n)
	return x.times(parent, base, name, hdr)
}

// symlink creates a symlink entry. Only "harmless" targets are kept: a
// relative target that, resolved lexically from the link's directory, stays
// inside the target directory.
func (x *extraction) symlink(name string, hdr *tar.Header) error {
	t := hdr.Linkname
	switch {
	case t == "":
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, "is a symlink with an empty target"}
	case strings.HasPrefix(t, "/"):
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, fmt.Sprintf("is a symlink to the absolute path %q", display(t))}
	case strings.IndexByte(t, 0) >= 0:
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, "is a symlink whose target has a NUL byte"}
	case len(t) >= unix.PathMax:
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryInvalid, "is a symlink whose target is longer than Linux allows (PATH_MAX, 4096 bytes)"}
	}
	leadsOut := &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, fmt.Sprintf("is a symlink to %q, which leads out of the target directory", display(t))}
	if resolved := path.Join(path.Dir(name), t); resolved == ".." || strings.HasPrefix(resolved, "../") {
		return leadsOut
	}
	ups, rest := 0, t
	for rest == ".." || strings.HasPrefix(rest, "../") {
		ups++
		rest = strings.TrimPrefix(strings.TrimPrefix(rest, ".."), "/")
	}
	parent, base, err := x.dirOf(name)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	// Where a ".." after a name leads depends on whether that name is a
	// symlink: it is taken only when every name before it is a directory,
	// not a symlink, and it stays below the link's own directory.
	if last := strings.LastIndex("/"+rest+"/", "/../"); last >= 0 {
		if !x.b.realDirs(parent, rest[:last+2]) {
			return &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, fmt.Sprintf(`is a symlink to %q, with ".." after a name that is not a directory of the archive (where it leads would depend on what that name becomes)`, display(t))}
		}
	}
	// The link lands where its parent really is, which symlinks of the
	// archive may have moved from where its name says.
	if ups > 0 {
		within, err := x.b.climbs(parent, ups)
		if err != nil {
			return pathError("resolve parent of", x.b.full(name), err)
		}
		if !within {
			return leadsOut
		}
	}
	if err := x.replace(parent, base, name); err != nil {
		return err
	}
	if err := unix.Symlinkat(t, parent, base); err != nil {
		return pathError("symlink", x.b.full(name), err)
	}
	x.resp.Symlinks++
	return x.times(parent, base, name, hdr)
}

// link creates a hard link entry to an earlier entry, resolved beneath the
// directory; linkat(2) without AT_SYMLINK_FOLLOW links a symlink itself,
// never its target.
func (x *extraction) link(name string, hdr *tar.Header) error {
	t := hdr.Linkname
	switch {
	case t == "" || strings.HasPrefix(t, "/") || hasDotDot(t):
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryUnsafe, fmt.Sprintf("is a hard link to %q, which is not a relative path inside the archive", display(t))}
	case longComponent(t) != "":
		return &entryError{hdr.Name, rpcstatus.ReasonTarEntryInvalid, "is a hard link to a name longer than Linux allows (NAME_MAX, 255 bytes)"}
	}
	t = path.Clean(t)
	src, err := x.b.dir(path.Dir(t))
	if err != nil {
		return err
	}
	defer unix.Close(src)
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if err := unix.Linkat(src, path.Base(t), parent, base, 0); err != nil {
		return pathError("link to "+display(x.b.full(t))+" from", x.b.full(name), err)
	}
	x.resp.HardLinks++
	return nil
}

// addDir records a directory entry for fixDir; a directory archived twice
// gets the last entry's mode and times, as tar(1) would leave it.
func (x *extraction) addDir(name string, hdr *tar.Header) {
	atime, mtime := entryTimes(hdr)
	d := dirMeta{raw: hdr.Name, name: name, mode: uint32(hdr.Mode) & 0o1777, atime: atime, mtime: mtime}
	if i, ok := x.dirAt[name]; ok {
		x.dirs[i] = d
		return
	}
	if x.dirAt == nil {
		x.dirAt = make(map[string]int)
	}
	x.dirAt[name] = len(x.dirs)
	x.dirs = append(x.dirs, d)
}

// entryTimes returns an entry's access and modification time; the access
// time is the modification time when the archive has none.
func entryTimes(hdr *tar.Header) (atime, mtime unix.Timespec) {
	mtime = unix.NsecToTimespec(hdr.ModTime.UnixNano())
	atime = mtime
	if !hdr.AccessTime.IsZero() {
		atime = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	return atime, mtime
}

// times sets an entry's access and modification time, not following a
// symlink.
func (x *extraction) times(parent int, base, name string, hdr *tar.Header) error {
	atime, mtime := entryTimes(hdr)
	return x.setTimes(parent, base, name, atime, mtime)
}

func (x *extraction) setTimes(parent int, base, name string, atime, mtime unix.Timespec) error {
	if err := unix.UtimesNanoAt(parent, base, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError("set times of", x.b.full(name), err)
	}
	return nil
}

// fixDir applies a directory entry's mode and times.
func (x *extraction) fixDir(d dirMeta) error {
	if d.name != "." {
		fd, err := x.b.open(d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return x.entryErr(d.raw, d.name, err)
		}
		err = unix.Fchmod(fd, d.mode)
		unix.Close(fd)
		if err != nil {
			return pathError("chmod", x.b.full(d.name), err)
		}
		parent, err := x.b.dir(path.Dir(d.name))
		if err != nil {
			return x.entryErr(d.raw, d.name, err)
		}
		defer unix.Close(parent)
		return x.setTimes(parent, path.Base(d.name), d.name, d.atime, d.mtime)
	}
	return nil
}

// sync flushes what was extracted to disk: syncfs(2) of the directory's
// file system, one call instead of an fsync(2) per file.
func (x *extraction) sync() error {
	fd, err := x.b.open(".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		unix.Sync()
		return nil
	}
	defer unix.Close(fd)
	return pathError("syncfs", x.b.path, unix.Syncfs(fd))
}

// fdWriter writes to a file descriptor.
type fdWriter int

func (f fdWriter) Write(p []byte) (int, error) {
	n := len(p)
	return n, writeAll(int(f), p)
}
