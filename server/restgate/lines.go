package restgate

import (
	"context"
	"io"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/inproc"
)

// maxJSONBody bounds a JSON request body (a StartExecRequest with its
// argv and env): gRPC's default message cap.
const maxJSONBody = 4 << 20

// startExec serves POST .../execs: the body is a StartExecRequest as JSON
// (sandboxId from the path), the answer StartExec's events as JSON lines.
func (h *Handler) startExec(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	if err := needJSON(r); err != nil {
		return err
	}
	body, err := readAll(h.stallReader(w, r), maxJSONBody)
	if err != nil {
		return err
	}
	req := &berthv1.StartExecRequest{}
	if len(body) > 0 {
		if err := protojson.Unmarshal(body, req); err != nil {
			return invalid("body", err.Error())
		}
	}
	req.SandboxId = r.PathValue("sandbox_id")
	return serveLines(h.stallWriter(w), r, func(ctx context.Context) (grpc.ServerStreamingClient[berthv1.ExecResponse], error) {
		return berthv1.NewSandboxServiceClient(conn).StartExec(ctx, req)
	})
}

// attachExec serves GET .../execs/{exec_id}/events[?sinceSeq=N]:
// AttachExec's events as JSON lines.
func (h *Handler) attachExec(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	req := &berthv1.AttachExecRequest{}
	if err := fromQuery(r, req, map[string]string{"sandbox_id": "sandbox_id", "exec_id": "exec_id"}); err != nil {
		return err
	}
	return serveLines(h.stallWriter(w), r, func(ctx context.Context) (grpc.ServerStreamingClient[berthv1.ExecResponse], error) {
		return berthv1.NewSandboxServiceClient(conn).AttachExec(ctx, req)
	})
}

// listDir serves GET .../files/list?path=DIR[&maxDepth=N]:
// ListDir's batches as JSON lines.
func (h *Handler) listDir(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	req := &berthv1.ListDirRequest{}
	if err := fromQuery(r, req, sandboxVar); err != nil {
		return err
	}
	return serveLines(h.stallWriter(w), r, func(ctx context.Context) (grpc.ServerStreamingClient[berthv1.ListDirResponse], error) {
		return berthv1.NewFileServiceClient(conn).ListDir(ctx, req)
	})
}

// watchFiles serves GET .../watch?path=DIR[&recursive=true...]:
// WatchFiles' events as JSON lines, until the caller goes away.
func (h *Handler) watchFiles(w http.ResponseWriter, r *http.Request, conn *inproc.Conn) error {
	req := &berthv1.WatchFilesRequest{}
	if err := fromQuery(r, req, sandboxVar); err != nil {
		return err
	}
	return serveLines(h.stallWriter(w), r, func(ctx context.Context) (grpc.ServerStreamingClient[berthv1.WatchFilesResponse], error) {
		return berthv1.NewSandboxServiceClient(conn).WatchFiles(ctx, req)
	})
}

// serveLines answers a server stream as newline-delimited JSON
// (application/x-ndjson): each message in protobuf's JSON mapping on one
// line, flushed as it comes. A call refused before its first message is
// an HTTP error with a google.rpc.Status body; one that fails later ends
// the body with the line {"error": <google.rpc.Status>} (the status line
// went out already), so a stream that ends without it ended OK. A client
// that stops reading for w's stall ends the call and its connection.
func serveLines[T any, PT interface {
	*T
	proto.Message
}](w *stallWriter, r *http.Request, open func(context.Context) (grpc.ServerStreamingClient[T], error)) error {
	ctx, cancel := context.WithCancel(callContext(r))
	defer cancel()
	stream, err := open(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil && err != io.EOF {
		return err
	}
	w.w.Header().Set("Content-Type", "application/x-ndjson")
	w.w.Header().Set("X-Content-Type-Options", "nosniff")
	w.w.WriteHeader(http.StatusOK)
	for m := first; err == nil; m, err = stream.Recv() {
		b, merr := protojson.Marshal(PT(m))
		if merr != nil {
			return nil
		}
		if _, werr := w.Write(append(b, '\n')); werr != nil {
			return nil // the caller went away
		}
		if w.Flush() != nil {
			return nil
		}
	}
	if err != io.EOF {
		b, merr := protojson.Marshal(status.Convert(err).Proto())
		if merr == nil {
			w.Write([]byte(`{"error":` + string(b) + "}\n")) //nolint:errcheck // the caller may be gone
		}
	}
	return nil
}
