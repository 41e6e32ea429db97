package wsgate

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// fakeExec is a SandboxService whose Exec needs the bearer token "t0k",
// echoes one stdin message as output, and exits 3.
type fakeExec struct {
	berthv1.UnimplementedSandboxServiceServer
	started chan *berthv1.ExecStart
}

func (f *fakeExec) Exec(stream grpc.BidiStreamingServer[berthv1.ExecRequest, berthv1.ExecResponse]) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer t0k" {
		return rpcstatus.Error(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "no token: "+strings.Repeat("é", 100), nil)
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	f.started <- first.GetStart()
	stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Started{Started: &berthv1.ExecStarted{ExecId: "x1", Pid: 7}}})
	in, err := stream.Recv()
	if err != nil {
		return err
	}
	stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: 1, Data: in.GetStdin().GetData()}}})
	code := int32(3)
	return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{ExitCode: &code}}}})
}

func serveFake(t *testing.T, cfg Config) (string, *fakeExec) {
	t.Helper()
	srv := grpc.NewServer()
	f := &fakeExec{started: make(chan *berthv1.ExecStart, 1)}
	berthv1.RegisterSandboxServiceServer(srv, f)
	hs := httptest.NewServer(New(srv, cfg))
	t.Cleanup(func() { hs.Close(); srv.Stop() })
	return "ws" + strings.TrimPrefix(hs.URL, "http"), f
}

// runSession runs one terminal session: hello, then stdin; it returns the
// binary output, the text messages and the close error.
func runSession(t *testing.T, url string, h http.Header, hello string, stdin []byte) (string, []map[string]any, websocket.CloseError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url+TerminalPath, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	if hello != "" {
		ws.Write(ctx, websocket.MessageText, []byte(hello))
	}
	if stdin != nil {
		ws.Write(ctx, websocket.MessageBinary, stdin)
	}
	var out strings.Builder
	var texts []map[string]any
	for {
		typ, b, err := ws.Read(ctx)
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return out.String(), texts, ce
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageBinary {
			out.Write(b)
			continue
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		texts = append(texts, m)
	}
}

func TestTerminal(t *testing.T) {
	url, f := serveFake(t, Config{HelloTimeout: 2 * time.Second})

	t.Run("token in the first message", func(t *testing.T) {
		out, texts, ce := runSession(t, url, nil, `{"token":"t0k","sandboxId":"sb","rows":5,"cols":9,"process":{"shellCommand":"x"}}`, []byte("hi"))
		if ce.Code != websocket.StatusNormalClosure || out != "hi" || len(texts) != 2 || texts[1]["type"] != "exited" ||
			texts[1]["result"].(map[string]any)["exitCode"] != 3.0 {
			t.Errorf("got %q %v %v, want hi, started, exited 3, close 1000", out, texts, ce)
		}
		start := <-f.started
		if start.GetSandboxId() != "sb" || start.GetProcess().GetShellCommand() != "x" || !start.GetProcess().GetStdin() ||
			start.GetProcess().GetTty().GetRows() != 5 || start.GetProcess().GetTty().GetCols() != 9 || !start.GetHangupOnDisconnect() {
			t.Errorf("start %v: want sandbox sb, the process, stdin, a 5x9 tty, hangup", start)
		}
	})
	t.Run("token in the header", func(t *testing.T) {
		_, _, ce := runSession(t, url, http.Header{"Authorization": {"Bearer t0k"}}, `{"sandboxId":"sb"}`, []byte("x"))
		<-f.started
		if ce.Code != websocket.StatusNormalClosure {
			t.Errorf("close %v, want 1000", ce)
		}
	})
	t.Run("refused", func(t *testing.T) {
		out, texts, ce := runSession(t, url, nil, `{"sandboxId":"sb"}`, nil)
		if ce.Code != 4016 || !strings.HasPrefix(ce.Reason, "UNAUTHENTICATED: no token: é") || len(ce.Reason) > 123 || out != "" {
			t.Errorf("close %d %q (%d bytes), output %q: want 4016 UNAUTHENTICATED cut to 123 bytes", ce.Code, ce.Reason, len(ce.Reason), out)
		}
		if len(texts) != 1 || texts[0]["type"] != "error" || texts[0]["code"] != "unauthenticated" || texts[0]["reason"] != "UNAUTHENTICATED" ||
			len(texts[0]["message"].(string)) < 200 {
			t.Errorf("texts %v, want one error message with the whole message", texts)
		}
	})
	t.Run("no first message", func(t *testing.T) {
		_, _, ce := runSession(t, url, nil, "", nil)
		if ce.Code != 4004 || !strings.HasPrefix(ce.Reason, "DEADLINE_EXCEEDED: no first message within 2s") {
			t.Errorf("close %d %q, want 4004 naming the wait", ce.Code, ce.Reason)
		}
	})
	t.Run("bad first message", func(t *testing.T) {
		for hello, want := range map[string]string{
			`{"sandboxId":`:                        "INVALID_ARGUMENT: the first message is not valid JSON",
			`{"sandboxId":"sb","process":{"x":1}}`: "INVALID_ARGUMENT: process: not a berth.v1.ProcessSpec",
		} {
			_, _, ce := runSession(t, url, nil, hello, nil)
			if ce.Code != 4003 || !strings.HasPrefix(ce.Reason, want) {
				t.Errorf("%s: close %d %q, want 4003 %q", hello, ce.Code, ce.Reason, want)
			}
		}
	})
	t.Run("origin", func(t *testing.T) {
		ctx := context.Background()
		_, resp, err := websocket.Dial(ctx, url+TerminalPath, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://evil.example"}}})
		if err == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("a foreign origin: %v, want 403", err)
		}
		allowed, _ := serveFake(t, Config{AllowedOrigins: []string{"*.example.com"}})
		ws, _, err := websocket.Dial(ctx, allowed+TerminalPath, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://console.example.com"}}})
		if err != nil {
			t.Fatalf("an allowed origin: %v", err)
		}
		ws.CloseNow()
	})
}

func TestCut(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{{"abc", 5, "abc"}, {"abcdef", 3, "abc"}, {"aé", 2, "a"}, {"aéb", 3, "aé"}} {
		if got := cut(c.in, c.n); got != c.want {
			t.Errorf("cut(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestTerminalRequest(t *testing.T) {
	var h terminalHello
	json.Unmarshal([]byte(`{"sandboxId":"sb","attach":{"execId":"x1","sinceSeq":41}}`), &h)
	req, err := h.request()
	if a := req.GetAttach(); err != nil || a.GetSandboxId() != "sb" || a.GetExecId() != "x1" || a.GetSinceSeq() != 41 {
		t.Errorf("attach: %v %v, want sandbox sb, exec x1, since 41", req, err)
	}
	h = terminalHello{}
	json.Unmarshal([]byte(`{"sandboxId":"sb","detach":true}`), &h)
	req, err = h.request()
	s := req.GetStart()
	if err != nil || s.GetHangupOnDisconnect() || strings.Join(s.GetProcess().GetArgv(), " ") != "/bin/sh" ||
		s.GetProcess().GetTty().GetRows() != 24 || s.GetProcess().GetTty().GetCols() != 80 {
		t.Errorf("detached default start: %v %v, want /bin/sh on a 24x80 tty, no hangup", req, err)
	}
}
