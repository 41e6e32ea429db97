package tartree

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options configure Extract. The zero value extracts with the calling
// thread's identity owning what it creates.
type Options struct {
	// Chown, when set, gives each extracted entry the archive's numeric
	// owner. It is called with a descriptor of the entry itself (O_PATH
	// for a symlink, which is never followed, a FIFO or a device node),
	// after the entry's mode was set: it does fchownat(fd, "", uid, gid,
	// AT_EMPTY_PATH) and then, when mode is not zero (for a regular file
	// or a directory, whose descriptor is open for reading or writing),
	// fchmod(fd, mode), since chown(2) clears setuid and setgid bits.
	// Setuid and setgid bits are kept only with Chown; without it they are
	// cleared, since the files belong to whoever extracts.
	Chown func(fd, uid, gid int, mode uint32) error
	// Check is called with each entry's header before the entry is
	// extracted; its error stops the extraction and is returned as is.
	Check func(hdr *tar.Header) error
	// Skip is called for each entry that is passed over, with why: a
	// device node that the caller may not create (mknod(2) fails with
	// EPERM without CAP_MKNOD). Nil: such entries fail the extraction.
	Skip func(name, why string)
	// Sync makes what Extract wrote durable before it returns: each
	// regular file and each directory whose entries changed is fsync(2)ed
	// (the files once all are written, before the tree moves into place;
	// the directories after, up to the existing ancestor it was made in)
	// when they number at most syncEachMax; a larger archive, or one whose
	// directory cannot be opened, flushes the whole file system instead
	// (syncfs(2)), which costs as much as all the data anyone left
	// unwritten on it, and no file is fsync(2)ed one by one.
	Sync bool
	// Staging, when set, is called with the path of the staging directory
	// (see Extract) before the directory is made, so that the caller can
	// record it and remove it after a crash that left it (IsStagingName);
	// its error stops the extraction before anything is made.
	Staging func(path string) error
}

// Counts says what Extract made.
type Counts struct {
	Files       uint64 // regular files
	Directories uint64 // directory entries
	Symlinks    uint64
	HardLinks   uint64
	Special     uint64 // FIFOs and device nodes
	// ContentBytes is the apparent size of the regular files written,
	// holes included.
	ContentBytes uint64
	Skipped      uint64 // entries passed to Options.Skip
}

// Extract extracts the tar stream r into the directory dir (an absolute
// path, or one relative to the working directory), made with its missing
// parents, and returns what it made.
//
// Nothing appears until the whole archive is extracted: entries go to a
// staging directory, ".berth-upload-<random>", made inside dir when dir
// exists, else beside the first missing component of dir; at the end the
// staging directory becomes that component (rename(2)), or its entries
// move into dir, replacing what is there as tar(1) does. A failed or
// interrupted extraction removes the staging directory and leaves dir as
// it was; so does a conflict found before anything moves (a file of the
// archive where dir has a non-empty directory, a directory of the archive
// reached only through a symlink of dir that leads out of it).
//
// Entry names must be relative without a ".." component (else an
// *EntryError with Unsafe set); every name is resolved beneath the
// extraction directory with openat2(2) RESOLVE_BENEATH, so that nothing
// is ever written through a symlink out of it: such an entry fails with an
// *EntryError with Unsafe set. Symlink targets are kept verbatim, absolute
// ones too. Regular files get their holes back: blocks of zeros are not
// written (whether the archive stored the file sparse or not). Modes and
// modification times are applied, a directory's after its contents; see
// Options for owners. A stream that is not a tar archive fails with an
// *ArchiveError; file system failures are *fs.PathError values naming the
// final path.
func Extract(dir string, r io.Reader, opts Options) (Counts, error) {
	x := &extraction{opts: opts, dir: dir, dirAt: make(map[string]int), parentFd: -1, umask: processUmask()}
	if err := x.stage(); err != nil {
		return Counts{}, err
	}
	err := x.extract(r)
	if err == nil {
		// The files are durable before the tree moves into place.
		err = x.syncFiles()
	}
	x.dropFiles()
	x.dropParent()
	if err == nil {
		err = x.commit()
	}
	x.b.close()
	if x.final != nil {
		x.final.close()
	}
	if x.staging != "" {
		if rmErr := removeTree(unix.AT_FDCWD, x.staging); err == nil && rmErr != nil {
			err = pathError("remove staging directory", x.staging, rmErr)
		}
	}
	if err != nil {
		return Counts{}, err
	}
	if err := x.fixDirs(); err != nil {
		return Counts{}, err
	}
	if opts.Sync {
		if err := x.sync(); err != nil {
			return Counts{}, err
		}
	}
	return x.counts, nil
}

// syncfs is syncfs(2) and fsync fsync(2) of a file; tests count their
// calls.
var (
	syncfs = unix.Syncfs
	fsync  = unix.Fsync
)

// syncEachMax bounds the files and directories an extraction fsync(2)s
// one by one (Options.Sync); past it, syncfs(2) is cheaper.
const syncEachMax = 64

// synced notes, for Options.Sync, that the entry name (cleaned, relative to
// the extraction directory) was made: its directory's entries changed, and
// a directory entry's own metadata too. It reports whether the files and
// directories are still few enough to fsync one by one; once they are
// not, the files kept for it are closed (syncfs(2) at the end instead).
func (x *extraction) synced(name string, isDir bool) bool {
	if !x.opts.Sync || x.syncAll {
		return false
	}
	if x.syncDirs == nil {
		x.syncDirs = map[string]bool{".": true}
	}
	x.syncDirs[path.Dir(name)] = true
	if isDir {
		x.syncDirs[name] = true
	}
	if x.fsynced+len(x.syncDirs) > syncEachMax {
		x.syncAll = true
		x.dropFiles()
	}
	return !x.syncAll
}

// syncFiles fsync(2)s the files kept open for it (see file), once the
// whole archive is extracted: a file is fsync(2)ed only when the archive
// turned out small enough, never before the extraction knows.
func (x *extraction) syncFiles() error {
	for _, f := range x.syncFds {
		if err := fsync(f.fd); err != nil {
			return pathError("fsync", x.b.full(f.name), err)
		}
	}
	return nil
}

// dropFiles closes the files kept for syncFiles.
func (x *extraction) dropFiles() {
	for _, f := range x.syncFds {
		unix.Close(f.fd)
	}
	x.syncFds = nil
}

// sync makes the extracted tree durable (Options.Sync): its files were
// fsync(2)ed as they were written; their directories are now, in place,
// with the directories the tree was made in (from the existing ancestor
// down), or the whole file system when they were too many.
func (x *extraction) sync() error {
	if !x.syncAll {
		var dirs []string
		for rel := range x.syncDirs {
			dirs = append(dirs, filepath.Join(x.dir, rel))
		}
		if x.ancestor != "" {
			for d := filepath.Dir(x.dir); ; d = filepath.Dir(d) {
				dirs = append(dirs, d)
				if d == x.ancestor || d == filepath.Dir(d) {
					break
				}
			}
		}
		slices.Sort(dirs)
		for _, d := range dirs {
			// A directory the workload user may not read (mode 0333)
			// cannot be opened to fsync it: syncfs(2) then.
			fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				x.syncAll = true
				break
			}
			err = unix.Fsync(fd)
			unix.Close(fd)
			if err != nil {
				return pathError("fsync", d, err)
			}
		}
		if !x.syncAll {
			return nil
		}
	}
	fd, err := unix.Open(x.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Sync()
		return nil
	}
	defer unix.Close(fd)
	if err := syncfs(fd); err != nil {
		return pathError("syncfs", x.dir, err)
	}
	return nil
}

// extraction is one Extract in progress.
type extraction struct {
	opts   Options
	dir    string
	counts Counts

	// Staging: the archive is extracted beneath b, whose directory is
	// root. In merge mode (dir existed) staging is inside dir and root is
	// staging; otherwise staging is inside ancestor, stands for
	// ancestor/chain[0], and root is staging/chain[1:]...
	staging  string
	root     string
	merge    bool
	ancestor string
	chain    []string
	b        *beneath
	final    *beneath // dir itself, once it exists (merge mode)

	dirs  []dirMeta      // directory entries, fixed up last
	dirAt map[string]int // index in dirs by name

	// Options.Sync: the directories to fsync once in place (names
	// relative to dir), the files written so far and those kept open to
	// fsync at the end, and whether they became too many (then syncfs).
	syncDirs map[string]bool
	fsynced  int
	syncFds  []openFile
	syncAll  bool

	// The directory of the last entry (parentOf), kept open while
	// entries go there, and the buffer file contents are copied through.
	parentName string
	parentFd   int
	copyBuf    []byte

	// The process's umask, which open(2) applies to a new file's mode;
	// -1 when unknown (then every file's mode is set by fchmod(2)).
	umask int
}

// openFile is a regular file extracted and kept open to fsync(2) it.
type openFile struct {
	fd   int
	name string
}

// dirMeta is a directory entry's owner, mode and times, applied after its
// contents were written (a read-only directory must not stop its own
// extraction, nor a directory owned by another user).
type dirMeta struct {
	raw          string // the entry's name as archived, for errors
	name         string
	mode         uint32
	uid, gid     int
	atime, mtime unix.Timespec
}

// stagingPrefix starts the name of every staging directory; stagingHex
// random hex digits follow.
const (
	stagingPrefix = ".berth-upload-"
	stagingHex    = 12
)

// IsStagingName reports whether name, a base name, is one Extract gives
// its staging directories: ".berth-upload-" and 12 lowercase hex digits. A
// user's file may be named so too: only a name the caller recorded
// (Options.Staging) is known to be a staging directory.
func IsStagingName(name string) bool {
	suffix, ok := strings.CutPrefix(name, stagingPrefix)
	if !ok || len(suffix) != stagingHex {
		return false
	}
	for _, c := range suffix {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// stage makes the staging directory.
func (x *extraction) stage() error {
	var rnd [stagingHex / 2]byte
	rand.Read(rnd[:])
	name := stagingPrefix + hex.EncodeToString(rnd[:])
	var st unix.Stat_t
	err := unix.Stat(x.dir, &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return pathError("extract into", x.dir, unix.ENOTDIR)
	case err == nil:
		x.merge = true
		x.staging = filepath.Join(x.dir, name)
		x.root = x.staging
	case errors.Is(err, unix.ENOENT):
		a := x.dir
		for {
			x.chain = append([]string{filepath.Base(a)}, x.chain...)
			a = filepath.Dir(a)
			err := unix.Stat(a, &st)
			if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return pathError("extract into", a, unix.ENOTDIR)
			}
			if err == nil {
				break
			}
			if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
				return pathError("stat", a, err)
			}
		}
		x.ancestor = a
		x.staging = filepath.Join(a, name)
		x.root = filepath.Join(append([]string{x.staging}, x.chain[1:]...)...)
	default:
		return pathError("stat", x.dir, err)
	}
	if x.opts.Staging != nil {
		if err := x.opts.Staging(x.staging); err != nil {
			x.staging = ""
			return err
		}
	}
	// 0700 while staging: nobody sees the tree before it is complete.
	if err := unix.Mkdir(x.staging, 0o700); err != nil {
		parent := filepath.Dir(x.staging)
		x.staging = ""
		return pathError("make staging directory in", parent, err)
	}
	if err := unix.Chmod(x.staging, 0o700); err != nil {
		return x.failStage(pathError("chmod", x.staging, err))
	}
	for i := 1; i < len(x.chain); i++ {
		p := filepath.Join(append([]string{x.staging}, x.chain[1:i+1]...)...)
		if err := unix.Mkdir(p, defaultDirMode); err != nil {
			return x.failStage(pathError("mkdir", p, err))
		}
	}
	b, err := openBeneath(x.root)
	if err != nil {
		return x.failStage(err)
	}
	b.path = x.dir // messages name final paths
	x.b = b
	return nil
}

func (x *extraction) failStage(err error) error {
	removeTree(unix.AT_FDCWD, x.staging)
	x.staging = ""
	return err
}

// extract reads the archive into the staging directory.
func (x *extraction) extract(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &ArchiveError{fmt.Sprintf("after %d entries: %v", x.count(), err)}
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

func (x *extraction) count() uint64 {
	c := &x.counts
	return c.Files + c.Directories + c.Symlinks + c.HardLinks + c.Special + c.Skipped
}

// entryName validates an entry's name and returns it cleaned and relative;
// "." names the directory itself.
func entryName(name string) (string, error) {
	switch {
	case name == "":
		return "", &EntryError{name, true, "has an empty name"}
	case strings.HasPrefix(name, "/"):
		return "", &EntryError{name, true, "is an absolute path"}
	case hasDotDot(name):
		return "", &EntryError{name, true, `has a ".." component`}
	case strings.IndexByte(name, 0) >= 0:
		return "", &EntryError{name, false, "has a NUL byte in its name"}
	case longComponent(name):
		return "", &EntryError{name, false, "has a name component longer than Linux allows (NAME_MAX, 255 bytes)"}
	}
	return path.Clean(name), nil
}

func hasDotDot(name string) bool {
	for part := range strings.SplitSeq(name, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// nameMax is NAME_MAX, the longest file name Linux file systems take.
const nameMax = 255

func longComponent(name string) bool {
	for part := range strings.SplitSeq(name, "/") {
		if len(part) > nameMax {
			return true
		}
	}
	return false
}

// entry extracts one archive entry.
func (x *extraction) entry(hdr *tar.Header, content io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, 'V': // pax global header, GNU volume label
		return nil
	}
	if x.opts.Check != nil {
		if err := x.opts.Check(hdr); err != nil {
			return err
		}
	}
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if err := x.apply(name, hdr, content); err != nil {
		return x.entryErr(hdr.Name, name, err)
	}
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA && hdr.Typeflag != tar.TypeGNUSparse && hdr.Typeflag != tar.TypeCont {
		x.synced(name, hdr.Typeflag == tar.TypeDir) // file notes its own
	}
	return nil
}

// entryErr names the entry in err: a resolution that left the directory
// becomes an unsafe *EntryError, an errno a *fs.PathError naming the
// entry's final path.
func (x *extraction) entryErr(raw, name string, err error) error {
	var (
		entry   *EntryError
		archive *ArchiveError
	)
	if errors.As(err, &entry) || errors.As(err, &archive) {
		return err
	}
	if errors.Is(err, ErrEscape) || errors.Is(err, unix.ELOOP) {
		why := "would be written through a symlink out of the target directory"
		if x.b.fallback {
			why = "would be written through a symlink (openat2 is unavailable, so no symlink is followed)"
		}
		return &EntryError{raw, true, why}
	}
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return err
	}
	if _, isErrno := err.(unix.Errno); isErrno {
		return pathError("extract", x.b.full(name), err)
	}
	return err
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
		x.counts.Directories++
		return nil
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		return x.file(name, hdr, content)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeLink:
		return x.link(name, hdr)
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		return x.special(name, hdr)
	}
	return &EntryError{hdr.Name, false, fmt.Sprintf("has type %q, which berth does not extract", hdr.Typeflag)}
}

// mask is the permission bits kept from the archive: setuid and setgid
// only when owners are kept too.
func (x *extraction) mask() uint32 {
	if x.opts.Chown != nil {
		return 0o7777
	}
	return 0o1777
}

// parentOf returns an O_PATH descriptor of name's directory, made when
// missing, and name's base name. The descriptor stays open for the
// entries that follow in the same directory (archives list a directory's
// entries together); the caller does not close it. It was resolved
// beneath the directory, and extraction never removes a directory, so
// it stays the directory it named.
func (x *extraction) parentOf(name string) (int, string, error) {
	if name == "." {
		return -1, "", pathError("extract", x.b.path, unix.EISDIR)
	}
	dir := path.Dir(name)
	if x.parentName != dir || x.parentFd < 0 {
		x.dropParent()
		fd, err := x.b.mkdirAll(dir)
		if err != nil {
			return -1, "", err
		}
		x.parentName, x.parentFd = dir, fd
	}
	return x.parentFd, path.Base(name), nil
}

// dropParent closes the directory parentOf kept.
func (x *extraction) dropParent() {
	if x.parentName != "" {
		unix.Close(x.parentFd)
	}
	x.parentName, x.parentFd = "", -1
}

// replacing runs make, which creates the entry base in parent; when it
// fails with EEXIST, whatever non-directory is there is removed and make
// runs once more: a later entry replaces an earlier one, as in tar(1).
// The staging directory is new, so a name is rarely there already: the
// removal is not tried first.
func (x *extraction) replacing(parent int, base, name string, make func() error) error {
	err := make()
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	if err := unix.Unlinkat(parent, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathError("replace", x.b.full(name), err)
	}
	return make()
}

func (x *extraction) file(name string, hdr *tar.Header, content io.Reader) error {
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	// The file is made with its final mode when open(2)'s umask leaves
	// that whole (the staging directory, 0700, hides it meanwhile):
	// no fchmod(2) then. Setuid, setgid and sticky bits, and a mode the
	// umask would cut, are set by fchmod(2) after the write.
	mode := uint32(hdr.Mode) & x.mask()
	createMode, chmod := uint32(0o600), true
	if x.umask >= 0 && mode&^0o777 == 0 && mode&uint32(x.umask) == 0 {
		createMode, chmod = mode, false
	}
	fd := -1
	err = x.replacing(parent, base, name, func() (err error) {
		fd, err = unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, createMode)
		return err
	})
	if err != nil {
		return pathErrorOf("create", x.b.full(name), err)
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	w := &holeWriter{fd: fd}
	if x.copyBuf == nil {
		x.copyBuf = make([]byte, 128<<10)
	}
	if _, err := io.CopyBuffer(w, content, x.copyBuf); err != nil {
		if _, isErrno := err.(unix.Errno); isErrno {
			return pathError("write", x.b.full(name), err)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return &ArchiveError{fmt.Sprintf("entry %q: %v", Display(hdr.Name), err)}
		}
		return err
	}
	if err := w.finish(); err != nil {
		return pathError("write", x.b.full(name), err)
	}
	if chmod {
		if err := unix.Fchmod(fd, mode); err != nil {
			return pathError("chmod", x.b.full(name), err)
		}
	}
	// Times before the owner: once another user owns it, setting them
	// would need CAP_FOWNER.
	if err := futimens(fd, hdr); err != nil {
		return pathError("set times of", x.b.full(name), err)
	}
	if x.opts.Chown != nil {
		if err := x.opts.Chown(fd, hdr.Uid, hdr.Gid, mode); err != nil {
			return x.chownError(hdr.Name, name, hdr.Uid, hdr.Gid, err)
		}
	}
	x.fsynced++
	if x.synced(name, false) {
		x.syncFds = append(x.syncFds, openFile{fd, name})
		keep = true
	}
	x.counts.Files++
	x.counts.ContentBytes += uint64(w.off)
	return nil
}

// chownError describes a failed chown of the entry raw (name cleaned):
// EINVAL means an owner that the user namespace of the extraction (a
// sandbox's) does not map.
func (x *extraction) chownError(raw, name string, uid, gid int, err error) error {
	if errors.Is(err, unix.EINVAL) {
		return &EntryError{raw, false, fmt.Sprintf("has owner %d:%d, which is not mapped here (user namespace)", uid, gid)}
	}
	return pathError("chown", x.b.full(name), err)
}

// chownAt is chown of base in parent, not following a symlink.
func (x *extraction) chownAt(parent int, base string, hdr *tar.Header) error {
	if x.opts.Chown == nil {
		return nil
	}
	fd, err := unix.Openat(parent, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return x.opts.Chown(fd, hdr.Uid, hdr.Gid, 0)
}

// symlink creates a symlink entry with its target verbatim. Where the
// target leads does not matter here: a later entry is never written
// through it out of the directory (see beneath).
func (x *extraction) symlink(name string, hdr *tar.Header) error {
	t := hdr.Linkname
	switch {
	case t == "":
		return &EntryError{hdr.Name, false, "is a symlink with an empty target"}
	case strings.IndexByte(t, 0) >= 0:
		return &EntryError{hdr.Name, false, "is a symlink whose target has a NUL byte"}
	case len(t) >= unix.PathMax:
		return &EntryError{hdr.Name, false, "is a symlink whose target is longer than Linux allows (PATH_MAX, 4096 bytes)"}
	}
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	if err := x.replacing(parent, base, name, func() error { return unix.Symlinkat(t, parent, base) }); err != nil {
		return pathErrorOf("symlink", x.b.full(name), err)
	}
	if err := x.times(parent, base, name, hdr); err != nil {
		return err
	}
	if err := x.chownAt(parent, base, hdr); err != nil {
		return x.chownError(hdr.Name, name, hdr.Uid, hdr.Gid, err)
	}
	x.counts.Symlinks++
	return nil
}

// link creates a hard link entry to an earlier entry, resolved beneath
// the directory (or, when extracting into an existing directory, to a file
// already there); linkat(2) without AT_SYMLINK_FOLLOW links a symlink
// itself, never its target.
func (x *extraction) link(name string, hdr *tar.Header) error {
	t := hdr.Linkname
	switch {
	case t == "" || strings.HasPrefix(t, "/") || hasDotDot(t):
		return &EntryError{hdr.Name, true, fmt.Sprintf("is a hard link to %q, which is not a relative path inside the archive", Display(t))}
	case longComponent(t):
		return &EntryError{hdr.Name, false, "is a hard link to a name longer than Linux allows (NAME_MAX, 255 bytes)"}
	}
	t = path.Clean(t)
	src, err := x.linkSource(t)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	if err := x.replacing(parent, base, name, func() error { return unix.Linkat(src, path.Base(t), parent, base, 0) }); err != nil {
		return pathErrorOf("link to "+Display(x.b.full(t))+" from", x.b.full(name), err)
	}
	x.counts.HardLinks++
	return nil
}

// linkSource opens the directory of a hard link's target: in the staging
// directory, or in dir itself when the archive did not hold the target.
func (x *extraction) linkSource(t string) (int, error) {
	src, err := x.b.dir(path.Dir(t))
	if err == nil {
		var st unix.Stat_t
		if unix.Fstatat(src, path.Base(t), &st, unix.AT_SYMLINK_NOFOLLOW) == nil || !x.merge {
			return src, nil
		}
		unix.Close(src)
	} else if !errors.Is(err, unix.ENOENT) || !x.merge {
		return -1, err
	}
	if x.final == nil {
		if x.final, err = openBeneath(x.dir); err != nil {
			return -1, err
		}
	}
	return x.final.dir(path.Dir(t))
}

// special creates a FIFO or a device node. A device node that may not be
// made here (EPERM: creating one needs CAP_MKNOD) is passed to Skip.
func (x *extraction) special(name string, hdr *tar.Header) error {
	mode := uint32(hdr.Mode) & x.mask()
	dev := 0
	switch hdr.Typeflag {
	case tar.TypeFifo:
		mode |= unix.S_IFIFO
	case tar.TypeChar:
		mode |= unix.S_IFCHR
		dev = int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	case tar.TypeBlock:
		mode |= unix.S_IFBLK
		dev = int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	}
	parent, base, err := x.parentOf(name)
	if err != nil {
		return err
	}
	if err := x.replacing(parent, base, name, func() error { return unix.Mknodat(parent, base, mode, dev) }); err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			return err
		}
		if errors.Is(err, unix.EPERM) && hdr.Typeflag != tar.TypeFifo && x.opts.Skip != nil {
			x.opts.Skip(hdr.Name, fmt.Sprintf("a %s device node may not be created here (mknod needs CAP_MKNOD)", map[byte]string{tar.TypeChar: "character", tar.TypeBlock: "block"}[hdr.Typeflag]))
			x.counts.Skipped++
			return nil
		}
		return pathError("mknod", x.b.full(name), err)
	}
	// mknod(2) applies the umask.
	if err := unix.Fchmodat(parent, base, mode&0o7777, 0); err != nil {
		return pathError("chmod", x.b.full(name), err)
	}
	if err := x.times(parent, base, name, hdr); err != nil {
		return err
	}
	if err := x.chownAt(parent, base, hdr); err != nil {
		return x.chownError(hdr.Name, name, hdr.Uid, hdr.Gid, err)
	}
	x.counts.Special++
	return nil
}

// addDir records a directory entry for fixDirs; a directory archived twice
// gets the last entry's metadata, as tar(1) would leave it.
func (x *extraction) addDir(name string, hdr *tar.Header) {
	atime, mtime := entryTimes(hdr)
	d := dirMeta{raw: hdr.Name, name: name, mode: uint32(hdr.Mode) & x.mask(), uid: hdr.Uid, gid: hdr.Gid, atime: atime, mtime: mtime}
	if i, ok := x.dirAt[name]; ok {
		x.dirs[i] = d
		return
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
	if err := unix.UtimesNanoAt(parent, base, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError("set times of", x.b.full(name), err)
	}
	return nil
}

// processUmask returns the umask of the process (its threads share one),
// from the Umask line of /proc/thread-self/status (Linux 4.7), or -1 when
// that cannot be read: reading it with umask(2) would set it meanwhile,
// under the files that other goroutines create.
func processUmask() int {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil || m > 0o777 {
				return -1
			}
			return int(m)
		}
	}
	return -1
}

// futimens gives the file open at fd the entry's access and modification
// time (entryTimes): utimensat(2) with a NULL path, as glibc's
// futimens(3), which x/sys/unix lacks (its Futimes goes through
// /proc/self/fd, by path).
func futimens(fd int, hdr *tar.Header) error {
	var ts [2]unix.Timespec
	ts[0], ts[1] = entryTimes(hdr)
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// holeWriter writes a file's content at increasing offsets, leaving a hole
// (seeking over it) wherever a whole aligned block is zeros.
type holeWriter struct {
	fd   int
	off  int64 // bytes of content so far
	hole bool  // the content so far ends in a hole: the file is shorter
}

// holeBlock is the granularity of holes: the page size of the file
// systems a sandbox uses.
const holeBlock = 4096

func (w *holeWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		k := min(len(p), holeBlock-int(w.off%holeBlock))
		if k == holeBlock && allZero(p[:k]) {
			w.off += holeBlock
			w.hole = true
			p = p[k:]
			continue
		}
		w.hole = false
		// Gather up to the next all-zero block into one write.
		for k < len(p) {
			next := min(len(p)-k, holeBlock)
			if next == holeBlock && allZero(p[k:k+next]) {
				break
			}
			k += next
		}
		for done := 0; done < k; {
			n, err := unix.Pwrite(w.fd, p[done:k], w.off)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return total - len(p) + done, err
			}
			done += n
			w.off += int64(n)
		}
		p = p[k:]
	}
	return total, nil
}

// finish gives the file its size when it ends in a hole.
func (w *holeWriter) finish() error {
	if w.hole {
		return unix.Ftruncate(w.fd, w.off)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// removeTree removes name in the directory open at dirfd and everything
// beneath it, following no symlink. It undoes a failed extraction.
func removeTree(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := ReadDirNames(fd)
	for _, n := range names {
		if rmErr := removeTree(fd, n); err == nil {
			err = rmErr
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}
