package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// restSandboxes answers GetSandbox with the id it was asked, Stat with
// NOT_FOUND naming the path, and WriteExecStdin with the offset plus the
// data's length: what the REST routes filled in.
type restSandboxes struct {
	berthv1.UnimplementedSandboxServiceServer
	berthv1.UnimplementedFileServiceServer
}

func (restSandboxes) GetSandbox(_ context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	return &berthv1.GetSandboxResponse{Sandbox: &berthv1.Sandbox{Id: req.GetSandboxId()}}, nil
}

func (restSandboxes) Stat(_ context.Context, req *berthv1.StatRequest) (*berthv1.StatResponse, error) {
	return nil, status.Errorf(codes.NotFound, "no %s in %s", req.GetPath(), req.GetSandboxId())
}

func (restSandboxes) WriteExecStdin(_ context.Context, req *berthv1.WriteExecStdinRequest) (*berthv1.WriteExecStdinResponse, error) {
	return &berthv1.WriteExecStdinResponse{NextOffset: req.GetOffset() + uint64(len(req.GetData()))}, nil
}

// TestRESTRoutes sends REST/JSON requests through NewHTTPHandler's
// transcoder to a gRPC server: path variables, query parameters and the
// body fill the request; an error is google.rpc.Status JSON with its HTTP
// status.
func TestRESTRoutes(t *testing.T) {
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, restSandboxes{})
	berthv1.RegisterFileServiceServer(srv, restSandboxes{})
	h, err := NewHTTPHandler(srv, ServeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()
	for _, tc := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/v1/sandboxes/sb-1", "", 200, `"id":"sb-1"`},
		{"GET", "/v1/sandboxes/sb-1/stat?path=/etc/passwd", "", 404, `"message":"no /etc/passwd in sb-1"`},
		{"POST", "/v1/sandboxes/sb-1/execs/ex-1/stdin", `{"offset": "6", "data": "aGVsbG8K"}`, 200, `"nextOffset":"12"`},
		{"POST", "/v1/sandboxes/sb-1/run", `{"process": {"argv": ["true"]}}`, 501, `"code":12`},
	} {
		req, _ := http.NewRequest(tc.method, hs.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s %s: %d %s; want %d with %s", tc.method, tc.path, resp.StatusCode, body, tc.code, tc.want)
		}
	}
}

// TestRESTRefusesUndeclaredBodies: a REST call with a body that is not
// declared application/json — none, or text/plain, which a browser sends
// cross site without a CORS preflight, with a client certificate it holds
// — is 415 and reaches no handler (vanguard read such a body as JSON).
func TestRESTRefusesUndeclaredBodies(t *testing.T) {
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, restSandboxes{})
	berthv1.RegisterFileServiceServer(srv, restSandboxes{})
	h, err := NewHTTPHandler(srv, ServeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/sb-1/execs/ex-1/stdin", strings.NewReader(`{"offset": "0", "data": "aGk="}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || strings.Contains(string(body), "nextOffset") || !strings.Contains(string(body), "application/json") {
			t.Errorf("POST stdin with Content-Type %q: %d %s; want 415 naming application/json", ct, resp.StatusCode, body)
		}
	}
}
