package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// fileChunkBytes is the size of the chunks WriteFile and Upload send (the
// API allows up to 2 MiB): just under 1 MiB, so that a chunk's message
// fits grpc-go's 1 MiB buffer-pool tier (see agent/files.chunkBytes).
const fileChunkBytes = 1<<20 - 16

// Reason tokens of file operations; Error.Metadata["path"] names the path
// (invalid UTF-8 bytes escaped as \xNN).
const (
	ReasonFileNotFound      = "FILE_NOT_FOUND"        // NOT_FOUND: the path or a parent is missing
	ReasonFileExists        = "FILE_EXISTS"           // ALREADY_EXISTS: the target exists and may not be replaced
	ReasonNotADirectory     = "NOT_A_DIRECTORY"       // FAILED_PRECONDITION: a path component is not a directory
	ReasonIsADirectory      = "IS_A_DIRECTORY"        // FAILED_PRECONDITION: a file operation names a directory
	ReasonDirectoryNotEmpty = "DIRECTORY_NOT_EMPTY"   // FAILED_PRECONDITION: a non-recursive remove of a non-empty directory
	ReasonFileTooLarge      = "FILE_TOO_LARGE"        // FAILED_PRECONDITION: a size cap of the agent is exceeded
	ReasonPermissionDenied  = "PERMISSION_DENIED"     // PERMISSION_DENIED: the workload user may not
	ReasonFileChanged       = "FILE_CHANGED"          // ABORTED: the file changed while it was read; what was written is incomplete
	ReasonTarEntryUnsafe    = "TAR_ENTRY_UNSAFE"      // INVALID_ARGUMENT: an archive entry would escape its directory; Metadata["entry"] names it
	ReasonTarEntryInvalid   = "TAR_ENTRY_UNSUPPORTED" // INVALID_ARGUMENT: an archive entry of a type berth does not extract
	ReasonArchiveInvalid    = "ARCHIVE_INVALID"       // INVALID_ARGUMENT: the upload is not a readable tar (or gzip) stream
	ReasonNotRegularFile    = "NOT_A_REGULAR_FILE"    // FAILED_PRECONDITION: a read or write of a device, FIFO or socket
	ReasonListTooLarge      = "LIST_TOO_LARGE"        // FAILED_PRECONDITION: a listing, download or upload has more entries than the agent's cap
	ReasonSymlinkLoop       = "SYMLINK_LOOP"          // FAILED_PRECONDITION: too many symlinks in the path
	ReasonCrossDevice       = "CROSS_DEVICE"          // FAILED_PRECONDITION: a rename across file systems
	ReasonReadOnlyFS        = "READ_ONLY_FILESYSTEM"  // FAILED_PRECONDITION: the file system is read-only
	ReasonFileBusy          = "FILE_BUSY"             // FAILED_PRECONDITION: the path is in use, e.g. a mount point
	ReasonNoSpace           = "NO_SPACE"              // RESOURCE_EXHAUSTED: the file system is full
	// ReasonWorkloadUserUnavailable (FAILED_PRECONDITION): the agent cannot
	// act as the sandbox's workload user; nothing was done.
	ReasonWorkloadUserUnavailable = "WORKLOAD_USER_UNAVAILABLE"
	// ReasonFileRefused (FAILED_PRECONDITION): the file or its file system
	// refuses the operation as asked, e.g. a /proc file that takes only
	// aligned reads (EINVAL) or a device without data (ENXIO);
	// Error.Metadata["errno"] names the errno.
	ReasonFileRefused = "FILE_OPERATION_REFUSED"
)

// FileOption configures the file transfers: WriteFile, ReadFile, Upload
// and Download. Each says which it applies to.
type FileOption func(*fileConfig)

type fileConfig struct {
	progress func(bytes uint64)
	header   berthv1.WriteFileHeader
	offset   uint64
	limit    uint64
	gzip     bool
	owners   bool
	root     bool
}

// WithTransferProgress has a transfer call fn after each chunk, with the
// number of content bytes (archive bytes for Upload and Download) moved so
// far. fn runs on the calling goroutine. All transfers.
func WithTransferProgress(fn func(bytes uint64)) FileOption {
	return func(c *fileConfig) { c.progress = fn }
}

// WithMode sets a written file's permission bits (at most 07777, applied
// exactly). WriteFile; default: the replaced file's mode, or 0644.
func WithMode(mode uint32) FileOption {
	return func(c *fileConfig) { c.header.Mode = &mode }
}

// WithOwner makes uid and gid own a written file instead of the sandbox's
// workload user. WriteFile.
func WithOwner(uid, gid uint32) FileOption {
	return func(c *fileConfig) { c.header.Uid, c.header.Gid = &uid, &gid }
}

// WithCreateParents creates a written file's missing parent directories.
// WriteFile.
func WithCreateParents() FileOption {
	return func(c *fileConfig) { c.header.CreateParents = true }
}

// WithAppend appends to the file instead of replacing it atomically.
// WriteFile.
func WithAppend() FileOption {
	return func(c *fileConfig) { c.header.WriteMode = berthv1.WriteMode_WRITE_MODE_APPEND }
}

// WithSize declares the exact number of bytes the reader yields: berthd
// refuses a size over its cap before any byte moves, and stores nothing
// when the reader yields more or fewer. WriteFile.
func WithSize(n uint64) FileOption {
	return func(c *fileConfig) { c.header.SizeBytes = &n }
}

// WithSHA256 asks berthd for the SHA-256 of the written content, in
// WriteFileResponse.Sha256 (empty without it). WriteFile.
func WithSHA256() FileOption {
	return func(c *fileConfig) { c.header.WantSha256 = true }
}

// WithRange reads limit bytes from offset (limit 0: to the end). ReadFile.
func WithRange(offset, limit uint64) FileOption {
	return func(c *fileConfig) { c.offset, c.limit = offset, limit }
}

// WithGzip sends (Upload) or asks for (Download) a gzip-compressed tar
// stream. Upload also detects gzip by itself.
func WithGzip() FileOption {
	return func(c *fileConfig) { c.gzip = true }
}

// WithKeepOwners gives uploaded entries the archive's numeric owners (and
// keeps setuid and setgid bits) instead of the sandbox's workload user, as
// docker cp --archive does. Upload.
func WithKeepOwners() FileOption {
	return func(c *fileConfig) { c.owners = true }
}

// WithRoot archives a downloaded directory itself first, as the entry
// "./", so that its mode, owner and mtime travel with its contents, as in
// an archive made by tar -C DIR -c . (DownloadRequest.include_root).
// Download; ignored for a file.
func WithRoot() FileOption {
	return func(c *fileConfig) { c.root = true }
}

func fileOptions(opts []FileOption) *fileConfig {
	c := &fileConfig{}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Paths are Go strings, which may hold any bytes: one that is valid UTF-8
// travels as the string field, any other as the bytes field (proto3
// strings must be UTF-8).
func isText(path string) bool { return utf8.ValidString(path) }

// ReadFile copies the file at path in the sandbox to w and returns its
// header: the file's metadata from fstat on the opened file and the length
// of the range read. It returns nil only when w received exactly
// header.LengthBytes bytes; when the file changed while it was read the
// error has ReasonFileChanged and w holds an incomplete copy.
//
// When w is an *os.File of a regular file open for writing (not
// O_APPEND) and the client is connected over berthd's unix socket, the
// file's descriptor goes to berthd with the request and berthd writes
// the bytes into it in the kernel, at and advancing its offset as
// w.Write would (header.WrittenToDestination says so): no byte crosses
// the socket. When berthd does not (another file system type, a gVisor
// sandbox, an older berthd, a gateway), it streams them to w as for any
// other writer.
func (c *Client) ReadFile(ctx context.Context, sandboxID, path string, w io.Writer, opts ...FileOption) (*berthv1.ReadFileHeader, error) {
	cfg := fileOptions(opts)
	req := &berthv1.ReadFileRequest{SandboxId: sandboxID, OffsetBytes: cfg.offset, LimitBytes: cfg.limit}
	if _, ok := w.(*os.File); ok && c.fds != nil && !c.fds.connected() {
		// The descriptor goes on the connection the handshake made: a
		// new client's first call waits for it, as the call would.
		c.awaitConnection(ctx)
	}
	if dest, done := c.fds.destination(w); dest != nil {
		defer done()
		req.Destination = dest
	}
	if isText(path) {
		req.Location = &berthv1.ReadFileRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.ReadFileRequest_PathBytes{PathBytes: []byte(path)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(c.conn).ReadFile(ctx, req, wire.CallOption())
	if err != nil {
		return nil, convertError(err)
	}
	in := wire.Receiver{Field: readChunk}
	defer in.Free()
	var header *berthv1.ReadFileHeader
	var got uint64
	for {
		msg := &berthv1.ReadFileResponse{}
		data, chunk, err := in.Recv(stream.RecvMsg, msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return header, convertError(err)
		}
		if h := msg.GetHeader(); h != nil {
			header = h
			continue
		}
		if !chunk {
			data = msg.GetChunk()
		}
		if header == nil {
			return nil, errors.New("read file: berthd sent data before the header")
		}
		if header.GetWrittenToDestination() {
			return header, errors.New("read file: berthd sent data after writing to the destination")
		}
		if _, err := w.Write(data); err != nil {
			return header, fmt.Errorf("read file %s: write: %w", path, err)
		}
		got += uint64(len(data))
		if cfg.progress != nil {
			cfg.progress(got)
		}
	}
	if header.GetWrittenToDestination() && req.Destination != nil {
		// berthd ended OK: it wrote exactly length_bytes into w.
		got = header.GetLengthBytes()
		if cfg.progress != nil {
			cfg.progress(got)
		}
	}
	if header == nil || got != header.GetLengthBytes() {
		return header, fmt.Errorf("read file %s: got %d bytes, the header promised %d", path, got, header.GetLengthBytes())
	}
	return header, nil
}

// WriteFile stores what r yields at path in the sandbox (by default an
// atomic replace, owned by the workload user) and returns berthd's answer,
// which comes once the data is on disk: the bytes written, and their
// SHA-256 with WithSHA256. When reading r fails the write is abandoned
// (nothing is stored) and the read error is returned wrapped. When ctx
// ends it returns at once (codes.Canceled or DeadlineExceeded), even while
// a Read of r blocks; that Read is left to return in the background.
func (c *Client) WriteFile(ctx context.Context, sandboxID, path string, r io.Reader, opts ...FileOption) (*berthv1.WriteFileResponse, error) {
	cfg := fileOptions(opts)
	h := &cfg.header
	h.SandboxId = sandboxID
	if isText(path) {
		h.Location = &berthv1.WriteFileHeader_Path{Path: path}
	} else {
		h.Location = &berthv1.WriteFileHeader_PathBytes{PathBytes: []byte(path)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(c.conn).WriteFile(ctx, wire.CallOption())
	if err != nil {
		return nil, convertError(err)
	}
	err = sendStreamCtx(ctx, stream, &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Header{Header: h}}, r, cfg.progress, writeChunk)
	if err != nil {
		return nil, fmt.Errorf("write file %s: %w", path, err)
	}
	return resp(stream.CloseAndRecv())
}

func resp[T any](v T, err error) (T, error) { return v, convertError(err) }

// The chunk fields of the file streams' data messages, which the client
// sends and receives as wire.Frames: a chunk is read from the caller's
// reader straight into the buffer gRPC sends it from, and written to the
// caller's writer from the buffers gRPC received it in, without
// protobuf's encode and decode copies.
var (
	readChunk     = wire.ChunkField(&berthv1.ReadFileResponse{})
	writeChunk    = wire.ChunkField(&berthv1.WriteFileRequest{})
	uploadChunk   = wire.ChunkField(&berthv1.UploadRequest{})
	downloadChunk = wire.ChunkField(&berthv1.DownloadResponse{})
)

// sendStreamCtx is sendStream, returning as soon as ctx ends even while a
// Read of r blocks (a pipe, a network body that stalls): the read goes on
// in the background until r returns, and what it yields is dropped; the
// stream is canceled. The caller's reader must not be read by anyone else
// after a canceled call.
func sendStreamCtx[Resp any](ctx context.Context, stream interface {
	SendMsg(any) error
	CloseAndRecv() (Resp, error)
}, first proto.Message, r io.Reader, progress func(uint64), chunk protoreflect.FieldNumber) error {
	done := make(chan error, 1)
	go func() { done <- sendStream(stream, first, r, progress, chunk) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return convertError(status.FromContextError(ctx.Err()).Err())
	}
}

// sendStream sends first, then what r yields in chunk messages of the
// field chunk, and closes the sending side. When berthd ends the stream
// early its status is returned; when reading r fails the stream is
// abandoned by the caller's cancel.
func sendStream[Resp any](stream interface {
	SendMsg(any) error
	CloseAndRecv() (Resp, error)
}, first proto.Message, r io.Reader, progress func(uint64), chunk protoreflect.FieldNumber) error {
	send := func(m any) error {
		err := stream.SendMsg(m)
		if errors.Is(err, io.EOF) {
			// berthd ended the stream; its status says why.
			if _, err = stream.CloseAndRecv(); err == nil {
				err = errors.New("berthd answered before the whole stream was sent")
			}
		}
		return convertError(err)
	}
	if err := send(first); err != nil {
		return err
	}
	var fr wire.Frame
	defer fr.Free()
	var sent uint64
	for {
		n, rerr := fr.Fill(chunk, fileChunkBytes, func(p []byte) (int, error) { return io.ReadFull(r, p) })
		if n > 0 {
			if err := send(&fr); err != nil {
				return err
			}
			sent += uint64(n)
			if progress != nil {
				progress(sent)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read: %w", rerr)
		}
	}
}

// Stat describes path in the sandbox with lstat semantics (a symlink is
// reported as such, with its target).
func (c *Client) Stat(ctx context.Context, sandboxID, path string) (*berthv1.FileInfo, error) {
	req := &berthv1.StatRequest{SandboxId: sandboxID}
	if isText(path) {
		req.Location = &berthv1.StatRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.StatRequest_PathBytes{PathBytes: []byte(path)}
	}
	resp, err := berthv1.NewFileServiceClient(c.conn).Stat(ctx, req)
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetInfo(), nil
}

// ListDir lists the directory at path, maxDepth levels deep (0 and 1: its
// entries only), depth first in byte order, never following symlinks. It
// returns the entries and the subdirectories that could not be listed.
func (c *Client) ListDir(ctx context.Context, sandboxID, path string, maxDepth uint32) ([]*berthv1.FileInfo, []*berthv1.ListDirError, error) {
	req := &berthv1.ListDirRequest{SandboxId: sandboxID, MaxDepth: maxDepth}
	if isText(path) {
		req.Location = &berthv1.ListDirRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.ListDirRequest_PathBytes{PathBytes: []byte(path)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(c.conn).ListDir(ctx, req)
	if err != nil {
		return nil, nil, convertError(err)
	}
	var entries []*berthv1.FileInfo
	var errs []*berthv1.ListDirError
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return entries, errs, nil
		}
		if err != nil {
			return nil, nil, convertError(err)
		}
		entries = append(entries, msg.GetEntries()...)
		errs = append(errs, msg.GetErrors()...)
	}
}

// MakeDir creates the directory path (mode 0755 unless WithMode is given
// among opts), with its missing parents when parents is set.
func (c *Client) MakeDir(ctx context.Context, sandboxID, path string, parents bool, opts ...FileOption) (*berthv1.FileInfo, error) {
	cfg := fileOptions(opts)
	req := &berthv1.MakeDirRequest{SandboxId: sandboxID, Parents: parents, Mode: cfg.header.Mode}
	if isText(path) {
		req.Location = &berthv1.MakeDirRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.MakeDirRequest_PathBytes{PathBytes: []byte(path)}
	}
	resp, err := berthv1.NewFileServiceClient(c.conn).MakeDir(ctx, req)
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetInfo(), nil
}

// Remove removes path in the sandbox: a file, a symlink, an empty
// directory, or a tree when recursive.
func (c *Client) Remove(ctx context.Context, sandboxID, path string, recursive bool) error {
	req := &berthv1.RemoveRequest{SandboxId: sandboxID, Recursive: recursive}
	if isText(path) {
		req.Location = &berthv1.RemoveRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.RemoveRequest_PathBytes{PathBytes: []byte(path)}
	}
	_, err := berthv1.NewFileServiceClient(c.conn).Remove(ctx, req)
	return convertError(err)
}

// Rename renames from to to in the sandbox; an existing target is replaced
// only when overwrite is set.
func (c *Client) Rename(ctx context.Context, sandboxID, from, to string, overwrite bool) error {
	req := &berthv1.RenameRequest{SandboxId: sandboxID, Overwrite: overwrite}
	if isText(from) {
		req.From = &berthv1.RenameRequest_FromPath{FromPath: from}
	} else {
		req.From = &berthv1.RenameRequest_FromPathBytes{FromPathBytes: []byte(from)}
	}
	if isText(to) {
		req.To = &berthv1.RenameRequest_ToPath{ToPath: to}
	} else {
		req.To = &berthv1.RenameRequest_ToPathBytes{ToPathBytes: []byte(to)}
	}
	_, err := berthv1.NewFileServiceClient(c.conn).Rename(ctx, req)
	return convertError(err)
}

// Upload extracts the tar archive r yields (gzip-compressed or not) into
// the directory dir in the sandbox, created when missing, atomically: a
// failed or canceled upload leaves dir as it was. Unsafe entries fail with
// ReasonTarEntryUnsafe naming the entry; entries the sandbox cannot create
// (device nodes) are listed in the response's skipped. When ctx ends it
// returns at once, even while a Read of r blocks, as WriteFile does.
func (c *Client) Upload(ctx context.Context, sandboxID, dir string, r io.Reader, opts ...FileOption) (*berthv1.UploadResponse, error) {
	cfg := fileOptions(opts)
	h := &berthv1.UploadHeader{SandboxId: sandboxID, KeepOwners: cfg.owners}
	if cfg.gzip {
		h.Compression = berthv1.Compression_COMPRESSION_GZIP
	}
	if isText(dir) {
		h.Location = &berthv1.UploadHeader_Path{Path: dir}
	} else {
		h.Location = &berthv1.UploadHeader_PathBytes{PathBytes: []byte(dir)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(c.conn).Upload(ctx, wire.CallOption())
	if err != nil {
		return nil, convertError(err)
	}
	err = sendStreamCtx(ctx, stream, &berthv1.UploadRequest{Part: &berthv1.UploadRequest_Header{Header: h}}, r, cfg.progress, uploadChunk)
	if err != nil {
		return nil, fmt.Errorf("upload to %s: %w", dir, err)
	}
	return resp(stream.CloseAndRecv())
}

// Download writes a tar archive of path in the sandbox to w: a directory's
// contents with names relative to it (and the directory itself as "./"
// with WithRoot), or a single file. It returns the
// summary, which comes only after a complete archive.
func (c *Client) Download(ctx context.Context, sandboxID, path string, w io.Writer, opts ...FileOption) (*berthv1.DownloadSummary, error) {
	cfg := fileOptions(opts)
	req := &berthv1.DownloadRequest{SandboxId: sandboxID, IncludeRoot: cfg.root}
	if cfg.gzip {
		req.Compression = berthv1.Compression_COMPRESSION_GZIP
	}
	if isText(path) {
		req.Location = &berthv1.DownloadRequest_Path{Path: path}
	} else {
		req.Location = &berthv1.DownloadRequest_PathBytes{PathBytes: []byte(path)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(c.conn).Download(ctx, req, wire.CallOption())
	if err != nil {
		return nil, convertError(err)
	}
	in := wire.Receiver{Field: downloadChunk}
	defer in.Free()
	var got uint64
	for {
		msg := &berthv1.DownloadResponse{}
		data, chunk, err := in.Recv(stream.RecvMsg, msg)
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("download %s: the stream ended without a summary after %d bytes", path, got)
		}
		if err != nil {
			return nil, convertError(err)
		}
		if s := msg.GetSummary(); s != nil {
			return s, nil
		}
		if !chunk {
			data = msg.GetChunk()
		}
		if _, err := w.Write(data); err != nil {
			return nil, fmt.Errorf("download %s: write: %w", path, err)
		}
		got += uint64(len(data))
		if cfg.progress != nil {
			cfg.progress(got)
		}
	}
}
