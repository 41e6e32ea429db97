package rangeread

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/tartree"
)

// copyStepBytes is the most one copy call moves: ctx is checked and moved
// called between steps.
const copyStepBytes = 8 << 20

// How Copy moves bytes, from the cheapest: each is tried until the kernel
// refuses it for the two files, then the next.
type copyMode int

const (
	// copy_file_range(2): a clone or an in-kernel copy; refused across
	// file systems of different types (EXDEV) and by some file systems.
	modeCopyFileRange copyMode = iota
	// sendfile(2): a splice through the page cache, across file systems.
	modeSendfile
	// pread(2) and write(2) through a buffer.
	modeReadWrite
)

// String names the mode for logs.
func (m copyMode) String() string {
	return [...]string{"copy_file_range", "sendfile", "read/write"}[m]
}

// DestinationError is a failing write of Copy's destination.
type DestinationError struct {
	Op  string // the system call
	Err error  // its errno
}

func (e *DestinationError) Error() string {
	return fmt.Sprintf("write destination (%s): %v", e.Op, e.Err)
}
func (e *DestinationError) Unwrap() error { return e.Err }

// Copy writes r into the file open at dst, at and advancing dst's own
// file offset as write(2) would, in the kernel where it can
// (copy_file_range(2), else sendfile(2), else pread(2) and write(2)), and
// returns the name of the way it last used. It fails as Send does: a
// *tartree.ChangedError when the file yields fewer bytes than the range,
// more (ToEnd), or another size or modification time than First at the
// end; an *fs.PathError ("read", "fstat") for a failing read of r; ctx's
// error once ctx ends; and a *DestinationError for a failing write of
// dst. Bytes written before a failure stay in dst. moved counts the bytes
// as they are written.
func Copy(ctx context.Context, dst int, r Range, moved func(int)) (string, error) {
	mode := modeCopyFileRange
	var buf []byte
	var done uint64
	for done < r.Length {
		if err := ctx.Err(); err != nil {
			return mode.String(), err
		}
		want := int(min(copyStepBytes, r.Length-done))
		off := int64(r.Offset + done)
		var n int
		var err error
		switch mode {
		case modeCopyFileRange:
			n, err = unix.CopyFileRange(r.FD, &off, dst, nil, want, 0)
			if err == nil && n == 0 && !atEnd(r.FD, off) {
				// A file system that copies nothing rather than refuse.
				mode++
				continue
			}
			if refused(err) {
				mode++
				continue
			}
		case modeSendfile:
			n, err = unix.Sendfile(dst, r.FD, &off, want)
			if refused(err) {
				mode++
				continue
			}
		case modeReadWrite:
			if buf == nil {
				buf = make([]byte, 1<<20)
			}
			n, err = preadFull(r.FD, buf[:min(want, len(buf))], off)
			if err != nil {
				return mode.String(), &fs.PathError{Op: "read", Path: r.Path, Err: err}
			}
			if err := writeFull(dst, buf[:n]); err != nil {
				return mode.String(), &DestinationError{Op: "write", Err: err}
			}
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			// Which side failed the kernel does not say; a full or
			// failing destination is the usual cause (ENOSPC, EDQUOT,
			// EFBIG, EIO of its disk), a source of a local disk file
			// system failing the read below (pread) shows as EIO.
			return mode.String(), &DestinationError{Op: mode.String(), Err: err}
		}
		if n == 0 {
			return mode.String(), &tartree.ChangedError{Path: r.Path, Why: fmt.Sprintf("it ended after %d of the %d bytes its size promised", done, r.Length)}
		}
		moved(n)
		done += uint64(n)
	}
	return mode.String(), r.finish()
}

// refused reports whether err is the kernel declining a way of copying
// for these two files, rather than a failing copy.
func refused(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EBADF), errors.Is(err, unix.EPERM):
		return true
	}
	return false
}

// atEnd reports whether the file at fd has no byte at off.
func atEnd(fd int, off int64) bool {
	var one [1]byte
	n, err := unix.Pread(fd, one[:], off)
	return err == nil && n == 0
}

// preadFull reads up to len(p) bytes at off, fewer only at the end of the
// file.
func preadFull(fd int, p []byte, off int64) (int, error) {
	got := 0
	for got < len(p) {
		n, err := unix.Pread(fd, p[got:], off+int64(got))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return got, err
		}
		if n == 0 {
			break
		}
		got += n
	}
	return got, nil
}

// writeFull writes p whole at fd's file offset.
func writeFull(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
