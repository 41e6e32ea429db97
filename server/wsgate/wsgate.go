// Package wsgate serves terminals and port forwards to browsers over
// WebSocket (RFC 6455) on berthd's listeners, beside gRPC, Connect and
// gRPC-Web (docs/http.md, "WebSocket").
//
// A WebSocket session is one Exec with a terminal (TerminalPath) or one
// PortForward (PortForwardPath). Its calls go to berthd's own gRPC server
// in process (through the net/http path Connect calls take), so they are
// authenticated, owned, limited and answered with typed errors exactly as
// gRPC calls are. The caller's credentials are those of the upgrade
// request (a bearer token in its Authorization header, a client
// certificate, a unix socket peer's uid) or a bearer token in the first
// message, which a browser, unable to set headers on a WebSocket, sends
// there; never in the URL, which proxies and servers log.
//
// Browsers send an Origin header, and a browser sends its client
// certificate to any page's WebSocket: a session is refused (403 before
// the upgrade) when its Origin is not the host it asks (same origin), or
// one of Config.AllowedOrigins. A request without an Origin header is not
// a browser's and is let in.
package wsgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/inproc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The endpoints' paths.
const (
	TerminalPath    = "/ws/v1/terminal"
	PortForwardPath = "/ws/v1/port-forward"
)

// Subprotocol is the WebSocket subprotocol the endpoints speak; a client
// may ask for it (Sec-WebSocket-Protocol) or ask for none.
const Subprotocol = "berth.v1"

// Config configures a Handler.
type Config struct {
	// AllowedOrigins are host patterns (path.Match syntax, e.g.
	// "console.example.com" or "*.example.com") of the browser origins
	// allowed besides the same origin. Default: none.
	AllowedOrigins []string
	// HelloTimeout bounds the wait for a session's first message. Default
	// 10 s.
	HelloTimeout time.Duration
	// MaxMessageBytes is the largest message a client may send (stdin,
	// port data, control); a larger one ends the session with close code
	// 1009. Default 64 KiB.
	MaxMessageBytes int64
	// WriteStall is the longest a message to the client may wait to be
	// taken; a client that stops reading for longer has its session
	// ended and its connection closed. Default 1 min.
	WriteStall time.Duration
	// Log receives what goes wrong with a session outside its calls.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.HelloTimeout == 0 {
		c.HelloTimeout = 10 * time.Second
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 64 << 10
	}
	if c.WriteStall == 0 {
		c.WriteStall = time.Minute
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Handler serves TerminalPath and PortForwardPath.
type Handler struct {
	cfg Config
	srv http.Handler
}

// New returns the Handler whose sessions call srv, berthd's gRPC server
// (a *grpc.Server's ServeHTTP).
func New(srv http.Handler, cfg Config) *Handler {
	return &Handler{cfg: cfg.withDefaults(), srv: srv}
}

// ServeHTTP upgrades a request for one of the endpoints to a WebSocket
// and serves the session; other paths get 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var serve func(ctx context.Context, s *session) error
	switch r.URL.Path {
	case TerminalPath:
		serve = h.terminal
	case PortForwardPath:
		serve = h.portForward
	default:
		http.NotFound(w, r)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:   []string{Subprotocol},
		OriginPatterns: h.cfg.AllowedOrigins,
	})
	if err != nil {
		// Accept answered already: 403 for a foreign origin, 400 or 426
		// for a request that is not a WebSocket upgrade.
		return
	}
	ws.SetReadLimit(h.cfg.MaxMessageBytes)
	ctx := r.Context()
	ip, err := inproc.Dial(ctx, h.srv, inproc.RemoteAddr(r), inproc.LocalAddr(r), slog.NewLogLogger(h.cfg.Log.Handler(), slog.LevelDebug))
	if err != nil {
		h.cfg.Log.Error("WebSocket session: in-process connection to berthd", slog.Any("error", err))
		ws.Close(websocket.StatusInternalError, "berthd could not serve the session")
		return
	}
	defer ip.Close()
	s := &session{ws: ws, ip: ip, header: r.Header.Get("Authorization"), stall: h.cfg.WriteStall, pumpErr: make(chan error, 1)}
	err = serve(ctx, s)
	s.finish(ctx, err)
	s.wg.Wait()
}

// session is one WebSocket and the in-process connection of its calls.
type session struct {
	ws     *websocket.Conn
	ip     *inproc.Conn
	header string // the upgrade request's Authorization header
	stall  time.Duration

	wg       sync.WaitGroup // pump's goroutine
	pumpErr  chan error     // why pump stopped
	finished sync.Once
}

// pump reads the client's messages in a goroutine until the connection
// ends or handle fails, handing each to handle; then it records why it
// stopped (callEnded) and cancels the session's call.
func (s *session) pump(ctx context.Context, cancelCall context.CancelFunc, handle func(websocket.MessageType, []byte) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancelCall()
		for {
			typ, b, err := s.ws.Read(ctx)
			if err == nil {
				err = handle(typ, b)
			}
			if err != nil {
				s.pumpErr <- err
				return
			}
		}
	}()
}

// callEnded returns what ends the session when its call failed with err:
// the client's doing when pump stopped first (a close, a bad message),
// else err.
func (s *session) callEnded(err error) error {
	select {
	case perr := <-s.pumpErr:
		return perr
	default:
		return err
	}
}

// control is a text message a client sends after the first.
type control struct {
	// Type is "resize", "signal" or "closeStdin" on a terminal; "eof" on a
	// port forward.
	Type   string `json:"type"`
	Rows   uint32 `json:"rows"`   // resize
	Cols   uint32 `json:"cols"`   // resize
	Signal string `json:"signal"` // signal: "INT", "SIGTERM", ...
}

// readControl decodes a text message b.
func readControl(b []byte) (control, error) {
	var c control
	if err := json.Unmarshal(b, &c); err != nil {
		return c, invalidArgument(fmt.Sprintf("a text message must be a JSON control message: %v", err))
	}
	return c, nil
}

// hello is the fields every session's first message may carry.
type hello struct {
	// Token is a bearer token; it overrides the upgrade request's
	// Authorization header.
	Token string `json:"token"`
	// SandboxID names the sandbox.
	SandboxID string `json:"sandboxId"`
}

// readHello reads the session's first message, a JSON text message, into
// v within timeout. Past it the session is finished at once with 4004
// (a context deadline on the read would close the connection without a
// close frame saying why).
func (s *session) readHello(ctx context.Context, timeout time.Duration, v any) error {
	late := rpcstatus.Error(codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded,
		fmt.Sprintf("no first message within %v: a session starts with a JSON text message naming what to open (docs/http.md, WebSocket)", timeout), nil)
	timer := time.AfterFunc(timeout, func() { s.finish(ctx, late) })
	typ, b, err := s.ws.Read(ctx)
	if !timer.Stop() {
		return late
	}
	if err != nil {
		return err
	}
	if typ != websocket.MessageText {
		return invalidArgument("the first message must be a JSON text message naming what to open, not binary")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return invalidArgument(fmt.Sprintf("the first message is not valid JSON: %v", err))
	}
	return nil
}

// callContext returns ctx with the session's credentials as outgoing
// metadata: the first message's token, else the upgrade request's
// Authorization header, else nothing (the connection's identity).
func (s *session) callContext(ctx context.Context, token string) context.Context {
	switch {
	case token != "":
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	case s.header != "":
		return metadata.AppendToOutgoingContext(ctx, "authorization", s.header)
	}
	return ctx
}

// sendJSON writes v as a text message.
func (s *session) sendJSON(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.write(ctx, websocket.MessageText, b)
}

// write writes one message, waiting at most the session's stall for the
// client to take it (past it the WebSocket is closed).
func (s *session) write(ctx context.Context, typ websocket.MessageType, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.stall)
	defer cancel()
	return s.ws.Write(ctx, typ, b)
}

// ErrorMessage is the last text message of a session that failed, before
// its close frame.
type ErrorMessage struct {
	Type string `json:"type"` // "error"
	// Code is the gRPC code's name in Connect's spelling: "not_found",
	// "unauthenticated", ...
	Code string `json:"code"`
	// Reason is the ErrorInfo reason (docs/errors.md): "SANDBOX_NOT_FOUND".
	Reason string `json:"reason,omitempty"`
	// Message says what failed and why.
	Message string `json:"message"`
}

// closeCodeBase is added to a gRPC code to make a session's close code:
// 4000-4999 are the codes RFC 6455 leaves to applications; 4005 is
// NOT_FOUND, 4016 UNAUTHENTICATED.
const closeCodeBase = 4000

// finish ends the session once (later calls do nothing): with err nil,
// close code 1000; else an ErrorMessage and close code closeCodeBase +
// the gRPC code, whose reason text is "REASON: message" cut to the 123
// bytes a close frame holds. A session the client closed or whose
// connection broke gets no more.
func (s *session) finish(ctx context.Context, err error) {
	s.finished.Do(func() { s.close(ctx, err) })
}

func (s *session) close(ctx context.Context, err error) {
	if err == nil {
		s.ws.Close(websocket.StatusNormalClosure, "")
		return
	}
	if websocket.CloseStatus(err) != -1 || errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
		s.ws.CloseNow()
		return
	}
	st := status.Convert(err)
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	msg := ErrorMessage{Type: "error", Code: connect.Code(st.Code()).String(), Reason: reason, Message: st.Message()}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if s.sendJSON(wctx, msg) != nil {
		s.ws.CloseNow()
		return
	}
	text := st.Message()
	if reason != "" {
		text = reason + ": " + text
	}
	s.ws.Close(websocket.StatusCode(closeCodeBase+int(st.Code())), cut(text, 123))
}

// cut returns s cut to at most n bytes, on a UTF-8 boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// invalidArgument is a session's own refusal of what the client sent.
func invalidArgument(msg string) error {
	return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, msg, nil)
}
