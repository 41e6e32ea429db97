package files

import (
	"compress/gzip"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Download archives a directory's contents (with include_root, the
// directory itself first, as "./"), or one file, as a pax tar stream, as
// the workload user, with tartree. The tree is walked twice, not
// following symlinks: first counting entries and content bytes, so that the
// caps are checked before any byte is sent, then writing each entry as it
// is reached, so that the agent holds one entry at a time, not the tree.
// Each regular file is opened (O_NOFOLLOW), its header written from
// fstat(2) and exactly that many bytes copied, or the stream fails with
// FILE_CHANGED.
func (s *Service) Download(req *agentv1.DownloadRequest, stream agentv1.FileService_DownloadServer) error {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return err
	}
	if err := s.agentOwn("path", path, true); err != nil {
		return err
	}
	c := req.GetCompression()
	switch c {
	case berthv1.Compression_COMPRESSION_UNSPECIFIED, berthv1.Compression_COMPRESSION_NONE, berthv1.Compression_COMPRESSION_GZIP:
	default:
		return invalid("compression", fmt.Sprintf("unknown compression %d", c))
	}
	return s.toStatus(s.asUser(func() error {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return pathError("stat", path, err)
		}
		if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
			return &notRegularError{path, typeName(st.Mode)}
		}
		walk := tartree.WalkOptions{IncludeRoot: req.GetIncludeRoot()}
		count := &download{s: s, root: path, walk: walk, seen: make(map[devIno]bool)}
		if err := tartree.Walk(path, walk, count.count); err != nil {
			return err
		}
		d := &download{s: s, root: path, walk: walk, seen: make(map[devIno]bool)}
		return d.send(stream, c == berthv1.Compression_COMPRESSION_GZIP)
	}))
}

type devIno struct{ dev, ino uint64 }

// download is one pass of a Download walk.
type download struct {
	s     *Service
	root  string
	walk  tartree.WalkOptions
	n     int             // entries walked
	total uint64          // content bytes walked, each multiply-linked file once
	seen  map[devIno]bool // multiply-linked files walked
}

// count takes e into the entry and content caps; on the sending pass a cap
// is crossed only when the tree grew since it was counted.
func (d *download) count(e *tartree.Entry) error {
	if d.n >= d.s.cfg.MaxListEntries {
		return &tooLargeError{path: d.root, what: fmt.Sprintf("an archive of more than %d entries", d.s.cfg.MaxListEntries), limit: uint64(d.s.cfg.MaxListEntries), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
	}
	d.n++
	if e.IsRegular() {
		key := devIno{e.Stat.Dev, e.Stat.Ino}
		if e.Stat.Nlink <= 1 || !d.seen[key] {
			d.total += uint64(e.Stat.Size)
		}
		if e.Stat.Nlink > 1 {
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
	tw := tartree.NewWriter(w)
	summary := &berthv1.DownloadSummary{}
	skip := func(e *tartree.Entry, _ string) { summary.Skipped = append(summary.Skipped, []byte(e.Name)) }
	walk := d.walk
	walk.Skip = skip
	err := tartree.Walk(d.root, walk, func(e *tartree.Entry) error {
		if err := d.count(e); err != nil {
			return err
		}
		n, err := tw.Add(e)
		if err != nil {
			return err
		}
		summary.Entries++
		summary.ContentBytes += uint64(n)
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
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
	summary.ArchiveBytes = out.n
	return stream.Send(&agentv1.DownloadResponse{Part: &agentv1.DownloadResponse_Summary{Summary: summary}})
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
