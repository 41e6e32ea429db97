// Package restgate serves the REST routes that vanguard's transcoder
// cannot (docs/http.md, "Files as raw bodies" and "Streams as JSON
// lines"): sandbox files and tar archives as raw HTTP bodies, streamed
// both ways, and the server streams (StartExec, AttachExec, ListDir,
// WatchFiles) as newline-delimited JSON.
//
// vanguard (v0.4) carries a REST body raw only for methods whose messages
// are google.api.HttpBody, and a REST server stream only of HttpBody; an
// error after the first byte of such a stream is dropped (the body just
// ends, a cut file passed off as whole). So berthd serves these routes
// itself: each request makes its call to berthd's own gRPC server in
// process (server/inproc), with the request's Authorization header as the
// call's, so authentication, ownership, admission, limits and typed errors
// are those of the gRPC call. Errors are google.rpc.Status JSON with the
// HTTP status of the code, as vanguard's REST errors are.
package restgate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/inproc"
	"github.com/berth-sandbox/berth/server/rawcap"
)

// Handler serves routes. Other paths are not its: Match
// tells them apart.
type Handler struct {
	srv   http.Handler
	log   *slog.Logger
	stall time.Duration
	mux   *http.ServeMux
}

// DefaultStall is New's stall when it is given none.
const DefaultStall = time.Minute

// routes are the handler's method and path patterns (http.ServeMux
// syntax), as docs/http.md lists them.
var routes = []string{
	"GET /v1/sandboxes/{sandbox_id}/files/content",
	"PUT /v1/sandboxes/{sandbox_id}/files/content",
	"GET /v1/sandboxes/{sandbox_id}/files/archive",
	"PUT /v1/sandboxes/{sandbox_id}/files/archive",
	"GET /v1/sandboxes/{sandbox_id}/files/list",
	"POST /v1/sandboxes/{sandbox_id}/execs",
	"GET /v1/sandboxes/{sandbox_id}/execs/{exec_id}/events",
	"GET /v1/sandboxes/{sandbox_id}/watch",
}

// New returns the Handler whose calls go to srv, berthd's gRPC server (a
// *grpc.Server's ServeHTTP). log receives the in-process HTTP/2 server's
// errors. stall (0: DefaultStall) is the longest a request waits on its
// client: for a write of at most stallWriteBytes of its answer to be
// taken, or for the next bytes of its body; past it the call ends and the
// connection is closed.
//
// The raw file routes' calls are marked for server/rawcap, which caps
// how many of them one principal has open.
func New(srv http.Handler, log *slog.Logger, stall time.Duration) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if stall <= 0 {
		stall = DefaultStall
	}
	h := &Handler{srv: srv, log: log, stall: stall, mux: http.NewServeMux()}
	serve := []func(http.ResponseWriter, *http.Request, *inproc.Conn) error{
		h.readFile, h.writeFile, h.download, h.upload, h.listDir, h.startExec, h.attachExec, h.watchFiles,
	}
	raw := []bool{true, true, true, true, false, false, false, false}
	for i, pattern := range routes {
		serve, raw := serve[i], raw[i]
		h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if raw {
				r = r.WithContext(rawcap.Mark(r.Context(), r.PathValue("sandbox_id")))
			}
			h.call(w, r, serve)
		})
	}
	return h
}

// Match reports whether r is for one of the routes, method included.
func (h *Handler) Match(r *http.Request) bool {
	if path.Clean(r.URL.Path) != r.URL.Path {
		return false
	}
	_, pattern := h.mux.Handler(r)
	return pattern != ""
}

// ServeHTTP serves a request that Match accepted.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// call dials berthd in process for r and runs serve; an error serve
// returns before it wrote anything is answered as a google.rpc.Status.
func (h *Handler) call(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request, *inproc.Conn) error) {
	conn, err := inproc.Dial(r.Context(), h.srv, inproc.RemoteAddr(r), inproc.LocalAddr(r), slog.NewLogLogger(h.log.Handler(), slog.LevelDebug))
	if err != nil {
		writeError(w, fmt.Errorf("in-process connection to berthd: %w", err))
		return
	}
	defer conn.Close()
	if err := serve(w, r, conn); err != nil {
		writeError(w, err)
	}
}

// stallWriteBytes is the most one write to the client waits for under one
// stall deadline: a client is cut when it takes less than this in a
// whole stall, never for reading a large answer slowly.
const stallWriteBytes = 32 << 10

// stallWriter writes to an HTTP response with a write deadline of stall
// before each stallWriteBytes, so that a client that stops reading ends
// the write (and its connection) within about stall.
type stallWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
}

func (h *Handler) stallWriter(w http.ResponseWriter) *stallWriter {
	return &stallWriter{w: w, rc: http.NewResponseController(w), stall: h.stall}
}

// Write writes b in pieces of at most stallWriteBytes, each under a fresh
// deadline; a deadline past fails the write.
func (s *stallWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		piece := b[:min(len(b), stallWriteBytes)]
		s.deadline()
		m, err := s.w.Write(piece)
		n += m
		if err != nil {
			return n, err
		}
		b = b[len(piece):]
	}
	return n, nil
}

// Flush sends what the response buffers, under a fresh deadline.
func (s *stallWriter) Flush() error {
	s.deadline()
	return s.rc.Flush()
}

func (s *stallWriter) deadline() {
	// http.ErrNotSupported: a writer without deadlines (a test's
	// recorder); nothing to bound.
	s.rc.SetWriteDeadline(time.Now().Add(s.stall)) //nolint:errcheck // see above
}

// stallReader reads a request body with a read deadline of stall before
// each read, so that a client that stops sending ends the read.
type stallReader struct {
	r     io.Reader
	rc    *http.ResponseController
	stall time.Duration
}

func (h *Handler) stallReader(w http.ResponseWriter, r *http.Request) *stallReader {
	return &stallReader{r: r.Body, rc: http.NewResponseController(w), stall: h.stall}
}

func (s *stallReader) Read(b []byte) (int, error) {
	s.rc.SetReadDeadline(time.Now().Add(s.stall)) //nolint:errcheck // as stallWriter's
	return s.r.Read(b)
}

// callContext is r's context with its Authorization header as the call's,
// its berth-no-resume headers (internal/resume), each value, so that a
// call on a paused sandbox is refused as over gRPC, and a header given
// twice is refused there too, and its traceparent and tracestate.
func callContext(r *http.Request) context.Context {
	ctx := r.Context()
	if a := r.Header.Get("Authorization"); a != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
	}
	// berth-no-resume, and W3C Trace Context (traceparent, tracestate:
	// https://www.w3.org/TR/trace-context/) so that the call's span joins
	// the caller's trace as a gRPC call's does.
	for _, h := range []string{resume.Header, "traceparent", "tracestate"} {
		for _, v := range r.Header.Values(h) {
			ctx = metadata.AppendToOutgoingContext(ctx, h, v)
		}
	}
	return ctx
}

// writeError answers err as a google.rpc.Status JSON body (protobuf's JSON
// mapping, details with their "@type") with the HTTP status of its code.
func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	if errors.Is(err, context.Canceled) {
		st = status.New(codes.Canceled, err.Error())
	}
	b, merr := protojson.Marshal(st.Proto())
	if merr != nil {
		b = []byte(`{"code":13,"message":"the error could not be encoded"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(httpStatus(st.Code()))
	w.Write(append(b, '\n')) //nolint:errcheck // the caller may be gone
}

// httpStatus is the HTTP status of a gRPC code, as vanguard and Connect
// map them (google/rpc/code.proto's table).
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// invalid is INVALID_ARGUMENT naming field.
func invalid(field, description string) error {
	return rpcstatus.InvalidArgument(field, description)
}

// needJSON refuses a POST whose body is not declared application/json:
// a browser sends another site a POST without one, or text/plain, with
// no CORS preflight (the Fetch standard's simple requests) and with the
// client certificate it holds for berthd.
func needJSON(r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return invalid("Content-Type", fmt.Sprintf("%s %s: the body must be Content-Type application/json, not %q", r.Method, r.URL.Path, r.Header.Get("Content-Type")))
	}
	return nil
}

// readAll reads a JSON request body of at most max bytes.
func readAll(body io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, invalid("body", fmt.Sprintf("the request body is over %d bytes", max))
	}
	return b, nil
}
