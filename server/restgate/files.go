package restgate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/inproc"
)

// chunkBytes is the size of the chunks an upload body is sent to berthd
// in: WriteFile and Upload take chunks of at most 2 MiB.
const chunkBytes = 1 << 20

// sandboxVar fills a request's sandbox_id from the path.
var sandboxVar = map[string]string{"sandbox_id": "sandbox_id"}

// readFile serves GET .../files/content?path=P[&offsetBytes=&limitBytes=]:
// ReadFile's bytes as the body, application/octet-stream, with the
// Content-Length of ReadFile's header, sent before the first byte. A read
// that fails after it (ABORTED FILE_CHANGED: the file changed while it was
// read) cuts the connection: the caller gets fewer bytes than
// Content-Length said, never a short file passed off as whole.
func (h *Handler) readFile(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	req := &berthv1.ReadFileRequest{}
	if err := fromQuery(r, req, sandboxVar); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(callContext(r))
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(conn).ReadFile(ctx, req)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return fmt.Errorf("ReadFile's first message is not its header")
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatUint(hdr.GetLengthBytes(), 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	return h.copyOut(w, r, func() ([]byte, bool, error) {
		m, err := stream.Recv()
		return m.GetChunk(), false, err
	})
}

// download serves GET .../files/archive?path=DIR[&compression=&includeRoot=]:
// Download's tar archive as the body (application/x-tar, or
// application/gzip with compression=COMPRESSION_GZIP), its length unknown
// beforehand (chunked on HTTP/1.1). A failure after the first byte cuts
// the connection, as readFile's.
func (h *Handler) download(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	req := &berthv1.DownloadRequest{}
	if err := fromQuery(r, req, sandboxVar); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(callContext(r))
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(conn).Download(ctx, req)
	if err != nil {
		return err
	}
	// The first message before the answer's status: a refusal (a missing
	// sandbox or directory) is an HTTP error, not a cut body.
	first, err := stream.Recv()
	if err != nil && err != io.EOF {
		return err
	}
	typ := "application/x-tar"
	if req.GetCompression() == berthv1.Compression_COMPRESSION_GZIP {
		typ = "application/gzip"
	}
	w.Header().Set("Content-Type", typ)
	w.WriteHeader(http.StatusOK)
	if err == io.EOF || r.Method == http.MethodHead {
		return nil
	}
	pending := first
	return h.copyOut(w, r, func() ([]byte, bool, error) {
		m := pending
		if m == nil {
			var err error
			if m, err = stream.Recv(); err != nil {
				return nil, false, err
			}
		}
		pending = nil
		return m.GetChunk(), m.GetSummary() != nil, nil
	})
}

// copyOut writes the chunks next returns to w until it returns io.EOF (or
// last); any other error is logged and cuts the connection
// (http.ErrAbortHandler), as the status line went out already. A client
// that stops reading for the handler's stall fails the write: the call
// ends, and so does the connection.
func (h *Handler) copyOut(w http.ResponseWriter, r *http.Request, next func() (chunk []byte, last bool, err error)) error {
	sw := h.stallWriter(w)
	for {
		b, last, err := next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if r.Context().Err() == nil {
				h.log.Info("raw download cut: the call failed after its first byte", slog.String("path", r.URL.Path), slog.Any("error", err))
			}
			panic(http.ErrAbortHandler)
		}
		if _, err := sw.Write(b); err != nil {
			return nil // the caller went away or stalled: nothing to answer
		}
		if last {
			return nil
		}
	}
}

// writeFile serves PUT .../files/content?path=P[&mode=&createParents=&writeMode=&wantSha256=]:
// the request body is the file's content, sent on in chunks as it
// arrives. The file is stored (WRITE_MODE_REPLACE: renamed into place)
// only once the whole body arrived: a body with a Content-Length gives
// WriteFile its size_bytes, so a shorter one stores nothing, and a body
// cut off (its connection lost, a chunked body without its last chunk)
// cancels the call, which stores nothing either. The answer is
// WriteFileResponse as JSON.
func (h *Handler) writeFile(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	hdr := &berthv1.WriteFileHeader{}
	if err := fromQuery(r, hdr, sandboxVar); err != nil {
		return err
	}
	if r.ContentLength >= 0 {
		n := uint64(r.ContentLength)
		hdr.SizeBytes = &n
	}
	ctx, cancel := context.WithCancel(callContext(r))
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(conn).WriteFile(ctx)
	if err != nil {
		return err
	}
	resp, err := sendBody(h.stallReader(w, r), cancel, stream, &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Header{Header: hdr}},
		func(b []byte) *berthv1.WriteFileRequest {
			return &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Chunk{Chunk: b}}
		})
	if err != nil {
		return err
	}
	return writeJSON(w, resp)
}

// upload serves PUT .../files/archive?path=DIR[&compression=&keepOwners=]:
// the request body is a tar archive Upload extracts into DIR, atomically
// (nothing moves into place unless the whole archive arrived and was
// extracted). The answer is UploadResponse as JSON.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	hdr := &berthv1.UploadHeader{}
	if err := fromQuery(r, hdr, sandboxVar); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(callContext(r))
	defer cancel()
	stream, err := berthv1.NewFileServiceClient(conn).Upload(ctx)
	if err != nil {
		return err
	}
	resp, err := sendBody(h.stallReader(w, r), cancel, stream, &berthv1.UploadRequest{Part: &berthv1.UploadRequest_Header{Header: hdr}},
		func(b []byte) *berthv1.UploadRequest {
			return &berthv1.UploadRequest{Part: &berthv1.UploadRequest_Chunk{Chunk: b}}
		})
	if err != nil {
		return err
	}
	return writeJSON(w, resp)
}

// clientStream is a client stream's sending half.
type clientStream[Req, Resp any] interface {
	Send(*Req) error
	CloseAndRecv() (*Resp, error)
}

// sendBody sends header, then r's body in chunks of at most chunkBytes
// (chunk makes a message of one), then closes the stream and returns the
// answer. A body that fails before its end (its client went away, or sent
// nothing for the stall of body) cancels the call (cancel) rather than
// closing it: the write is not committed. berthd ending the call early
// (a refusal) stops the copy; its status is the error.
func sendBody[Req, Resp any](body io.Reader, cancel context.CancelFunc, stream clientStream[Req, Resp], header *Req, chunk func([]byte) *Req) (*Resp, error) {
	if err := stream.Send(header); err != nil {
		_, err = stream.CloseAndRecv()
		return nil, err
	}
	buf := make([]byte, chunkBytes)
	for {
		n, rerr := fill(body, buf)
		if n > 0 {
			// gRPC marshals the message before Send returns: buf can
			// be reused.
			if err := stream.Send(chunk(buf[:n])); err != nil {
				_, err = stream.CloseAndRecv()
				return nil, err
			}
		}
		if rerr == io.EOF {
			return stream.CloseAndRecv()
		}
		if rerr != nil {
			cancel()
			return nil, rpcstatus.Error(codes.Canceled, rpcstatus.ReasonCanceled,
				fmt.Sprintf("the request body ended before its end (%v): nothing was stored", rerr), nil)
		}
	}
}

// fill reads from body until buf is full or the body ends (io.EOF) or
// fails.
func fill(body io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := body.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeJSON answers m as JSON (protobuf's JSON mapping), 200.
func writeJSON(w http.ResponseWriter, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(append(b, '\n')) //nolint:errcheck // the caller may be gone
	return nil
}
