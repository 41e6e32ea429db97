package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/testcerts"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// httpToken is the bearer token of principal "web" in TestHTTPDocRecipes.
var httpToken = strings.Repeat("w3", 32)

// startHTTPBerthd starts the berthd binary with a unix socket and a
// plaintext TCP listener and a token file naming "web" (httpToken) and
// "other" (otherToken); it returns the TCP listener's URL and the env.
func startHTTPBerthd(t *testing.T) (*berthEnv, string) {
	t.Helper()
	return startTokenBerthd(t, "http", auth.TokenHash(httpToken)+" web\n"+auth.TokenHash(otherToken)+" other\n")
}

// startTokenBerthd starts the berthd binary (env name) with a unix socket,
// a plaintext TCP listener, the token file tokens and flags, and imports
// the base image; it returns the env and the TCP listener's URL.
func startTokenBerthd(t *testing.T, name, tokens string, flags ...string) (*berthEnv, string) {
	t.Helper()
	e := newBinaryEnv(t, name)
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startBerthd(t, e, append([]string{"--listen", addr, "--insecure-tcp", "--token-file", file}, flags...)...)
	e.importBase(t)
	return e, "http://" + addr
}

// docRecipes returns docs/http.md's sh blocks by their "# test: name"
// first line.
func docRecipes(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)```sh\n# test: (\\w+)\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestHTTPDocRecipes runs docs/http.md's curl recipes against a real
// berthd over HTTP/1.1 (TCP with a bearer token, and the unix socket):
// Connect JSON create, Run, ReadFile (a Connect server stream), a typed
// error as JSON with its reason and HTTP status, no token, bidi refused,
// REST, exec without bidi; then Run through gRPC-Web, files as raw bodies
// (rawFiles), streams as JSON lines (jsonLines) and every other call
// (everyCall).
func TestHTTPDocRecipes(t *testing.T) {
	need(t)
	e, url := startHTTPBerthd(t)
	recipes := docRecipes(t)
	sb := "web-" + strings.ToLower(xid(t)[len(xid(t))-6:])
	dir := t.TempDir() // the recipes' working directory
	run := func(name string) string {
		t.Helper()
		script, ok := recipes[name]
		if !ok {
			t.Fatalf("docs/http.md has no recipe %q", name)
		}
		cmd := exec.Command("sh", "-ec", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "BERTH_URL="+url, "BERTH_TOKEN="+httpToken, "BERTH_SOCK="+e.sock, "SB="+sb)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("recipe %s: %v\n%s", name, err, out)
		}
		t.Logf("recipe %s:\n%s", name, out)
		return string(out)
	}
	want := func(name, out string, subs ...string) {
		t.Helper()
		for _, s := range subs {
			if !strings.Contains(normJSON(out), s) {
				t.Errorf("recipe %s: output lacks %q:\n%s", name, s, out)
			}
		}
	}
	want("create", run("create"), `"id":"`+sb+`"`)
	t.Cleanup(func() {
		e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb})
	})
	want("run", run("run"), `"stdout":"aGkK"`)
	want("unix", run("unix"), `"stdout":"`+base64.StdEncoding.EncodeToString([]byte("from the socket\n"))+`"`)
	shells, err := os.ReadFile("../build/rootfs/etc/shells")
	if err != nil {
		t.Fatal(err)
	}
	want("readfile", run("readfile"), `"chunk":"`+base64.StdEncoding.EncodeToString(shells)+`"`)
	out := run("notfound")
	want("notfound", out, `"code":"not_found"`, "HTTP 404")
	if reason := errorReason(t, out); reason != "SANDBOX_NOT_FOUND" {
		t.Errorf("GetSandbox of a missing sandbox: ErrorInfo reason %q, want SANDBOX_NOT_FOUND:\n%s", reason, out)
	}
	out = run("notoken")
	want("notoken", out, `"code":"unauthenticated"`, "HTTP 401")
	if reason := errorReason(t, out); reason != "UNAUTHENTICATED" {
		t.Errorf("no token: ErrorInfo reason %q, want UNAUTHENTICATED:\n%s", reason, out)
	}
	want("bidi", run("bidi"), "HTTP 505", "bidi streams require HTTP/2")

	out = run("rest")
	want("rest", out, `"id":"`+sb+`"`, `"stdout":"cmVzdAo="`, `"sizeBytes":"`+fmt.Sprint(len(shells))+`"`,
		"HTTP 404", `"reason":"SANDBOX_NOT_FOUND"`)

	// Exec without bidi: start in the background, stdin at offsets (a
	// resent chunk dropped), a gap refused, attach from a seq.
	want("startexec", run("startexec"), `"started":{"execId":"cat-1"`)
	out = run("stdin")
	if got := regexp.MustCompile(`"nextOffset": *"(\d+)"`).FindAllStringSubmatch(out, -1); len(got) != 3 || got[0][1] != "6" || got[1][1] != "6" || got[2][1] != "12" {
		t.Errorf("recipe stdin: next offsets %v, want 6, 6 (the resent chunk dropped), 12:\n%s", got, out)
	}
	out = run("stdingap")
	want("stdingap", out, `"code":"failed_precondition"`, "HTTP 400")
	if reason := errorReason(t, out); reason != "STDIN_OFFSET_GAP" {
		t.Errorf("stdin past the count: ErrorInfo reason %q, want STDIN_OFFSET_GAP:\n%s", reason, out)
	}
	if meta := errorInfo(t, out).GetMetadata(); meta["expected_offset"] != "12" {
		t.Errorf("stdin past the count: ErrorInfo metadata %v, want expected_offset 12", meta)
	}
	out = run("attach")
	// Event 1 was "hello\n": from seq 1 on comes "world\n" alone, once.
	want("attach", out, `"seq":"2"`, `"data":"d29ybGQK"`, `"exitCode":0`)
	if strings.Contains(out, "aGVsbG8K") || strings.Count(out, `"output":`) != 1 {
		t.Errorf("recipe attach from seq 1: want one output, world, and not hello:\n%s", out)
	}
	want("resize", run("resize"), `"code":"invalid_argument"`, "HTTP 400", `"state":"EXEC_STATE_EXITED"`)
	// Every byte once: the exec's whole stdout is hello, world.
	all := openExec(t, e.sandboxes, attachReq(sb, "cat-1", 0), 0).wait()
	if string(all.stdout) != "hello\nworld\n" {
		t.Errorf("cat-1 wrote %q, want the stdin sent, each byte once: %q", all.stdout, "hello\nworld\n")
	}
	grpcWebRun(t, url, sb)
	rawFiles(t, e, url, sb, dir, run, want)
	jsonLines(t, e, url, sb, run, want)
	everyCall(t, e, sb, run, want)
}

// errorReason returns the reason of the google.rpc.ErrorInfo detail of a
// Connect JSON error body in out.
func errorReason(t *testing.T, out string) string {
	t.Helper()
	return errorInfo(t, out).GetReason()
}

// errorInfo returns the google.rpc.ErrorInfo detail of a Connect JSON
// error body in out.
func errorInfo(t *testing.T, out string) *errdetails.ErrorInfo {
	t.Helper()
	m := regexp.MustCompile(`"type":"google.rpc.ErrorInfo","value":"([^"]*)"`).FindStringSubmatch(out)
	if m == nil {
		t.Errorf("no google.rpc.ErrorInfo detail in %s", out)
		return nil
	}
	b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(m[1], "="))
	if err != nil {
		t.Fatalf("ErrorInfo value %q: %v", m[1], err)
	}
	var info errdetails.ErrorInfo
	if err := proto.Unmarshal(b, &info); err != nil {
		t.Fatalf("ErrorInfo: %v", err)
	}
	return &info
}

// grpcWebRun calls Run in sb through gRPC-Web over HTTP/1.1 with a bearer
// token: the answer is the framed RunResponse and a trailer frame with
// grpc-status 0.
func grpcWebRun(t *testing.T, url, sb string) {
	t.Helper()
	msg, err := proto.Marshal(&berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "web"}}})
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte{0, 0, 0, 0, 0}, msg...)
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	req, _ := http.NewRequest("POST", url+"/berth.v1.SandboxService/Run", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/grpc-web+proto")
	req.Header.Set("Authorization", "Bearer "+httpToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 {
		t.Fatalf("gRPC-Web Run: %s %s: %q", resp.Proto, resp.Status, raw)
	}
	if len(raw) < 5 || raw[0] != 0 {
		t.Fatalf("gRPC-Web Run: no message frame: %q", raw)
	}
	n := binary.BigEndian.Uint32(raw[1:5])
	var got berthv1.RunResponse
	if err := proto.Unmarshal(raw[5:5+n], &got); err != nil {
		t.Fatal(err)
	}
	if string(got.GetStdout()) != "web\n" || got.GetResult().GetExitCode() != 0 {
		t.Errorf("gRPC-Web Run: stdout %q exit %d, want \"web\\n\" 0", got.GetStdout(), got.GetResult().GetExitCode())
	}
	if trailer := strings.ToLower(string(raw[5+n:])); !strings.Contains(trailer, "grpc-status: 0\r\n") {
		t.Errorf("gRPC-Web Run: trailer frame %q lacks grpc-status: 0", trailer)
	}
}

// BenchmarkRunProtocols is the round trip of Run(true) over gRPC and over
// Connect JSON (HTTP/1.1) on the suite's unix socket, in the same run
// (issue 26: the HTTP path's cost beside gRPC's).
func BenchmarkRunProtocols(b *testing.B) {
	if env.skip != "" {
		b.Skip("integration environment unavailable: " + env.skip)
	}
	sb := benchSandboxOf(b, &berthv1.CreateSandboxRequest{Image: env.image}).GetId()
	req := &berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}}
	b.Run("grpc", func(b *testing.B) {
		for b.Loop() {
			if _, err := env.sandboxes.Run(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("connect-json-http1", func(b *testing.B) {
		c := unixHTTPClient(env.berthdAddr)
		body := []byte(`{"sandboxId":"` + sb + `","process":{"argv":["true"]}}`)
		for b.Loop() {
			r, err := c.Post("http://berthd/berth.v1.SandboxService/Run", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			out, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != 200 {
				b.Fatalf("Run: %s: %s", r.Status, out)
			}
		}
	})
}

// TestHTTPOverTLS serves a TLS TCP listener (with client CAs) and checks
// every protocol on it: Connect JSON over HTTP/1.1 and HTTP/2 with a
// bearer token (curl), a client certificate's principal over Connect (its
// own sandboxes only: the token principal's is SANDBOX_NOT_FOUND, 404),
// and native gRPC with the token.
func TestHTTPOverTLS(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "httptls")
	dir := t.TempDir()
	certs, err := testcerts.NewSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey, err := certs.ClientFiles("certuser")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(auth.TokenHash(httpToken)+" web\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startBerthd(t, e, "--listen", addr, "--tls-cert", certs.CertFile, "--tls-key", certs.KeyFile, "--tls-client-ca", certs.CAFile, "--token-file", tokens)
	e.importBase(t)
	url := "https://" + addr
	sb := "tls-" + strings.ToLower(xid(t)[len(xid(t))-6:])
	t.Cleanup(func() {
		e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb})
	})
	curl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("curl", append([]string{"-sS", "--cacert", certs.CAFile, "-w", "\nHTTP %{http_version} %{http_code}\n", "-X", "POST",
			"-H", "Content-Type: application/json"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	bearer := "Authorization: Bearer " + httpToken
	if out := curl("--http1.1", "-H", bearer, "-d", `{"sandboxId":"`+sb+`","image":"berth.dev/base:latest"}`, url+"/berth.v1.SandboxService/CreateSandbox"); !strings.Contains(out, `"owner":"web"`) || !strings.Contains(out, "HTTP 1.1 200") {
		t.Fatalf("CreateSandbox over TLS, HTTP/1.1, token: %s", out)
	}
	if out := curl("--http2", "-H", bearer, "-d", `{"sandboxId":"`+sb+`","process":{"argv":["echo","hi"]}}`, url+"/berth.v1.SandboxService/Run"); !strings.Contains(out, `"stdout":"aGkK"`) || !strings.Contains(out, "HTTP 2 200") {
		t.Errorf("Run over TLS, HTTP/2, token: %s", out)
	}
	out := curl("--http1.1", "--cert", clientCert, "--key", clientKey, "-d", `{"sandboxId":"`+sb+`"}`, url+"/berth.v1.SandboxService/GetSandbox")
	if !strings.Contains(out, "HTTP 1.1 404") || errorReason(t, out) != "SANDBOX_NOT_FOUND" {
		t.Errorf("GetSandbox of web's sandbox as certuser (client certificate): %s, want 404 SANDBOX_NOT_FOUND", out)
	}
	if out := curl("--http1.1", "-d", `{}`, url+"/berth.v1.SandboxService/ListSandboxes"); !strings.Contains(out, "HTTP 1.1 401") {
		t.Errorf("ListSandboxes over TLS without credentials: %s, want 401", out)
	}

	trust, err := client.TLSConfigFromFiles(certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(trust)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+httpToken)
	got, err := berthv1.NewSandboxServiceClient(conn).GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb})
	if err != nil || got.GetSandbox().GetOwner() != "web" {
		t.Errorf("gRPC GetSandbox over TLS with the token: %v %v", got, err)
	}
}
