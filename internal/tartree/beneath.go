package tartree

import (
	"errors"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// beneath resolves names beneath one directory, so that no name and no
// symlink can lead a write outside it. Where the kernel has openat2(2)
// (Linux 5.6) every name is resolved with RESOLVE_BENEATH and
// RESOLVE_NO_MAGICLINKS: ".." that would climb out, absolute symlinks and
// symlinks that lead out fail with EXDEV, atomically with the lookup.
// Without openat2 (ENOSYS, or EPERM from a seccomp profile that lacks it,
// as under gVisor before 2026) names are walked one component at a time
// with O_NOFOLLOW, so that no symlink at all is followed: stricter, and as
// safe.
type beneath struct {
	fd       int    // O_PATH descriptor of the directory
	path     string // the directory's path, for messages
	fallback bool   // openat2 is unavailable
}

// openBeneath opens the directory at path (following symlinks in path
// itself) for resolving names beneath it.
func openBeneath(path string) (*beneath, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathError("open directory", path, err)
	}
	b := &beneath{fd: fd, path: path}
	probe, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
	switch {
	case err == nil:
		unix.Close(probe)
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		b.fallback = true
	default:
		unix.Close(fd)
		return nil, pathError("openat2", path, err)
	}
	return b, nil
}

func (b *beneath) close() { unix.Close(b.fd) }

// full returns the path of rel for messages.
func (b *beneath) full(rel string) string { return path.Join(b.path, rel) }

// ErrEscape is returned (wrapped) when resolving a name would leave the
// directory an archive is extracted into.
var ErrEscape = errors.New("resolves outside the target directory")

// open opens rel beneath the directory with flags (O_CLOEXEC is added).
// rel is a cleaned relative name ("." for the directory itself).
func (b *beneath) open(rel string, flags int, mode uint32) (int, error) {
	if !b.fallback {
		fd, err := unix.Openat2(b.fd, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Mode:    uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.EXDEV) {
			return -1, ErrEscape
		}
		return fd, err
	}
	// Component by component, following no symlink.
	cur, err := unix.Openat(b.fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil || rel == "." {
		if err == nil && flags&unix.O_PATH == 0 {
			defer unix.Close(cur)
			return unix.Openat(cur, ".", flags|unix.O_CLOEXEC, mode)
		}
		return cur, err
	}
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW
		if i == len(parts)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(cur, part, f|unix.O_CLOEXEC, mode)
		if err != nil {
			var st unix.Stat_t
			if unix.Fstatat(cur, part, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK && (i < len(parts)-1 || flags&unix.O_DIRECTORY != 0) {
				err = ErrEscape
			}
			unix.Close(cur)
			return -1, err
		}
		unix.Close(cur)
		cur = next
	}
	return cur, nil
}

// dir opens the directory rel beneath as an O_PATH descriptor for *at
// calls.
func (b *beneath) dir(rel string) (int, error) {
	return b.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// mkdirAll makes the directory rel and its missing parents (mode 0755)
// beneath the directory and returns an O_PATH descriptor of it.
func (b *beneath) mkdirAll(rel string) (int, error) {
	fd, err := b.dir(rel)
	if !errors.Is(err, unix.ENOENT) || rel == "." {
		return fd, err
	}
	parent, err := b.mkdirAll(path.Dir(rel))
	if err != nil {
		return -1, err
	}
	err = unix.Mkdirat(parent, path.Base(rel), defaultDirMode)
	unix.Close(parent)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return b.dir(rel)
}
