package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	"github.com/soheilhy/cmux"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/fdpass"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/console"
	"github.com/berth-sandbox/berth/server/restgate"
	"github.com/berth-sandbox/berth/server/wsgate"
)

// ServeConfig configures Serve.
type ServeConfig struct {
	// HTTP also serves Connect (binary and JSON), gRPC-Web and gRPC over
	// HTTP/1.1 on the listener (see Serve). Without it the listener is
	// grpc-go's alone.
	HTTP bool
	// Transport bounds the HTTP connections as it bounds gRPC's (zero
	// fields: TransportConfig's defaults).
	Transport TransportConfig
	// TLS, when set, is the TLS of a TCP listener: berthd makes the
	// handshake before sorting the connection, and the transport
	// credentials of srv take its state (auth.TLSConn).
	TLS *tls.Config
	// Log receives the HTTP server's errors.
	Log *slog.Logger
	// WebSocket configures the terminal and port forward endpoints served
	// with HTTP (server/wsgate: /ws/v1/terminal, /ws/v1/port-forward).
	WebSocket wsgate.Config
	// Console serves the web console (server/console) at /console/ with
	// HTTP. Off by default.
	Console bool
}

// Serve serves srv on lis until srv stops (Stop or GracefulStop), and
// returns srv.Serve's error. With cfg.HTTP, each connection is sorted by
// its first request (docs/http.md): HTTP/2 whose first request has
// content-type application/grpc or application/grpc+<codec> — every gRPC
// client's — goes to srv's own transport, unchanged (no cost on gRPC's
// path); any other (HTTP/1.1; HTTP/2 carrying Connect or gRPC-Web) to
// net/http, where connectrpc.com/vanguard turns Connect and gRPC-Web
// calls into gRPC ones and hands them to srv.ServeHTTP: the same
// interceptors (authentication, routing, the error boundary), handlers and
// message size limits serve every protocol. Bidi calls (Exec,
// PortForward) need HTTP/2: over HTTP/1.1 they are answered 505 "bidi
// streams require HTTP/2".
//
// The sorting reads at most one HTTP/2 frame of 16 KiB at a time, and
// holds a connection that sends nothing for cfg.Transport's
// MaxConnectionIdle, as grpc-go does. On the net/http side the bounds
// are net/http's: MaxHeaderListBytes is the largest request header,
// HandshakeTimeout bounds reading it, MaxConnectionIdle closes an idle
// connection, MaxConcurrentStreams bounds an HTTP/2 connection's streams.
func Serve(srv *grpc.Server, lis net.Listener, cfg ServeConfig) error {
	if !cfg.HTTP {
		return srv.Serve(lis)
	}
	h, err := NewHTTPHandler(srv, cfg)
	if err != nil {
		lis.Close()
		return err
	}
	tc := cfg.Transport.withDefaults()
	if cfg.TLS != nil {
		lis = tlsListener{lis, cfg.TLS}
	}
	m := cmux.New(lis)
	m.SetReadTimeout(tc.MaxConnectionIdle)
	m.HandleError(func(error) bool { return true }) // a connection not sorted is closed; serving goes on
	var settled sync.Map
	grpcL := m.MatchWithWriters(matchGRPC(tc.MaxHeaderListBytes, &settled, tc))
	httpL := m.MatchWithWriters(notFailed(&settled))
	hs := newHTTPServer(h, tc, cfg.Log)
	go m.Serve()
	go hs.Serve(sniffedListener{httpL, &settled})
	err = srv.Serve(sniffedListener{grpcL, &settled})
	// srv stopped: its listener (the root, shared) is closed; HTTP calls in
	// flight were closed by srv's stop (grpc-go closes ServeHTTP's calls).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := hs.Shutdown(ctx); serr != nil {
		hs.Close()
	}
	if errors.Is(err, cmux.ErrListenerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// NewHTTPHandler returns the http.Handler serving srv's services over
// Connect (binary and JSON), gRPC-Web and gRPC, through vanguard's
// transcoder in front of srv.ServeHTTP, with REST routes (restRules); the
// REST routes vanguard cannot serve (server/restgate: files as raw bodies,
// server streams as JSON lines) and the WebSocket endpoints under /ws/
// (cfg.WebSocket), whose calls go to srv in process; and with cfg.Console
// the web console under /console/.
func NewHTTPHandler(srv *grpc.Server, cfg ServeConfig) (http.Handler, error) {
	methods := map[string]bool{}
	for name, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			methods["/"+name+"/"+m.Name] = true
		}
	}
	// The routes of the services srv serves: vanguard refuses a rule
	// naming a method it does not have (a server of some services only,
	// as tests and gateways make).
	var rules []*annotations.HttpRule
	for _, r := range restRules() {
		sel := r.GetSelector()
		if i := strings.LastIndexByte(sel, '.'); i > 0 && methods["/"+sel[:i]+"/"+sel[i+1:]] {
			rules = append(rules, r)
		}
	}
	t, err := vanguardgrpc.NewTranscoder(srv, vanguard.WithRules(rules...))
	if err != nil {
		return nil, fmt.Errorf("HTTP transcoder: %w", err)
	}
	api := connectUnaryByDefault(methods, t)
	if cfg.WebSocket.Log == nil {
		cfg.WebSocket.Log = cfg.Log
	}
	ws := wsgate.New(srv, cfg.WebSocket)
	rest := restgate.New(srv, cfg.Log, cfg.Transport.withDefaults().StreamStall)
	var con http.Handler
	if cfg.Console {
		con = console.Handler()
	}
	// By prefix, not http.ServeMux, which would redirect the API's paths
	// that are not clean rather than hand them on as they are.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case strings.HasPrefix(p, "/ws/"):
			ws.ServeHTTP(w, r)
		case con != nil && (p == "/console" || strings.HasPrefix(p, "/console/")):
			con.ServeHTTP(w, r)
		case strings.HasPrefix(p, "/v1/") && rest.Match(r):
			rest.ServeHTTP(w, r)
		case strings.HasPrefix(p, "/v1/") && r.Method == http.MethodPost && !jsonBody(r):
			refuseRESTBody(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	}), nil
}

// jsonBody reports whether r says its body is JSON (Content-Type
// application/json). vanguard reads a REST body without a Content-Type
// as JSON; a browser sends such a POST, or one of text/plain, cross site
// without asking first (no CORS preflight: the Fetch standard's "simple"
// requests, GET, HEAD and POST only), with the credentials it holds for
// berthd's origin (a client certificate). application/json makes it ask
// first. REST POSTs must say it; DELETE and GET carry no body.
func jsonBody(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// refuseRESTBody answers a REST call whose body is not declared JSON:
// 415, a google.rpc.Status JSON body as the routes' other errors.
func refuseRESTBody(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnsupportedMediaType)
	msg := fmt.Sprintf("%s %s: the body must be Content-Type application/json, not %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	b, _ := json.Marshal(map[string]any{"code": int(codes.InvalidArgument), "message": msg})
	w.Write(b) //nolint:errcheck // the caller may be gone
}

// restRules are the REST routes of the main calls (docs/http.md), as
// google.api.http rules: vanguard transcodes REST/JSON to them with
// protobuf's JSON mapping, path variables and query parameters filling
// the request's fields, and answers errors as google.rpc.Status JSON
// with the typed details. They are given here rather than as annotations
// in the .proto files, which would make every generated client (Python,
// TypeScript) import googleapis' annotations.
func restRules() []*annotations.HttpRule {
	rule := func(method, verb, path, body string) *annotations.HttpRule {
		r := &annotations.HttpRule{Selector: method, Body: body}
		switch verb {
		case http.MethodGet:
			r.Pattern = &annotations.HttpRule_Get{Get: path}
		case http.MethodPost:
			r.Pattern = &annotations.HttpRule_Post{Post: path}
		case http.MethodDelete:
			r.Pattern = &annotations.HttpRule_Delete{Delete: path}
		}
		return r
	}
	const sb, files = "berth.v1.SandboxService.", "berth.v1.FileService."
	return []*annotations.HttpRule{
		rule(sb+"CreateSandbox", http.MethodPost, "/v1/sandboxes", "*"),
		rule(sb+"ListSandboxes", http.MethodGet, "/v1/sandboxes", ""),
		rule(sb+"GetSandbox", http.MethodGet, "/v1/sandboxes/{sandbox_id}", ""),
		rule(sb+"DeleteSandbox", http.MethodDelete, "/v1/sandboxes/{sandbox_id}", ""),
		rule(sb+"Run", http.MethodPost, "/v1/sandboxes/{sandbox_id}/run", "*"),
		rule(sb+"ListExecs", http.MethodGet, "/v1/sandboxes/{sandbox_id}/execs", ""),
		rule(sb+"WriteExecStdin", http.MethodPost, "/v1/sandboxes/{sandbox_id}/execs/{exec_id}/stdin", "*"),
		rule(sb+"SignalExec", http.MethodPost, "/v1/sandboxes/{sandbox_id}/execs/{exec_id}/signal", "*"),
		rule(sb+"ResizeExec", http.MethodPost, "/v1/sandboxes/{sandbox_id}/execs/{exec_id}/resize", "*"),
		rule(files+"Stat", http.MethodGet, "/v1/sandboxes/{sandbox_id}/stat", ""),
	}
}

// connectUnaryByDefault marks a POST of a unary body (application/json,
// application/proto) to a method's path as Connect (Connect-Protocol-Version:
// 1) when the caller left the header out, as connect-go servers accept
// it: vanguard would take it for REST (google.api.http), which has no
// route at a method's path, and answer 404. So `curl -H 'Content-Type:
// application/json' -d ... /berth.v1.SandboxService/Run` works.
func connectUnaryByDefault(methods map[string]bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && methods[r.URL.Path] && r.Header.Get("Connect-Protocol-Version") == "" {
			ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
			if ct = strings.TrimSpace(strings.ToLower(ct)); ct == "application/json" || ct == "application/proto" {
				r.Header.Set("Connect-Protocol-Version", "1")
			}
		}
		next.ServeHTTP(w, r)
	})
}

// newHTTPServer is the net/http server of Serve: HTTP/1.1 and HTTP/2
// without TLS (prior knowledge), bounded by tc, each connection carrying
// its identity (auth.HTTPConnContext).
func newHTTPServer(h http.Handler, tc TransportConfig, log *slog.Logger) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: tc.HandshakeTimeout,
		IdleTimeout:       tc.MaxConnectionIdle,
		MaxHeaderBytes:    int(tc.MaxHeaderListBytes),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: int(tc.MaxConcurrentStreams),
			SendPingTimeout:      30 * time.Second,
			PingTimeout:          10 * time.Second,
		},
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ctx, err := auth.HTTPConnContext(ctx, c)
			if err != nil && log != nil {
				log.Warn("HTTP connection on the unix socket served without its peer credentials (its calls need a bearer token)", slog.Any("error", err))
			}
			return ctx
		},
	}
	if log != nil {
		hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	}
	return hs
}

// sniffedListener hands out cmux's connections with their socket's
// SyscallConn, which auth reads SO_PEERCRED through. A connection to
// which matchGRPC wrote a SETTINGS frame (recorded in settled) has the
// client's ACK of it dropped: grpc-go ignores an extra ACK, net/http's
// HTTP/2 server takes it for a protocol error.
type sniffedListener struct {
	net.Listener
	settled *sync.Map
}

func (l sniffedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	mc, ok := c.(*cmux.MuxConn)
	if !ok {
		return c, nil
	}
	v, _ := l.settled.LoadAndDelete(mc.Conn)
	wrote := v == wroteSettings
	sc := &sniffedConn{MuxConn: mc, dropAck: wrote}
	if wrote {
		sc.prefaceLeft = len(http2.ClientPreface)
	}
	if _, ok := mc.Conn.(syscall.Conn); ok {
		return sysConn{sc}, nil
	}
	return sc, nil
}

type sniffedConn struct {
	*cmux.MuxConn
	// dropAck: drop the client's next SETTINGS ACK frame. Until then
	// Read follows the client's frames: the preface's bytes still to
	// pass, the current frame's payload bytes, a header to hand out.
	dropAck      bool
	prefaceLeft  int
	payloadLeft  int
	pendingBytes []byte
}

// Read passes the client's bytes on, but for the first SETTINGS ACK
// (type 4, flag ACK, empty) while dropAck holds.
func (c *sniffedConn) Read(p []byte) (int, error) {
	if len(c.pendingBytes) > 0 {
		n := copy(p, c.pendingBytes)
		c.pendingBytes = c.pendingBytes[n:]
		return n, nil
	}
	if !c.dropAck || len(p) == 0 {
		return c.MuxConn.Read(p)
	}
	if c.prefaceLeft > 0 {
		n, err := c.MuxConn.Read(p[:min(len(p), c.prefaceLeft)])
		c.prefaceLeft -= n
		return n, err
	}
	if c.payloadLeft > 0 {
		n, err := c.MuxConn.Read(p[:min(len(p), c.payloadLeft)])
		c.payloadLeft -= n
		return n, err
	}
	var h [9]byte
	if _, err := io.ReadFull(c.MuxConn, h[:]); err != nil {
		return 0, err
	}
	length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if length == 0 && h[3] == byte(http2.FrameSettings) && h[4]&byte(http2.FlagSettingsAck) != 0 {
		c.dropAck = false
		return c.MuxConn.Read(p)
	}
	c.payloadLeft = length
	n := copy(p, h[:])
	c.pendingBytes = append([]byte(nil), h[n:]...)
	return n, nil
}

// TLSConnectionState implements auth.TLSConn: the state of a TLS
// listener's connection (tlsListener).
func (c *sniffedConn) TLSConnectionState() (tls.ConnectionState, bool) {
	if t, ok := c.MuxConn.Conn.(*tls.Conn); ok {
		return t.ConnectionState(), true
	}
	return tls.ConnectionState{}, false
}

// tlsListener hands out its connections as TLS servers whose handshake
// runs at their first read: in the connection's own goroutine of cmux,
// bounded by HandshakeTimeout (matchGRPC), never in Accept.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
}

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.cfg), nil
}

// Descriptors passes on the descriptors the connection received
// (fdpass.Holder): nil when it receives none.
func (c *sniffedConn) Descriptors() *fdpass.Queue {
	if h, ok := c.MuxConn.Conn.(fdpass.Holder); ok {
		return h.Descriptors()
	}
	return nil
}

// sysConn is a sniffedConn whose socket has a descriptor.
type sysConn struct{ *sniffedConn }

func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.MuxConn.Conn.(syscall.Conn).SyscallConn()
}

// What matchGRPC records of a connection in Serve's settled map.
type sniffState int

const (
	wroteSettings sniffState = iota + 1 // it wrote a SETTINGS frame
	sniffFailed                         // reading failed: timed out, closed, not HTTP/2
)

// notFailed matches every connection but those matchGRPC failed to read
// (sniffFailed: past MaxConnectionIdle, or closed), which cmux then
// closes, so that a connection that sends nothing is held for
// MaxConnectionIdle once, not again by net/http.
func notFailed(settled *sync.Map) cmux.MatchWriter {
	return func(w io.Writer, _ io.Reader) bool {
		if v, _ := settled.Load(w); v == sniffFailed {
			settled.Delete(w)
			return false
		}
		return true
	}
}

// sniffFrameBytes is the largest HTTP/2 frame matchGRPC reads: the
// default SETTINGS_MAX_FRAME_SIZE, which every client keeps to until the
// server announces more.
const sniffFrameBytes = 16 << 10

// matchGRPC matches a connection whose first HTTP/2 request is native
// gRPC: content-type application/grpc or application/grpc+<codec> (not
// gRPC-Web's application/grpc-web). It writes an empty SETTINGS frame
// when the client sends its own, as some gRPC clients (Java) wait for the
// server's before sending a request; the server's real SETTINGS follow.
// It reads frames of at most sniffFrameBytes and header lists of at most
// maxHeaderBytes. It records in settled (by w, the connection) that it
// wrote SETTINGS, so that sniffedListener drops the client's ACK of it on
// the net/http side.
func matchGRPC(maxHeaderBytes uint32, settled *sync.Map, tc TransportConfig) cmux.MatchWriter {
	return func(w io.Writer, r io.Reader) bool {
		if c, ok := w.(*tls.Conn); ok {
			// A TLS listener's connection: its handshake is bounded by
			// HandshakeTimeout, as grpc-go bounds it; then the sorting
			// by what remains of MaxConnectionIdle.
			start := time.Now()
			c.SetDeadline(start.Add(tc.HandshakeTimeout))
			if err := c.Handshake(); err != nil {
				settled.Store(w, sniffFailed)
				return false
			}
			c.SetWriteDeadline(time.Time{})
			c.SetReadDeadline(start.Add(tc.MaxConnectionIdle))
		}
		// The preface as it arrives: a short HTTP/1.1 request differs
		// from it before its end.
		var preface [len(http2.ClientPreface)]byte
		for got := 0; got < len(preface); {
			n, err := r.Read(preface[got:])
			got += n
			if string(preface[:got]) != http2.ClientPreface[:got] {
				return false
			}
			if err != nil {
				settled.Store(w, sniffFailed)
				return false
			}
		}
		framer := http2.NewFramer(w, r)
		framer.SetMaxReadFrameSize(sniffFrameBytes)
		var contentType string
		var found, done bool
		var read uint32
		dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == "content-type" && !found {
				contentType, found = f.Value, true
			}
		})
		dec.SetMaxStringLength(int(maxHeaderBytes))
		for !done {
			f, err := framer.ReadFrame()
			if err != nil {
				settled.Store(w, sniffFailed)
				return false
			}
			var fragment []byte
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					if err := framer.WriteSettings(); err != nil {
						return false
					}
					settled.Store(w, wroteSettings)
				}
			case *http2.HeadersFrame:
				fragment, done = f.HeaderBlockFragment(), f.HeadersEnded()
			case *http2.ContinuationFrame:
				fragment, done = f.HeaderBlockFragment(), f.HeadersEnded()
			}
			if read += uint32(len(fragment)); read > maxHeaderBytes {
				// Too large for gRPC's transport too: grpc-go refuses it there.
				return true
			}
			if _, err := dec.Write(fragment); err != nil {
				return false
			}
			done = done || found
		}
		return contentType == "application/grpc" || strings.HasPrefix(contentType, "application/grpc+")
	}
}
