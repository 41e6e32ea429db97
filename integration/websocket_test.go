package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/wsgate"
)

// otherToken is the bearer token of principal "other" in the WebSocket
// and console tests, beside httpToken's "web".
var otherToken = strings.Repeat("o7", 32)

// startWSBerthd starts the berthd binary with a plaintext TCP listener,
// the console on, and a token file naming "web" (httpToken) and "other"
// (otherToken); it returns the env and the listener's URL.
func startWSBerthd(t *testing.T) (*berthEnv, string) {
	t.Helper()
	return startTokenBerthd(t, "ws", auth.TokenHash(httpToken)+" web\n"+auth.TokenHash(otherToken)+" other\n", "--console")
}

// connectCall makes a Connect unary JSON call with token and decodes the
// answer into out; it returns the HTTP status.
func connectCall(t *testing.T, url, token, method string, req, out any) int {
	t.Helper()
	b, _ := json.Marshal(req)
	hr, _ := http.NewRequest("POST", url+"/berth.v1."+method, bytes.NewReader(b))
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", "Bearer "+token)
	r, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if out != nil && json.Unmarshal(body, out) != nil {
		t.Fatalf("%s: not JSON: %s", method, body)
	}
	return r.StatusCode
}

// createAs creates a sandbox of token's principal over Connect JSON.
func createAs(t *testing.T, url, token string) string {
	t.Helper()
	var resp struct {
		Sandbox struct{ ID string } `json:"sandbox"`
	}
	if code := connectCall(t, url, token, "SandboxService/CreateSandbox", map[string]any{"image": baseImage}, &resp); code != 200 || resp.Sandbox.ID == "" {
		t.Fatalf("CreateSandbox: HTTP %d %+v", code, resp)
	}
	return resp.Sandbox.ID
}

// wsSession is a client's side of a WebSocket session: what it received.
type wsSession struct {
	ws     *websocket.Conn
	binary bytes.Buffer
	texts  []map[string]any
}

// dialWS opens path with the header h and sends hello as the first message.
func dialWS(ctx context.Context, t *testing.T, url, path string, h http.Header, hello any) *wsSession {
	t.Helper()
	ws, resp, err := websocket.Dial(ctx, strings.Replace(url, "http", "ws", 1)+path, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{wsgate.Subprotocol}})
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", path, err, resp)
	}
	ws.SetReadLimit(1 << 20)
	b, _ := json.Marshal(hello)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	return &wsSession{ws: ws}
}

// readAll reads until the session closes and returns its close error
// (websocket.CloseError).
func (s *wsSession) readAll(ctx context.Context, t *testing.T) websocket.CloseError {
	t.Helper()
	for {
		typ, b, err := s.ws.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("session ended without a close frame: %v (received %q, %v)", err, s.binary.String(), s.texts)
			}
			return ce
		}
		if typ == websocket.MessageBinary {
			s.binary.Write(b)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("text message not JSON: %q", b)
		}
		s.texts = append(s.texts, m)
	}
}

// text returns the received text message of type typ.
func (s *wsSession) text(typ string) map[string]any {
	for _, m := range s.texts {
		if m["type"] == typ {
			return m
		}
	}
	return nil
}

// TestWebSocketTerminal: the terminal endpoint of a real berthd runs a
// tty exec and delivers its output and exit status (close 1000), with
// the token in the upgrade's header or in the first message; refuses a
// session without credentials (4016 UNAUTHENTICATED), a foreign browser
// origin (403 before the upgrade) and another principal's sandbox (4005
// SANDBOX_NOT_FOUND, as for a missing one).
func TestWebSocketTerminal(t *testing.T) {
	need(t)
	e, url := startWSBerthd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb := createAs(t, url, httpToken)
	bearer := http.Header{"Authorization": {"Bearer " + httpToken}}

	t.Run("unix socket peer", func(t *testing.T) {
		// No token: the principal is the uid that connected (root, an
		// admin, who sees web's sandbox), read from the socket as for gRPC.
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", e.sock)
		}}}
		ws, _, err := websocket.Dial(ctx, "ws://berthd"+wsgate.TerminalPath, &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatal(err)
		}
		s := &wsSession{ws: ws}
		ws.Write(ctx, websocket.MessageText, []byte(`{"sandboxId":"`+sb+`","process":{"argv":["echo","ok"]}}`))
		if ce := s.readAll(ctx, t); ce.Code != websocket.StatusNormalClosure || s.binary.String() != "ok\r\n" {
			t.Errorf("on the unix socket as root: close %v, output %q, want 1000 and ok", ce, s.binary.String())
		}
	})

	t.Run("exit status", func(t *testing.T) {
		s := dialWS(ctx, t, url, wsgate.TerminalPath, bearer, map[string]any{
			"sandboxId": sb, "rows": 30, "cols": 100,
			"process": map[string]any{"shellCommand": "stty size; echo hi; exit 3"}})
		ce := s.readAll(ctx, t)
		if ce.Code != websocket.StatusNormalClosure {
			t.Fatalf("close %v, want 1000; texts %v", ce, s.texts)
		}
		if got := s.binary.String(); got != "30 100\r\nhi\r\n" {
			t.Errorf("output %q, want %q (a tty of 30 rows, 100 columns)", got, "30 100\r\nhi\r\n")
		}
		if st := s.text("started"); st == nil || st["execId"] == "" {
			t.Errorf("no started message with an exec id: %v", s.texts)
		}
		ex := s.text("exited")
		if ex == nil {
			t.Fatalf("no exited message: %v", s.texts)
		}
		if code := ex["result"].(map[string]any)["exitCode"]; code != 3.0 {
			t.Errorf("exited exitCode %v, want 3: %v", code, ex)
		}
	})

	t.Run("stdin, resize and the token in the first message", func(t *testing.T) {
		s := dialWS(ctx, t, url, wsgate.TerminalPath, nil, map[string]any{
			"token": httpToken, "sandboxId": sb,
			"process": map[string]any{"shellCommand": "read line; stty size; echo got:$line; exit 7"}})
		if err := s.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":11,"cols":45}`)); err != nil {
			t.Fatal(err)
		}
		if err := s.ws.Write(ctx, websocket.MessageBinary, []byte("abc\r")); err != nil {
			t.Fatal(err)
		}
		ce := s.readAll(ctx, t)
		if ce.Code != websocket.StatusNormalClosure {
			t.Fatalf("close %v, want 1000; texts %v", ce, s.texts)
		}
		// The tty echoes the input line.
		if got := s.binary.String(); !strings.Contains(got, "11 45\r\ngot:abc\r\n") {
			t.Errorf("output %q, want the size 11 45 and got:abc", got)
		}
		if code := s.text("exited")["result"].(map[string]any)["exitCode"]; code != 7.0 {
			t.Errorf("exitCode %v, want 7", code)
		}
	})

	refused := func(t *testing.T, h http.Header, hello map[string]any, wantCode websocket.StatusCode, wantReason string) {
		t.Helper()
		s := dialWS(ctx, t, url, wsgate.TerminalPath, h, hello)
		ce := s.readAll(ctx, t)
		if ce.Code != wantCode || !strings.HasPrefix(ce.Reason, wantReason+": ") {
			t.Errorf("close %d %q, want %d %q", ce.Code, ce.Reason, wantCode, wantReason)
		}
		if e := s.text("error"); e == nil || e["reason"] != wantReason || e["message"] == "" {
			t.Errorf("error message %v, want reason %s and a message", e, wantReason)
		}
		if s.binary.Len() != 0 || s.text("started") != nil {
			t.Errorf("a refused session started something: %q %v", s.binary.String(), s.texts)
		}
	}
	t.Run("no token", func(t *testing.T) {
		refused(t, nil, map[string]any{"sandboxId": sb}, 4016, "UNAUTHENTICATED")
	})
	t.Run("wrong token", func(t *testing.T) {
		refused(t, nil, map[string]any{"sandboxId": sb, "token": strings.Repeat("x", 64)}, 4016, "UNAUTHENTICATED")
	})
	t.Run("another principal's sandbox", func(t *testing.T) {
		refused(t, nil, map[string]any{"sandboxId": sb, "token": otherToken}, 4005, "SANDBOX_NOT_FOUND")
		refused(t, nil, map[string]any{"sandboxId": "no-such-sandbox", "token": otherToken}, 4005, "SANDBOX_NOT_FOUND")
	})
	t.Run("bad control message", func(t *testing.T) {
		s := dialWS(ctx, t, url, wsgate.TerminalPath, bearer, map[string]any{"sandboxId": sb, "process": map[string]any{"argv": []string{"cat"}}})
		if err := s.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"explode"}`)); err != nil {
			t.Fatal(err)
		}
		ce := s.readAll(ctx, t)
		if ce.Code != 4003 || !strings.Contains(ce.Reason, `"explode"`) {
			t.Errorf("close %d %q, want 4003 naming the type", ce.Code, ce.Reason)
		}
	})

	t.Run("origin", func(t *testing.T) {
		h := http.Header{"Origin": {"http://evil.example"}, "Authorization": {"Bearer " + httpToken}}
		_, resp, err := websocket.Dial(ctx, strings.Replace(url, "http", "ws", 1)+wsgate.TerminalPath, &websocket.DialOptions{HTTPHeader: h})
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("a foreign origin: %v %v, want 403", err, resp)
		}
		// The same origin, as a page berthd serves (the console) has.
		same := http.Header{"Origin": {url}}
		s := dialWS(ctx, t, url, wsgate.TerminalPath, same, map[string]any{"token": httpToken, "sandboxId": sb, "process": map[string]any{"argv": []string{"true"}}})
		if ce := s.readAll(ctx, t); ce.Code != websocket.StatusNormalClosure {
			t.Errorf("the same origin: close %v, want 1000", ce)
		}
	})
}

// TestWebSocketPortForward: bytes pass byte-exact both ways through the
// port forward endpoint to a port in a sandbox without network; the
// client's eof half-closes, the sandbox's side answers and closes, and
// the session ends with 1000; another principal's sandbox is 4005.
func TestWebSocketPortForward(t *testing.T) {
	need(t)
	e, url := startWSBerthd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb := createAs(t, url, httpToken)
	c, err := client.Dial(ctx, "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// cat echoes until its input ends, then exits: a half-close each way.
	startInSandbox(t, c, sb, 9000, "nc", "-ll", "-p", "9000", "-e", "cat")

	payload := make([]byte, 4<<20)
	rand.Read(payload)
	s := dialWS(ctx, t, url, wsgate.PortForwardPath, nil, map[string]any{"token": httpToken, "sandboxId": sb, "port": 9000})
	sent := make(chan error, 1)
	go func() {
		for off := 0; off < len(payload); off += 48 << 10 {
			if err := s.ws.Write(ctx, websocket.MessageBinary, payload[off:min(off+48<<10, len(payload))]); err != nil {
				sent <- err
				return
			}
		}
		sent <- s.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
	}()
	ce := s.readAll(ctx, t)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if ce.Code != websocket.StatusNormalClosure {
		t.Fatalf("close %v, want 1000; texts %v", ce, s.texts)
	}
	if !bytes.Equal(s.binary.Bytes(), payload) {
		t.Errorf("echoed %d bytes, want the %d sent byte-exact", s.binary.Len(), len(payload))
	}
	if s.text("connected") == nil || s.text("eof") == nil {
		t.Errorf("texts %v, want connected and eof", s.texts)
	}

	o := dialWS(ctx, t, url, wsgate.PortForwardPath, nil, map[string]any{"token": otherToken, "sandboxId": sb, "port": 9000})
	if ce := o.readAll(ctx, t); ce.Code != 4005 || !strings.HasPrefix(ce.Reason, "SANDBOX_NOT_FOUND") {
		t.Errorf("another principal's port forward: close %d %q, want 4005 SANDBOX_NOT_FOUND", ce.Code, ce.Reason)
	}
}
