package restgate_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/restgate"
)

// fakeFiles serves content at every path but /changing, whose read fails
// after its first chunk (FILE_CHANGED); it records each WriteFile's
// header, bytes and end (nil when the stream closed, else why it failed).
type fakeFiles struct {
	berthv1.UnimplementedFileServiceServer
	berthv1.UnimplementedSandboxServiceServer
	content []byte

	started chan struct{} // a WriteFile has its header
	writes  chan write
}

type write struct {
	header *berthv1.WriteFileHeader
	data   []byte
	auth   string
	resume []string // the berth-no-resume metadata
	trace  []string // the traceparent and tracestate metadata
	err    error
}

func (f *fakeFiles) ReadFile(req *berthv1.ReadFileRequest, s grpc.ServerStreamingServer[berthv1.ReadFileResponse]) error {
	if req.GetSandboxId() != "sb-1" {
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, "sandbox not found: "+req.GetSandboxId(), nil)
	}
	s.Send(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: &berthv1.ReadFileHeader{LengthBytes: uint64(len(f.content))}}})
	for i := 0; i < len(f.content); i += 1000 {
		s.Send(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Chunk{Chunk: f.content[i:min(i+1000, len(f.content))]}})
		if req.GetPath() == "/changing" {
			return rpcstatus.Error(codes.Aborted, "FILE_CHANGED", "changed", nil)
		}
	}
	return nil
}

func (f *fakeFiles) WriteFile(s grpc.ClientStreamingServer[berthv1.WriteFileRequest, berthv1.WriteFileResponse]) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	w := write{auth: strings.Join(md.Get("authorization"), ","), resume: md.Get(resume.Header),
		trace: append(md.Get("traceparent"), md.Get("tracestate")...)}
	defer func() { f.writes <- w }()
	first, err := s.Recv()
	if err != nil {
		w.err = err
		return err
	}
	w.header = first.GetHeader()
	f.started <- struct{}{}
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return s.SendAndClose(&berthv1.WriteFileResponse{WrittenBytes: uint64(len(w.data))})
		}
		if err != nil {
			w.err = err
			return err
		}
		w.data = append(w.data, m.GetChunk()...)
	}
}

func (f *fakeFiles) AttachExec(req *berthv1.AttachExecRequest, s grpc.ServerStreamingServer[berthv1.ExecResponse]) error {
	for seq := req.GetSinceSeq() + 1; seq <= req.GetSinceSeq()+2; seq++ {
		s.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Data: []byte("x")}}})
	}
	return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonRuntimeReplaced, "replaced", nil)
}

func serve(t *testing.T) (*fakeFiles, string) {
	t.Helper()
	f := &fakeFiles{content: bytes.Repeat([]byte("0123456789abcdef"), 1<<16), writes: make(chan write, 4), started: make(chan struct{}, 4)}
	srv := grpc.NewServer()
	berthv1.RegisterFileServiceServer(srv, f)
	berthv1.RegisterSandboxServiceServer(srv, f)
	h := restgate.New(srv, nil, 0)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.Match(r) {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return f, hs.URL
}

func do(t *testing.T, method, url string, body io.Reader) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// TestRawFiles: a download is the file with its Content-Length; one that
// fails after its first byte is cut (the client sees an early EOF); an
// upload reaches WriteFile whole, with size_bytes and the caller's
// token; errors are google.rpc.Status JSON with the HTTP status of the
// code, bad parameters INVALID_ARGUMENT naming them.
func TestRawFiles(t *testing.T) {
	f, url := serve(t)
	base := url + "/v1/sandboxes/sb-1/files/content?path="
	resp, body, err := do(t, "GET", base+"/a", nil)
	if err != nil || !bytes.Equal(body, f.content) || resp.ContentLength != int64(len(f.content)) {
		t.Errorf("GET content: %d bytes (Content-Length %d), %v; want the %d bytes", len(body), resp.ContentLength, err, len(f.content))
	}
	// The cut may come before the status line reached the client (it sat
	// in net/http's buffer) or after: either way an error, never a body.
	if _, body, err = do(t, "GET", base+"/changing", nil); err == nil {
		t.Errorf("GET content of a file that changed: %d bytes read without an error, want a cut body", len(body))
	}
	resp, body, _ = do(t, "PUT", base+"/b&createParents=true", bytes.NewReader(f.content))
	<-f.started
	w := <-f.writes
	if resp.StatusCode != 200 || !bytes.Equal(w.data, f.content) || w.header.GetSizeBytes() != uint64(len(f.content)) ||
		!w.header.GetCreateParents() || w.header.GetPath() != "/b" || w.auth != "Bearer tok" || w.err != nil {
		t.Errorf("PUT content: %s %s; WriteFile got %d bytes, header %v, auth %q, end %v", resp.Status, body, len(w.data), w.header, w.auth, w.err)
	}
	for _, tc := range []struct {
		method, url string
		code        int
		want        string
	}{
		{"GET", url + "/v1/sandboxes/sb-2/files/content?path=/a", 404, `"reason":"SANDBOX_NOT_FOUND"`},
		{"GET", base + "/a&bogus=1", 400, `"field":"bogus"`},
		// The path's sandbox is the call's: a query parameter may not
		// name another.
		{"GET", url + "/v1/sandboxes/sb-2/files/content?path=/a&sandboxId=sb-1", 400, `"field":"sandboxId"`},
		{"GET", url + "/v1/sandboxes/sb-2/files/content?path=/a&sandbox_id=sb-1", 400, `"field":"sandbox_id"`},
		{"PUT", base + "/a&mode=0644", 400, `"field":"mode"`},
		{"PUT", base + "/a&createParents=maybe", 400, `"field":"createParents"`},
		// Out of the field's range: named, not left to protojson
		// (whose error named "query").
		{"GET", base + "/a&offsetBytes=-5", 400, `"field":"offsetBytes"`},
		{"GET", base + "/a&limitBytes=18446744073709551616", 400, `"field":"limitBytes"`},
		{"PUT", base + "/a&mode=4294967296", 400, `"field":"mode"`},
	} {
		resp, body, _ := do(t, tc.method, tc.url, strings.NewReader("x"))
		if resp.StatusCode != tc.code || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(strings.ReplaceAll(string(body), " ", ""), tc.want) {
			t.Errorf("%s %s: %s %s; want %d with %s", tc.method, tc.url, resp.Status, body, tc.code, tc.want)
		}
	}
}

// TestNoResumeHeader: the berth-no-resume header reaches the call as its
// metadata, every value of it (twice is refused there): berthd serves
// these routes itself, and a GET of a paused sandbox's file with
// "berth-no-resume: true" resumed it.
func TestNoResumeHeader(t *testing.T) {
	f, url := serve(t)
	for _, values := range [][]string{{"true"}, {"true", "true"}, nil} {
		req, _ := http.NewRequest("PUT", url+"/v1/sandboxes/sb-1/files/content?path=/b", strings.NewReader("x"))
		for _, v := range values {
			req.Header.Add(resume.Header, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-f.started
		if w := <-f.writes; !slices.Equal(w.resume, values) {
			t.Errorf("header %s: %q, WriteFile's metadata held %q", resume.Header, values, w.resume)
		}
	}
}

// TestTraceContextHeaders: a call made through these routes carries the
// request's W3C Trace Context (traceparent, tracestate) as its metadata, as
// a gRPC or Connect call does, so berthd's span of it joins the caller's
// trace; only the Authorization header was passed on.
func TestTraceContextHeaders(t *testing.T) {
	f, url := serve(t)
	const parent, state = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "berth=t61rcWkgMzE"
	req, _ := http.NewRequest("PUT", url+"/v1/sandboxes/sb-1/files/content?path=/b", strings.NewReader("x"))
	req.Header.Set("traceparent", parent)
	req.Header.Set("tracestate", state)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	<-f.started
	if w := <-f.writes; !slices.Equal(w.trace, []string{parent, state}) {
		t.Errorf("WriteFile's trace metadata %q, want %q", w.trace, []string{parent, state})
	}
}

// TestRawUploadCutOff: an upload whose body ends before its end — a
// Content-Length not reached, a chunked body without its last chunk —
// never closes WriteFile's stream as whole: the call fails.
func TestRawUploadCutOff(t *testing.T) {
	f, url := serve(t)
	for _, framing := range []string{"Transfer-Encoding: chunked\r\n", "Content-Length: 100000\r\n"} {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "PUT /v1/sandboxes/sb-1/files/content?path=/b HTTP/1.1\r\nHost: x\r\n%s\r\n", framing)
		if strings.HasPrefix(framing, "Transfer") {
			fmt.Fprintf(c, "%x\r\n", 5000)
		}
		c.Write(make([]byte, 5000))
		// Cut once the call is under way (before it, the request's
		// context ends with the connection, and nothing is called).
		select {
		case <-f.started:
		case <-time.After(time.Minute):
			t.Fatalf("upload (%s): WriteFile did not start within a minute", strings.TrimSpace(framing))
		}
		c.Close()
		select {
		case w := <-f.writes:
			if w.err == nil {
				t.Errorf("upload cut off (%s): WriteFile's stream ended whole with %d bytes", strings.TrimSpace(framing), len(w.data))
			}
		case <-time.After(time.Minute):
			t.Fatalf("upload cut off (%s): WriteFile did not end within a minute", strings.TrimSpace(framing))
		}
	}
}

// TestJSONLines: AttachExec's events come as JSON lines, and its failure
// after them as a last line {"error": ...}.
func TestJSONLines(t *testing.T) {
	_, url := serve(t)
	resp, body, _ := do(t, "GET", url+"/v1/sandboxes/sb-1/execs/ex-1/events?sinceSeq=4", nil)
	var lines []string
	for sc := bufio.NewScanner(bytes.NewReader(body)); sc.Scan(); {
		lines = append(lines, strings.ReplaceAll(sc.Text(), " ", ""))
	}
	if resp.Header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 3 ||
		!strings.Contains(lines[0], `"seq":"5"`) || !strings.Contains(lines[1], `"seq":"6"`) ||
		!strings.HasPrefix(lines[2], `{"error":{"code":10`) || !strings.Contains(lines[2], `"reason":"RUNTIME_REPLACED"`) {
		t.Errorf("events: %s %q; want two events from seq 5 and the error line", resp.Header.Get("Content-Type"), lines)
	}
}
