package tartree

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Writer writes walked entries as a POSIX pax tar stream (IEEE Std
// 1003.1-2017, pax): numeric owners without user or group names,
// modification times to the nanosecond, names and link targets of any
// length, a symlink's target verbatim with size 0, hard links after the
// first name of a file as links to it, FIFOs and device nodes as such,
// and regular files with holes (SEEK_DATA/SEEK_HOLE) as sparse entries
// that hold only their data.
type Writer struct {
	tw    *tar.Writer
	out   io.Writer         // what tw writes to: sparse entries go there directly
	links map[devIno]string // first name archived of each multiply-linked file
	buf   []byte
}

type devIno struct{ dev, ino uint64 }

// NewWriter returns a Writer writing the archive to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{tw: tar.NewWriter(w), out: w, links: make(map[devIno]string)}
}

// Close writes the archive's end (two zero blocks); it does not close the
// underlying writer.
func (w *Writer) Close() error { return w.tw.Close() }

// Add writes e and returns the content bytes it carried (a regular file's
// data; holes are not counted). A regular file is opened (O_NOFOLLOW,
// except the walked root) and archived from fstat(2) of the open file:
// when its type or size differs from e.Stat, or it ends early or grows
// while it is copied, Add fails with a *ChangedError and the archive is
// unusable.
func (w *Writer) Add(e *Entry) (int64, error) {
	st := &e.Stat
	hdr := header(e.Name, st)
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		key := devIno{st.Dev, st.Ino}
		if first, ok := w.links[key]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			binaryNames(hdr)
			return 0, w.tw.WriteHeader(hdr)
		}
		w.links[key] = e.Name
	}
	switch typ {
	case unix.S_IFREG:
		return w.file(e)
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.Name+"/"
	case unix.S_IFLNK:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if typ == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	default:
		return 0, fmt.Errorf("archive %s: a %s cannot be archived", Display(e.Path), typeName(st.Mode))
	}
	binaryNames(hdr)
	return 0, w.tw.WriteHeader(hdr)
}

// binaryNames gives a header whose name or link target is not UTF-8 the
// GNU format, whose name fields (and long-name records) are bytes as they
// are. Linux names are bytes, but pax path records are UTF-8 unless the
// record hdrcharset=BINARY says otherwise (POSIX pax "hdrcharset"), and of
// the two readers that matter, bsdtar fails on such a name without
// hdrcharset while GNU tar warns about hdrcharset itself. Such an entry
// keeps its mtime to the second only.
func binaryNames(hdr *tar.Header) {
	if !utf8.ValidString(hdr.Name) || !utf8.ValidString(hdr.Linkname) {
		hdr.Format = tar.FormatGNU
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
	}
}

// header is the common part of an entry's header; Size is 0.
func header(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      int(st.Uid),
		Gid:      int(st.Gid),
		ModTime:  time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:   tar.FormatPAX,
	}
}

// file writes a regular file's header and content.
func (w *Writer) file(e *Entry) (int64, error) {
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
	if !e.root {
		flags |= unix.O_NOFOLLOW // a file swapped for a symlink is not followed
	}
	fd, err := unix.Open(e.Path, flags, 0)
	if err != nil {
		return 0, pathError("open", e.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, pathError("fstat", e.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != e.Stat.Size {
		return 0, &ChangedError{e.Path, fmt.Sprintf("it was %d bytes when the directory was walked and is %d bytes (%s) when archived", e.Stat.Size, st.Size, typeName(st.Mode))}
	}
	hdr := header(e.Name, &st)
	hdr.Size = st.Size
	if w.buf == nil {
		w.buf = make([]byte, 64<<10)
	}
	var n int64
	if segs := dataSegments(fd, &st); segs != nil {
		n, err = w.sparse(hdr, fd, segs, e.Path)
	} else {
		binaryNames(hdr)
		if err := w.tw.WriteHeader(hdr); err != nil {
			return 0, err
		}
		n, err = io.CopyBuffer(w.tw, io.LimitReader(fdReader(fd), st.Size), w.buf)
		if err == nil && n < st.Size {
			err = &ChangedError{e.Path, fmt.Sprintf("it ended after %d of its %d bytes", n, st.Size)}
		}
	}
	if err != nil {
		return 0, err
	}
	var one [1]byte
	if m, _ := unix.Pread(fd, one[:], st.Size); m > 0 {
		return 0, &ChangedError{e.Path, fmt.Sprintf("it grew past its %d bytes", st.Size)}
	}
	return n, nil
}

// segment is a run of a sparse file's data: offset and length in bytes.
type segment struct{ off, len int64 }

// maxSegments bounds a sparse map: a file fragmented into more runs of
// data than this is archived whole.
const maxSegments = 1 << 14

// dataSegments returns the runs of data of the file open at fd when it has
// holes (fewer blocks allocated than its size needs), found with
// lseek(2) SEEK_DATA and SEEK_HOLE; nil when it has none or the file
// system cannot tell. A file that ends in a hole gets a last run of length
// 0 at its end, as GNU tar writes it.
func dataSegments(fd int, st *unix.Stat_t) []segment {
	if st.Size == 0 || st.Blocks*512 >= st.Size {
		return nil
	}
	var segs []segment
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole is left
		}
		if err != nil {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil
		}
		hole = min(hole, st.Size)
		if data >= hole {
			break
		}
		segs = append(segs, segment{data, hole - data})
		if len(segs) > maxSegments {
			return nil
		}
		off = hole
	}
	if len(segs) == 1 && segs[0] == (segment{0, st.Size}) {
		return nil
	}
	if last := len(segs) - 1; last < 0 || segs[last].off+segs[last].len < st.Size {
		segs = append(segs, segment{st.Size, 0})
	}
	return segs
}

// sparse writes a regular file with holes as a pax 1.0 sparse entry (the
// format of GNU tar's --sparse --format=pax): an extended header with
// GNU.sparse.major=1, minor=0, name and realsize, then an entry whose data
// is the sparse map (decimal numbers, one per line: the count of runs,
// then offset and length of each, padded to a block) followed by the runs
// of data. archive/tar reads this format but cannot write it, so the
// headers are encoded here, between the entries tw writes.
func (w *Writer) sparse(hdr *tar.Header, fd int, segs []segment, file string) (int64, error) {
	m := strconv.AppendInt(nil, int64(len(segs)), 10)
	m = append(m, '\n')
	var data int64
	for _, s := range segs {
		m = strconv.AppendInt(m, s.off, 10)
		m = append(m, '\n')
		m = strconv.AppendInt(m, s.len, 10)
		m = append(m, '\n')
		data += s.len
	}
	m = append(m, make([]byte, blockPadding(int64(len(m))))...)
	size := int64(len(m)) + data

	recs := map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     hdr.Name,
		"GNU.sparse.realsize": strconv.FormatInt(hdr.Size, 10),
		"mtime":               paxTime(hdr.ModTime),
	}
	if !utf8.ValidString(hdr.Name) {
		recs["hdrcharset"] = "BINARY"
	}
	if size > maxOctal(12) {
		recs["size"] = strconv.FormatInt(size, 10)
	}
	if int64(hdr.Uid) > maxOctal(8) {
		recs["uid"] = strconv.Itoa(hdr.Uid)
	}
	if int64(hdr.Gid) > maxOctal(8) {
		recs["gid"] = strconv.Itoa(hdr.Gid)
	}
	var ext []byte
	keys := make([]string, 0, len(recs))
	for k := range recs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ext = append(ext, paxRecord(k, recs[k])...)
	}
	dir, base := path.Split(hdr.Name)
	mtime := hdr.ModTime.Unix()
	if err := w.tw.Flush(); err != nil {
		return 0, err
	}
	if err := w.raw(ustarHeader(path.Join(dir, "PaxHeaders.0", base), tar.TypeXHeader, 0o644, 0, 0, int64(len(ext)), mtime), ext); err != nil {
		return 0, err
	}
	if err := w.raw(ustarHeader(path.Join(dir, "GNUSparseFile.0", base), tar.TypeReg, hdr.Mode, int64(hdr.Uid), int64(hdr.Gid), size, mtime), m); err != nil {
		return 0, err
	}
	for _, s := range segs {
		for off := s.off; off < s.off+s.len; {
			k := min(int64(len(w.buf)), s.off+s.len-off)
			n, err := unix.Pread(fd, w.buf[:k], off)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return 0, pathError("read", file, err)
			}
			if n == 0 {
				return 0, &ChangedError{file, fmt.Sprintf("it ended at %d of its %d bytes", off, hdr.Size)}
			}
			if _, err := w.out.Write(w.buf[:n]); err != nil {
				return 0, err
			}
			off += int64(n)
		}
	}
	_, err := w.out.Write(zeroBlock[:blockPadding(data)])
	return data, err
}

// raw writes a header block and data padded to a whole block.
func (w *Writer) raw(hdr *[blockSize]byte, data []byte) error {
	if _, err := w.out.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.out.Write(data); err != nil {
		return err
	}
	_, err := w.out.Write(zeroBlock[:blockPadding(int64(len(data)))])
	return err
}

const blockSize = 512

var zeroBlock [blockSize]byte

func blockPadding(n int64) int64 { return -n & (blockSize - 1) }

// maxOctal is the largest value a ustar numeric field of width bytes
// holds: width-1 octal digits and a NUL.
func maxOctal(width int) int64 { return 1<<(3*(width-1)) - 1 }

// ustarHeader encodes a ustar header block (POSIX ustar: name and prefix,
// octal numeric fields, "ustar\x00" magic, version "00", checksum). A name
// that fits neither field nor a prefix/name split is cut: the pax records
// before it carry the real one. Numbers that do not fit are written as 0,
// likewise carried by pax records.
func ustarHeader(name string, typeflag byte, mode, uid, gid, size, mtime int64) *[blockSize]byte {
	var b [blockSize]byte
	prefix := ""
	if len(name) > 100 {
		for i := len(name) - 1; i > 0; i-- {
			if name[i] == '/' && i <= 155 && len(name)-i-1 <= 100 {
				prefix, name = name[:i], name[i+1:]
				break
			}
		}
	}
	copy(b[0:100], name)
	octal(b[100:108], mode)
	octal(b[108:116], uid)
	octal(b[116:124], gid)
	octal(b[124:136], size)
	octal(b[136:148], mtime)
	b[156] = typeflag
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[345:500], prefix)
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return &b
}

// octal writes v into field as zero-padded octal digits and a NUL, or
// zeros when it does not fit.
func octal(field []byte, v int64) {
	if v < 0 || v > maxOctal(len(field)) {
		v = 0
	}
	copy(field, fmt.Sprintf("%0*o\x00", len(field)-1, v))
}

// paxRecord formats one pax extended header record: "LEN key=value\n",
// where LEN counts the whole record, itself included.
func paxRecord(k, v string) string {
	size := len(k) + len(v) + 3 // space, '=', newline
	size += len(strconv.Itoa(size))
	rec := strconv.Itoa(size) + " " + k + "=" + v + "\n"
	if len(rec) != size {
		size = len(rec)
		rec = strconv.Itoa(size) + " " + k + "=" + v + "\n"
	}
	return rec
}

// paxTime formats t as pax does: seconds since the epoch with a fraction
// of up to nine digits.
func paxTime(t time.Time) string {
	sec, nsec := t.Unix(), int64(t.Nanosecond())
	if nsec == 0 {
		return strconv.FormatInt(sec, 10)
	}
	sign := ""
	if sec < 0 {
		sign, sec, nsec = "-", -(sec + 1), 1e9-nsec
	}
	frac := fmt.Sprintf("%09d", nsec)
	for frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	return fmt.Sprintf("%s%d.%s", sign, sec, frac)
}

// fdReader reads from a file descriptor.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(f), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// typeName names a file type for messages.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "char device"
	case unix.S_IFBLK:
		return "block device"
	}
	return "file of unknown type"
}
