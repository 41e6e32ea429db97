// Package filesvc is berth.v1.FileService: each request goes to the
// sandbox's agent, which does the file work in the sandbox's mount
// namespace as the workload user (see Service); for ReadFile of a runc
// sandbox berthd reads the file the agent opened itself (direct.go).
package filesvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Service implements berth.v1.FileService by forwarding each request to
// the sandbox's agent, which does the file work in the sandbox's mount
// namespace as the workload user. berthd validates the sandbox id and the
// paths (naming the public fields), passes paths on as bytes, and relays
// data chunks as they are on the wire (relayDown, relayUp) and statuses
// as they are. With WithDirectReads, berthd reads a runc sandbox's file
// for ReadFile itself from the descriptor its agent opened (readDirect).
type Service struct {
	berthv1.UnimplementedFileServiceServer
	reach  reacher
	agents agentFiles
	obs    observer
	direct directReads
}

// directReads is what readDirect needs: fds takes an agent's descriptor
// (nil: every read goes through the agent), log says why one was
// refused, slots holds a place for each direct read under way
// (maxDirectReads).
type directReads struct {
	fds   descriptors
	log   *slog.Logger
	slots chan struct{}
}

// Option configures New.
type Option func(*Service)

// WithDirectReads lets ReadFile read a runc sandbox's file from the
// descriptor its agent opened, taken with fds (*runtime.Runtime), instead
// of through the agent's stream; log receives why a descriptor was
// refused.
func WithDirectReads(fds descriptors, log *slog.Logger) Option {
	return func(f *Service) {
		f.direct = directReads{fds: fds, log: log, slots: make(chan struct{}, maxDirectReads)}
	}
}

var _ berthv1.FileServiceServer = (*Service)(nil)

// reacher reaches a sandbox's agent before anything is sent to it
// (*agentreach.Reacher).
type reacher interface {
	Reach(ctx context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, apierr.Runtime, error)
}

// agentFiles returns the FileService client of a sandbox's agent
// (*agentconn.Pool, by the agent socket's path).
type agentFiles interface {
	Files(sandboxID string) (agentv1.FileServiceClient, error)
}

// observer counts the bytes moved for metrics (server/metrics).
type observer interface {
	FileBytes(direction string, n int)
	FileReadDirect()
}

// New returns the FileService over reach and agents.
func New(reach reacher, agents agentFiles, obs observer, opts ...Option) *Service {
	f := &Service{reach: reach, agents: agents, obs: obs}
	for _, o := range opts {
		o(f)
	}
	return f
}

// filesFor returns the FileService client of a running sandbox's agent,
// once the agent answered within the connect budget as for an exec (see
// reach): a stopped or hung agent is SANDBOX_UNREACHABLE with nothing sent,
// not a request that hangs until the caller's deadline.
func (f *Service) filesFor(ctx context.Context, sandboxID string) (agentv1.FileServiceClient, error) {
	files, _, err := f.reachFiles(ctx, sandboxID)
	return files, err
}

// reachFiles is filesFor, which also returns the runtime Reach found (its
// task's host pid).
func (f *Service) reachFiles(ctx context.Context, sandboxID string) (agentv1.FileServiceClient, apierr.Runtime, error) {
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return nil, apierr.Runtime{}, err
	}
	telemetry.Annotate(ctx, sandboxID, "")
	_, rt, err := f.reach.Reach(ctx, sandboxID, "")
	if err != nil {
		return nil, apierr.Runtime{}, apierr.WithMeta(err, map[string]string{"sandbox_id": sandboxID})
	}
	files, err := f.agents.Files(sandboxID)
	if err != nil {
		return nil, apierr.Runtime{}, apierr.WithMeta(err, map[string]string{"sandbox_id": sandboxID})
	}
	return files, rt, nil
}

// fail converts an error from the agent (or the caller's stream) to the
// status returned.
func (f *Service) fail(ctx context.Context, sandboxID string, err error) error {
	return apierr.WithMeta(agentreach.AgentError(sandboxID, err), map[string]string{"sandbox_id": sandboxID})
}

// location returns a request's path as bytes: text (the string form, field
// `<prefix>path`) or raw (`<prefix>path_bytes`), whichever is set. It must
// be absolute and hold no NUL byte.
func location(prefix, text string, raw []byte) ([]byte, error) {
	field, p := prefix+"path", []byte(text)
	if text == "" {
		field, p = prefix+"path_bytes", raw
	}
	switch {
	case len(p) == 0:
		return nil, apierr.InvalidArgument(prefix+"path", "is empty: give "+prefix+"path or "+prefix+"path_bytes")
	case p[0] != '/':
		return nil, apierr.InvalidArgument(field, "must be an absolute path inside the sandbox (starting with /)")
	case bytes.IndexByte(p, 0) >= 0:
		return nil, apierr.InvalidArgument(field, "contains a NUL byte; Linux paths cannot")
	case len(p) > validate.MaxPathBytes:
		return nil, apierr.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d (PATH_MAX)", len(p), validate.MaxPathBytes))
	}
	return p, nil
}

// ReadFile forwards a read and its chunks; for a runc sandbox it reads
// the file from the descriptor the agent opened when it can (readDirect),
// with the same answer.
func (f *Service) ReadFile(req *berthv1.ReadFileRequest, stream berthv1.FileService_ReadFileServer) error {
	ctx := stream.Context()
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return err
	}
	// Taken first, so that a request's descriptor never waits in its
	// connection's queue for another request.
	dest := f.destination(ctx, req.GetSandboxId(), req)
	if dest >= 0 {
		defer unix.Close(dest)
	}
	files, rt, err := f.reachFiles(ctx, req.GetSandboxId())
	if err != nil {
		return err
	}
	areq := &agentv1.ReadFileRequest{Path: path, OffsetBytes: req.GetOffsetBytes(), LimitBytes: req.GetLimitBytes()}
	if f.direct.fds != nil && f.direct.fds.TakesFDs(ctx, req.GetSandboxId(), rt.TaskPID) {
		select {
		case f.direct.slots <- struct{}{}:
			done, err := f.readDirect(ctx, files, req.GetSandboxId(), rt.TaskPID, areq, dest, stream)
			<-f.direct.slots
			if done {
				return err
			}
		default:
		}
	}
	up, err := files.ReadFile(ctx, areq, wire.CallOption())
	if err != nil {
		return f.fail(ctx, req.GetSandboxId(), err)
	}
	if err := relayDown(up, stream, readChunk, f.moved("out"), readPart); err != nil {
		return f.fail(ctx, req.GetSandboxId(), err)
	}
	return nil
}

// readPart converts the agent's ReadFile messages other than chunks.
func readPart(fr *wire.Frame) (proto.Message, error) {
	var msg agentv1.ReadFileResponse
	if err := fr.Decode(&msg); err != nil {
		return nil, err
	}
	switch part := msg.GetPart().(type) {
	case *agentv1.ReadFileResponse_Header:
		return &berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: part.Header}}, nil
	case *agentv1.ReadFileResponse_Chunk:
		return &berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Chunk{Chunk: part.Chunk}}, nil
	}
	return nil, nil
}

// The chunk fields of the file streams have the same number in berth.v1
// and berth.agent.v1 (TestChunkFields): berthd relays a chunk message as
// it is on the wire (a wire.Frame), without decoding and encoding it.
var (
	readChunk     = wire.ChunkField(&berthv1.ReadFileResponse{})
	writeChunk    = wire.ChunkField(&berthv1.WriteFileRequest{})
	uploadChunk   = wire.ChunkField(&berthv1.UploadRequest{})
	downloadChunk = wire.ChunkField(&berthv1.DownloadResponse{})
)

// relayDown sends what the agent's stream up yields to the caller's stream
// down until up ends: a chunk message (field chunk) as it came, any other
// message through convert, which decodes it and returns the message to
// send, or nil to send none. The agent's messages are untrusted input: a
// frame is relayed undecoded only when it is exactly one bytes field, the
// chunk, of the length the frame holds.
// moved counts the bytes of each chunk relayed (metrics).
func relayDown(up grpc.ClientStream, down grpc.ServerStream, chunk protoreflect.FieldNumber, moved func(int), convert func(*wire.Frame) (proto.Message, error)) error {
	var fr wire.Frame
	defer fr.Free()
	for {
		if err := up.RecvMsg(&fr); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if n, ok := fr.Chunk(chunk); ok {
			moved(n)
			if err := down.SendMsg(&fr); err != nil {
				return err
			}
			continue
		}
		msg, err := convert(&fr)
		if err != nil {
			return err
		}
		if msg != nil {
			if err := down.SendMsg(msg); err != nil {
				return err
			}
		}
	}
}

// clientStream is the caller's side of WriteFile and Upload, whose header
// recvHeader receives.
type clientStream[Req any] interface {
	Recv() (Req, error)
}

// relayUp sends the chunks the caller sends after its header to the
// agent's stream up, until the caller closes its side: a chunk message
// (field chunk) as it came, any other message decoded by chunkOf, which
// returns its chunk, or false for a header, and encoded again. It returns
// io.EOF-free errors: the caller's (its stream broke, it sent a second
// header or a malformed message) or errAgentEnded when the agent ended the
// stream first (its status then says why).
// moved counts the bytes of each chunk relayed (metrics).
func relayUp(in grpc.ServerStream, up grpc.ClientStream, chunk protoreflect.FieldNumber, moved func(int), chunkOf func(*wire.Frame) ([]byte, bool, error)) error {
	var fr wire.Frame
	defer fr.Free()
	for {
		if err := in.RecvMsg(&fr); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n, ok := fr.Chunk(chunk)
		if !ok {
			data, ok, err := chunkOf(&fr)
			if err != nil {
				return apierr.InvalidArgument("chunk", "is not a valid message: "+err.Error())
			}
			if !ok {
				return apierr.InvalidArgument("header", "only chunks may follow the header")
			}
			if len(data) == 0 {
				continue
			}
			fr.Fill(chunk, len(data), func(p []byte) (int, error) { return copy(p, data), nil })
			n = len(data)
		}
		moved(n)
		if err := up.SendMsg(&fr); err != nil {
			if errors.Is(err, io.EOF) {
				return errAgentEnded
			}
			return err
		}
	}
}

// fileHeader is what the headers of WriteFile and Upload share.
type fileHeader interface {
	comparable
	GetSandboxId() string
	GetPath() string
	GetPathBytes() []byte
}

// recvHeader receives the first message of a WriteFile or Upload stream,
// which must be its header, and resolves the header's path and the
// sandbox's agent. It fails with INVALID_ARGUMENT naming "header" when the
// stream ends first or starts with a chunk.
func recvHeader[Req any, H fileHeader](f *Service, ctx context.Context, in clientStream[Req], header func(Req) H) (h H, path []byte, files agentv1.FileServiceClient, err error) {
	first, err := in.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return h, nil, nil, apierr.InvalidArgument("header", "the stream ended before the header")
		}
		return h, nil, nil, err
	}
	var none H
	if h = header(first); h == none {
		return h, nil, nil, apierr.InvalidArgument("header", "the first message must be the header")
	}
	if path, err = location("header.", h.GetPath(), h.GetPathBytes()); err != nil {
		return h, nil, nil, err
	}
	files, err = f.filesFor(ctx, h.GetSandboxId())
	return h, path, files, err
}

// moved returns the counter of file content bytes moving in direction
// ("in" to the sandbox, "out" of it) for relayUp and relayDown.
func (f *Service) moved(direction string) func(int) {
	return func(n int) { f.obs.FileBytes(direction, n) }
}

// errAgentEnded means the agent ended a client stream early.
var errAgentEnded = errors.New("the agent ended the stream")

// WriteFile forwards a write: header, chunks, then the agent's answer,
// which comes only when the data is on disk. When the caller's stream
// breaks, the agent's stream is canceled and the agent stores nothing.
func (f *Service) WriteFile(stream berthv1.FileService_WriteFileServer) error {
	ctx := stream.Context()
	h, path, files, err := recvHeader(f, ctx, stream, (*berthv1.WriteFileRequest).GetHeader)
	if err != nil {
		return err
	}
	agentCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := files.WriteFile(agentCtx, wire.CallOption())
	if err != nil {
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	header := &agentv1.WriteFileHeader{Path: path, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, CreateParents: h.GetCreateParents(), WriteMode: h.GetWriteMode(), SizeBytes: h.SizeBytes, WantSha256: h.GetWantSha256()}
	err = up.Send(&agentv1.WriteFileRequest{Part: &agentv1.WriteFileRequest_Header{Header: header}})
	if err == nil {
		err = relayUp(stream, up, writeChunk, f.moved("in"), func(fr *wire.Frame) ([]byte, bool, error) {
			var m berthv1.WriteFileRequest
			err := fr.Decode(&m)
			return m.GetChunk(), m.GetHeader() == nil, err
		})
	}
	if err != nil && !errors.Is(err, errAgentEnded) && !errors.Is(err, io.EOF) {
		cancel() // the agent removes what it wrote
		if rpcstatus.Reason(err) != "" {
			return err
		}
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	resp, err := up.CloseAndRecv()
	if err != nil {
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	return stream.SendAndClose(resp.GetResult())
}

// Stat forwards a stat.
func (f *Service) Stat(ctx context.Context, req *berthv1.StatRequest) (*berthv1.StatResponse, error) {
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return nil, err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp, err := files.Stat(ctx, &agentv1.StatRequest{Path: path})
	if err != nil {
		return nil, f.fail(ctx, req.GetSandboxId(), err)
	}
	return &berthv1.StatResponse{Info: resp.GetInfo()}, nil
}

// ListDir forwards a listing's batches.
func (f *Service) ListDir(req *berthv1.ListDirRequest, stream berthv1.FileService_ListDirServer) error {
	ctx := stream.Context()
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return err
	}
	up, err := files.ListDir(ctx, &agentv1.ListDirRequest{Path: path, MaxDepth: req.GetMaxDepth()})
	if err != nil {
		return f.fail(ctx, req.GetSandboxId(), err)
	}
	for {
		msg, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return f.fail(ctx, req.GetSandboxId(), err)
		}
		if err := stream.Send(msg.GetBatch()); err != nil {
			return f.fail(ctx, req.GetSandboxId(), err)
		}
	}
}

// MakeDir forwards a mkdir.
func (f *Service) MakeDir(ctx context.Context, req *berthv1.MakeDirRequest) (*berthv1.MakeDirResponse, error) {
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return nil, err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp, err := files.MakeDir(ctx, &agentv1.MakeDirRequest{Path: path, Mode: req.Mode, Parents: req.GetParents()})
	if err != nil {
		return nil, f.fail(ctx, req.GetSandboxId(), err)
	}
	return &berthv1.MakeDirResponse{Info: resp.GetInfo()}, nil
}

// Remove forwards a remove.
func (f *Service) Remove(ctx context.Context, req *berthv1.RemoveRequest) (*berthv1.RemoveResponse, error) {
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return nil, err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if _, err := files.Remove(ctx, &agentv1.RemoveRequest{Path: path, Recursive: req.GetRecursive()}); err != nil {
		return nil, f.fail(ctx, req.GetSandboxId(), err)
	}
	return &berthv1.RemoveResponse{}, nil
}

// Rename forwards a rename.
func (f *Service) Rename(ctx context.Context, req *berthv1.RenameRequest) (*berthv1.RenameResponse, error) {
	from, err := location("from_", req.GetFromPath(), req.GetFromPathBytes())
	if err != nil {
		return nil, err
	}
	to, err := location("to_", req.GetToPath(), req.GetToPathBytes())
	if err != nil {
		return nil, err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if _, err := files.Rename(ctx, &agentv1.RenameRequest{FromPath: from, ToPath: to, Overwrite: req.GetOverwrite()}); err != nil {
		return nil, f.fail(ctx, req.GetSandboxId(), err)
	}
	return &berthv1.RenameResponse{}, nil
}

// Upload forwards an archive to extract.
func (f *Service) Upload(stream berthv1.FileService_UploadServer) error {
	ctx := stream.Context()
	h, path, files, err := recvHeader(f, ctx, stream, (*berthv1.UploadRequest).GetHeader)
	if err != nil {
		return err
	}
	agentCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := files.Upload(agentCtx, wire.CallOption())
	if err != nil {
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	err = up.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: path, Compression: h.GetCompression(), KeepOwners: h.GetKeepOwners()}}})
	if err == nil {
		err = relayUp(stream, up, uploadChunk, f.moved("in"), func(fr *wire.Frame) ([]byte, bool, error) {
			var m berthv1.UploadRequest
			err := fr.Decode(&m)
			return m.GetChunk(), m.GetHeader() == nil, err
		})
	}
	if err != nil && !errors.Is(err, errAgentEnded) && !errors.Is(err, io.EOF) {
		cancel()
		if rpcstatus.Reason(err) != "" {
			return err
		}
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	resp, err := up.CloseAndRecv()
	if err != nil {
		return f.fail(ctx, h.GetSandboxId(), err)
	}
	return stream.SendAndClose(resp.GetResult())
}

// Download forwards an archive's chunks and summary.
func (f *Service) Download(req *berthv1.DownloadRequest, stream berthv1.FileService_DownloadServer) error {
	ctx := stream.Context()
	path, err := location("", req.GetPath(), req.GetPathBytes())
	if err != nil {
		return err
	}
	files, err := f.filesFor(ctx, req.GetSandboxId())
	if err != nil {
		return err
	}
	up, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path, Compression: req.GetCompression(), IncludeRoot: req.GetIncludeRoot()}, wire.CallOption())
	if err != nil {
		return f.fail(ctx, req.GetSandboxId(), err)
	}
	err = relayDown(up, stream, downloadChunk, f.moved("out"), func(fr *wire.Frame) (proto.Message, error) {
		var msg agentv1.DownloadResponse
		if err := fr.Decode(&msg); err != nil {
			return nil, err
		}
		switch part := msg.GetPart().(type) {
		case *agentv1.DownloadResponse_Chunk:
			return &berthv1.DownloadResponse{Part: &berthv1.DownloadResponse_Chunk{Chunk: part.Chunk}}, nil
		case *agentv1.DownloadResponse_Summary:
			return &berthv1.DownloadResponse{Part: &berthv1.DownloadResponse_Summary{Summary: part.Summary}}, nil
		}
		return nil, nil
	})
	if err != nil {
		return f.fail(ctx, req.GetSandboxId(), err)
	}
	return nil
}
