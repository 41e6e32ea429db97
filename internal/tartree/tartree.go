// Package tartree moves directory trees into and out of tar archives. It
// archives a tree as a POSIX pax stream (Walk, Writer) and extracts a
// stream beneath a directory without ever writing outside it (Extract).
// berth-agent's Upload and Download and the berth CLI's cp both use it, so
// the two ends of a copy keep the same things: regular files (sparse ones
// with their holes), directories, symlinks with their targets verbatim
// (absolute ones too: a target is data), hard links, FIFOs, device nodes,
// permission bits, modification times to the nanosecond and numeric
// owners.
//
// What it writes, GNU tar, bsdtar (libarchive) and busybox tar read; what
// they write, it reads (Go's archive/tar: ustar, pax, GNU, and sparse files
// in all of GNU's formats). Sparse files are written in the pax format 1.0
// of GNU tar (GNU.sparse.major=1), which archive/tar reads but cannot
// write; busybox tar reads such an entry as a plain file holding the sparse
// map and the data.
package tartree

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// defaultDirMode is the mode of directories made for an entry whose
// archive has no entry of their own.
const defaultDirMode = 0o755

// ChangedError says that a file changed while it was archived: its size or
// type differs from what the walk saw, or it ended early or grew.
type ChangedError struct {
	Path string
	Why  string // e.g. "it ended after 10 of its 20 bytes"
}

func (e *ChangedError) Error() string {
	return fmt.Sprintf("%s changed while it was read: %s", Display(e.Path), e.Why)
}

// EntryError says why an archive entry was refused.
type EntryError struct {
	Entry string // the entry's name as archived
	// Unsafe is set when the entry would lead out of the directory (a ".."
	// or absolute name, a write through a symlink that leads out); clear
	// when the entry is invalid or of an unsupported type.
	Unsafe bool
	Why    string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("archive entry %q: %s", Display(e.Entry), e.Why)
}

// ArchiveError says that the stream is not a readable tar archive.
type ArchiveError struct {
	Why string
}

func (e *ArchiveError) Error() string {
	return "not a readable tar archive: " + e.Why
}

// Display returns s when it is valid UTF-8; otherwise each byte that is not
// part of valid UTF-8 is written as \xNN.
func Display(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b []byte
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = fmt.Appendf(b, `\x%02x`, s[i])
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// pathError wraps err as a *fs.PathError of op on path.
func pathError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// pathErrorOf is pathError, or err itself when it is a *fs.PathError
// already (one that names another operation, such as a replace).
func pathErrorOf(op, path string, err error) error {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return err
	}
	return pathError(op, path, err)
}

// readDirNames returns the names in the directory open at fd, without "."
// and "..", from getdents64(2), in byte order.
func ReadDirNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			slices.Sort(names)
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// readlinkAt reads the symlink name relative to dirfd (readlinkat(2)),
// whatever the length of its target.
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
