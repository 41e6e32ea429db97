package server

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// h2Request is a client preface, SETTINGS and a HEADERS frame with
// content-type ct, as an HTTP/2 client opens a connection.
func h2Request(t *testing.T, ct string) []byte {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":path", Value: "/grpc.health.v1.Health/Check"}, {Name: "content-type", Value: ct}} {
		enc.WriteField(f)
	}
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	return b.Bytes()
}

func TestMatchGRPC(t *testing.T) {
	for _, c := range []struct {
		name string
		conn []byte
		want bool
	}{
		{"gRPC", h2Request(t, "application/grpc"), true},
		{"gRPC with a codec", h2Request(t, "application/grpc+proto"), true},
		{"gRPC-Web over HTTP/2", h2Request(t, "application/grpc-web+proto"), false},
		{"Connect over HTTP/2", h2Request(t, "application/json"), false},
		{"HTTP/1.1", []byte("POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\n\r\n"), false},
		{"half a preface", []byte(http2.ClientPreface[:10]), false},
	} {
		if got := matchGRPC(DefaultMaxHeaderListBytes, &sync.Map{}, TransportConfig{}.withDefaults())(io.Discard, bytes.NewReader(c.conn)); got != c.want {
			t.Errorf("%s: matchGRPC %v, want %v", c.name, got, c.want)
		}
	}
}

// TestServeSortsProtocols serves one unix socket with Serve and calls the
// health service on it over gRPC, Connect JSON over HTTP/1.1, and
// gRPC-Web over HTTP/2.
func TestServeSortsProtocols(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- Serve(srv, lis, ServeConfig{HTTP: true}) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC Check: %v %v", resp, err)
	}

	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}
	h1 := &http.Client{Transport: &http.Transport{DialContext: dial}}
	r, err := h1.Post("http://berthd/grpc.health.v1.Health/Check", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || r.ProtoMajor != 1 || !strings.Contains(string(body), `"status":"SERVING"`) {
		t.Errorf("Connect JSON Check over HTTP/1.1: %s %s %s", r.Proto, r.Status, body)
	}

	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{DialContext: dial, Protocols: &protocols}}
	r, err = h2.Post("http://berthd/grpc.health.v1.Health/Check", "application/grpc-web+proto", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(r.Body)
	r.Body.Close()
	// SERVING is field 1 = 1: the message 08 01 in a 2-byte frame.
	if r.StatusCode != 200 || r.ProtoMajor != 2 || !bytes.HasPrefix(body, []byte{0, 0, 0, 0, 2, 8, 1}) {
		t.Errorf("gRPC-Web Check over HTTP/2: %s %s %q", r.Proto, r.Status, body)
	}
}

// TestConsoleOffByDefault: the console's page is served only with
// ServeConfig.Console, with a policy that loads nothing from elsewhere;
// the WebSocket endpoints are there either way.
func TestConsoleOffByDefault(t *testing.T) {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	for _, on := range []bool{false, true} {
		h, err := NewHTTPHandler(srv, ServeConfig{Console: on})
		if err != nil {
			t.Fatal(err)
		}
		get := func(path string) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
			return w
		}
		page := get("/console/")
		switch {
		case !on && page.Code != http.StatusNotFound:
			t.Errorf("console off: GET /console/ %d, want 404", page.Code)
		case on && (page.Code != http.StatusOK || !strings.Contains(page.Body.String(), `<script src="vendor/xterm.js">`)):
			t.Errorf("console on: GET /console/ %d %.200s, want the page", page.Code, page.Body)
		case on && !strings.HasPrefix(page.Header().Get("Content-Security-Policy"), "default-src 'none'"):
			t.Errorf("console on: Content-Security-Policy %q", page.Header().Get("Content-Security-Policy"))
		}
		if on {
			if js := get("/console/vendor/xterm.js"); js.Code != http.StatusOK || js.Body.Len() < 100000 {
				t.Errorf("xterm.js: %d, %d bytes", js.Code, js.Body.Len())
			}
		}
		// Not an upgrade: coder/websocket answers 426.
		if ws := get("/ws/v1/terminal"); ws.Code != http.StatusUpgradeRequired {
			t.Errorf("console %v: GET /ws/v1/terminal without an upgrade %d, want 426", on, ws.Code)
		}
	}
}
