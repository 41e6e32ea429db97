package files

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Download archives a directory's contents (or one file) as a pax tar
// stream, as the workload user. The tree is walked twice, not following
// symlinks: first counting entries and content bytes, so that the caps are
// checked before any byte is sent, then writing each entry as it is
// reached, so that the agent holds one entry at a time, not the tree. Each
// regular file is opened (O_NOFOLLOW), its header written from fstat(2)
// and exactly that many bytes copied, or the stream fails with
// FILE_CHANGED.
func (s *Service) Download(req *agentv1.DownloadRequest, stream agentv1.FileService_DownloadServer) error {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return err
	}
	c := req.GetCompression()
	switch c {
	case berthv1.Compression_COMPRESSION_UNSPECIFIED, berthv1.Compression_COMPRESSION_NONE, berthv1.Compression_COMPRESSION_GZIP:
	default:
		return invalid("compression", fmt.Sprintf("unknown compression %d", c))
	}
	return s.toStatus(s.asUser(func() error {
		count := &download{s: s, root: path, seen: make(map[devIno]bool)}
		if err := count.walkRoot(count.count); err != nil {
			return err
		}
		d := &download{s: s, root: path, seen: make(map[devIno]bool)}
		return d.send(stream, c == berthv1.Compression_COMPRESSION_GZIP)
	}))
}

type devIno struct{ dev, ino uint64 }

// download is one pass of a Download walk.
type download struct {
	s       *Service
	root    string
	n       int             // entries walked
	total   uint64          // content bytes walked, each multiply-linked file once
	seen    map[devIno]bool // multiply-linked files walked
	skipped [][]byte

	// The sending pass.
	tw      *tar.Writer
	linked  map[devIno]string // first name archived of each multiply-linked file
	summary *berthv1.DownloadSummary
	copyBuf []byte // file contents move through it: one read(2) per chunk, not per 32 KiB
}

type dlEntry struct {
	rel    string // name in the archive
	full   string // path in the sandbox
	st     unix.Stat_t
	target string // symlink target
	single bool   // the downloaded path is this file
}

// walkRoot walks what is to be archived, calling visit for each entry in
// archive order.
func (d *download) walkRoot(visit func(*dlEntry) error) error {
	var st unix.Stat_t
	if err := unix.Stat(d.root, &st); err != nil {
		return pathError("stat", d.root, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return &notRegularError{d.root, typeName(st.Mode)}
		}
		return visit(&dlEntry{rel: filepath.Base(d.root), full: d.root, st: st, single: true})
	}
	fd, err := unix.Open(d.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("open directory", d.root, err)
	}
	return d.walk(fd, "", visit)
}

func (d *download) walk(fd int, rel string, visit func(*dlEntry) error) error {
	defer unix.Close(fd)
	dir := filepath.Join(d.root, rel)
	names, err := readDirNames(fd)
	if err != nil {
		return pathError("read directory", dir, err)
	}
	sortBytes(names)
	for _, name := range names {
		e := &dlEntry{rel: filepath.Join(rel, name), full: filepath.Join(dir, name)}
		if err := unix.Fstatat(fd, name, &e.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed since it was read
		}
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFSOCK:
			d.skipped = append(d.skipped, []byte(e.rel))
			continue
		case unix.S_IFLNK:
			if e.target, err = readlink(fd, name); err != nil {
				return pathError("readlink", e.full, err)
			}
		}
		if err := visit(e); err != nil {
			return err
		}
		if e.st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return pathError("open directory", e.full, err)
			}
			if err := d.walk(sub, e.rel, visit); err != nil {
				return err
			}
		}
	}
	return nil
}

// count takes e into the entry and content caps; on the sending pass a cap
// is crossed only when the tree grew since it was counted.
func (d *download) count(e *dlEntry) error {
	if d.n >= d.s.cfg.MaxListEntries {
		return &tooLargeError{path: d.root, what: fmt.Sprintf("an archive of more than %d entries", d.s.cfg.MaxListEntries), limit: uint64(d.s.cfg.MaxListEntries), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
	}
	d.n++
	if e.st.Mode&unix.S_IFMT == unix.S_IFREG {
		key := devIno{e.st.Dev, e.st.Ino}
		if e.st.Nlink <= 1 || !d.seen[key] {
			d.total += uint64(e.st.Size)
		}
		if e.st.Nlink > 1 {
			d.seen[key] = true
		}
	}
	if limit := d.s.cfg.MaxArchiveBytes; d.total > limit {
		return &tooLargeError{path: d.root, what: fmt.Sprintf("an archive of %d content bytes", d.total), limit: limit, reason: rpcstatus.ReasonFileTooLarge, flag: "max-archive-bytes"}
	}
	return nil
}

// send walks again and writes the archive to the stream as it goes.
func (d *download) send(stream agentv1.FileService_DownloadServer, compress bool) error {
	out := &chunkSender{send: func(b []byte) error {
		return stream.Send(&agentv1.DownloadResponse{Part: &agentv1.DownloadResponse_Chunk{Chunk: b}})
	}}
	var w io.Writer = out
	var zw *gzip.Writer
	if compress {
		zw = gzip.NewWriter(out)
		w = zw
	}
	d.tw = tar.NewWriter(w)
	d.linked = make(map[devIno]string)
	d.summary = &berthv1.DownloadSummary{}
	err := d.walkRoot(func(e *dlEntry) error {
		if err := d.count(e); err != nil {
			return err
		}
		n, err := d.entry(e)
		if err != nil {
			return err
		}
		d.summary.Entries++
		d.summary.ContentBytes += n
		return nil
	})
	if err != nil {
		return err
	}
	if err := d.tw.Close(); err != nil {
		return err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return err
		}
	}
	if err := out.flush(); err != nil {
		return err
	}
	d.summary.ArchiveBytes = out.n
	d.summary.Skipped = d.skipped
	return stream.Send(&agentv1.DownloadResponse{Part: &agentv1.DownloadResponse_Summary{Summary: d.summary}})
}

// entry writes one entry and returns the content bytes it carried.
func (d *download) entry(e *dlEntry) (uint64, error) {
	tw, linked := d.tw, d.linked
	hdr := header(e.rel, &e.st)
	switch e.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
		return 0, tw.WriteHeader(hdr)
	case unix.S_IFLNK:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.target
		return 0, tw.WriteHeader(hdr)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return 0, tw.WriteHeader(hdr)
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if e.st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(e.st.Rdev)), int64(unix.Minor(e.st.Rdev))
		return 0, tw.WriteHeader(hdr)
	}
	key := devIno{e.st.Dev, e.st.Ino}
	if first, ok := linked[key]; ok && e.st.Nlink > 1 {
		hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		return 0, tw.WriteHeader(hdr)
	}
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
	if !e.single {
		flags |= unix.O_NOFOLLOW // a file swapped for a symlink is not followed
	}
	fd, err := unix.Open(e.full, flags, 0)
	if err != nil {
		return 0, pathError("open", e.full, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, pathError("fstat", e.full, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != e.st.Size {
		return 0, &changedError{e.full, fmt.Sprintf("it was %d bytes when the directory was walked and is %d bytes (%s) when archived", e.st.Size, st.Size, typeName(st.Mode))}
	}
	hdr = header(e.rel, &st)
	if e.st.Nlink > 1 {
		linked[key] = e.rel
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	if d.copyBuf == nil {
		d.copyBuf = make([]byte, chunkBytes)
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(fdReader(fd), st.Size), d.copyBuf)
	if err != nil {
		return 0, err
	}
	if n < st.Size {
		return 0, &changedError{e.full, fmt.Sprintf("it ended after %d of its %d bytes", n, st.Size)}
	}
	var one [1]byte
	if m, _ := unix.Pread(fd, one[:], st.Size); m > 0 {
		return 0, &changedError{e.full, fmt.Sprintf("it grew past its %d bytes", st.Size)}
	}
	return uint64(n), nil
}

// header is the common part of an entry's tar header. Ownership is
// numeric; names of users are not looked up.
func header(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      int(st.Uid),
		Gid:      int(st.Gid),
		Size:     st.Size,
		ModTime:  time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:   tar.FormatPAX,
	}
}

// chunkSender buffers writes into chunks of at most chunkBytes and sends
// them.
type chunkSender struct {
	send func([]byte) error
	buf  []byte
	n    uint64 // bytes sent
}

func (c *chunkSender) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if c.buf == nil {
			c.buf = make([]byte, 0, chunkBytes)
		}
		k := min(len(p), chunkBytes-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == chunkBytes {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

func (c *chunkSender) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	// Send marshals before returning, so the buffer can be reused.
	err := c.send(c.buf)
	c.n += uint64(len(c.buf))
	c.buf = c.buf[:0]
	return err
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
