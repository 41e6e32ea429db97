package files

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// maxSkippedListed bounds UploadResponse.skipped.
const maxSkippedListed = 1000

// Upload extracts a tar stream into a directory, as the workload user,
// with tartree.Extract: atomically, through a staging directory, every
// entry resolved beneath the directory. It answers once the tree is
// durable (tartree.Options.Sync: fsync(2) of each file and directory of a
// small archive, syncfs(2) of the file system for a large one). The
// staging directory is recorded while it exists, so that an agent that
// dies mid-upload removes it when it starts again (staging.go).
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
	if err := s.agentOwn("header.path", dir, true); err != nil {
		return err
	}
	switch h.GetCompression() {
	case berthv1.Compression_COMPRESSION_UNSPECIFIED, berthv1.Compression_COMPRESSION_NONE, berthv1.Compression_COMPRESSION_GZIP:
	default:
		return invalid("header.compression", fmt.Sprintf("unknown compression %d", h.GetCompression()))
	}
	chunks := wire.Receiver{Field: uploadChunk}
	defer chunks.Free()
	in := &chunkReader{recv: func() ([]byte, error) {
		var msg agentv1.UploadRequest
		data, chunk, err := chunks.Recv(stream.RecvMsg, &msg)
		if err != nil || chunk {
			return data, err
		}
		if msg.GetHeader() != nil {
			return nil, invalid("header", "only chunks may follow the header")
		}
		return msg.GetChunk(), nil
	}}
	resp := &berthv1.UploadResponse{}
	entries, content := 0, uint64(0)
	var uids, gids idMap
	if h.GetKeepOwners() {
		uids, gids = readIDMap("uid_map"), readIDMap("gid_map")
	}
	opts := tartree.Options{
		Sync: true,
		Check: func(hdr *tar.Header) error {
			// An owner the sandbox's user namespace does not map cannot
			// be given: refused before anything moves into place.
			if uids != nil && hdr.Typeflag != tar.TypeLink && (!uids.maps(hdr.Uid) || !gids.maps(hdr.Gid)) {
				return &tartree.EntryError{Entry: hdr.Name, Why: fmt.Sprintf("has owner %d:%d, which the sandbox's user namespace does not map", hdr.Uid, hdr.Gid)}
			}
			if entries++; entries > s.cfg.MaxListEntries {
				return &tooLargeError{path: dir, what: fmt.Sprintf("an archive of more than %d entries", s.cfg.MaxListEntries), limit: uint64(s.cfg.MaxListEntries), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
			}
			if content += uint64(max(hdr.Size, 0)); content > s.cfg.MaxArchiveBytes {
				return &tooLargeError{path: dir, what: fmt.Sprintf("an archive of more than %d content bytes", s.cfg.MaxArchiveBytes), limit: s.cfg.MaxArchiveBytes, reason: rpcstatus.ReasonFileTooLarge, flag: "max-archive-bytes"}
			}
			// A header's size is what archive/tar yields for the entry, a
			// sparse file's holes included: an archive that cannot fit the
			// sandbox's disk quota stops at the header of the file that
			// would cross it, before its bytes are written.
			if d := s.cfg.DiskBytes; d > 0 && content > d {
				return &quotaError{path: filepath.Join(dir, path.Clean("/"+hdr.Name)), what: fmt.Sprintf("an archive of more than %d content bytes", d), limit: d}
			}
			return nil
		},
		Skip: func(name, _ string) {
			if len(resp.Skipped) < maxSkippedListed {
				resp.Skipped = append(resp.Skipped, []byte(name))
			}
		},
	}
	if h.GetKeepOwners() {
		opts.Chown = s.chownAsAgent
	}
	forget := func() {}
	opts.Staging = func(path string) error {
		forget = s.recordStaging(path)
		return nil
	}
	var counts tartree.Counts
	err = s.asUser(func() error {
		r, closeGzip, err := decompress(in, h.GetCompression())
		if err != nil {
			return err
		}
		defer closeGzip()
		counts, err = tartree.Extract(dir, r, opts)
		return err
	})
	forget()
	if err != nil {
		if in.err != nil && !errors.Is(in.err, io.EOF) {
			return s.toStatus(in.err) // the stream broke, or a protocol error
		}
		return s.toStatus(err)
	}
	// Take whatever follows the archive (tar pads to records), so that the
	// caller's sends all succeed.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return s.toStatus(err)
	}
	resp.Files, resp.Directories, resp.Symlinks, resp.HardLinks = counts.Files, counts.Directories, counts.Symlinks, counts.HardLinks
	resp.SpecialFiles, resp.ContentBytes, resp.SkippedCount = counts.Special, counts.ContentBytes, counts.Skipped
	resp.ArchiveBytes = in.n
	return stream.SendAndClose(&agentv1.UploadResponse{Result: resp})
}

// decompress returns the archive stream of in: gunzipped when compression
// says gzip, or when it is unspecified and the stream starts with gzip's
// magic bytes (RFC 1952 section 2.3.1).
func decompress(in io.Reader, c berthv1.Compression) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(in, 64<<10)
	magic, _ := br.Peek(2)
	isGzip := len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
	if c != berthv1.Compression_COMPRESSION_GZIP && (c != berthv1.Compression_COMPRESSION_UNSPECIFIED || !isGzip) {
		return br, func() {}, nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, nil, archiveError("gzip: " + err.Error())
	}
	return zr, func() { zr.Close() }, nil
}

// chownAsAgent gives the file open at fd an owner and then mode (when not
// zero: chown(2) clears setuid and setgid bits), with the agent's own
// identity (CAP_CHOWN, CAP_FOWNER): it runs on another thread than the
// workload user's of asUser, whose capabilities are gone. The descriptor
// was opened beneath the upload's directory as the workload user.
func (s *Service) chownAsAgent(fd, uid, gid int, mode uint32) error {
	done := make(chan error, 1)
	go func() {
		err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
		if err == nil && mode != 0 {
			err = unix.Fchmod(fd, mode)
		}
		done <- err
	}()
	return <-done
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

// archiveError is an INVALID_ARGUMENT status for an unreadable archive.
func archiveError(why string) error {
	return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonArchiveInvalid, "the upload is not a readable tar archive: "+why, nil)
}
