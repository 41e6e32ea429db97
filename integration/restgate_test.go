package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// rawFiles runs docs/http.md's raw body recipes (TestHTTPDocRecipes): 64
// MiB up and back byte-exact through curl, a tar archive down and up;
// then checks that an upload cut off leaves the old file, both with a
// Content-Length and chunked, and that another principal's sandbox gets
// the very error of a missing one.
func rawFiles(t *testing.T, e *berthEnv, url, sb, dir string, run func(string) string, want func(string, string, ...string)) {
	t.Helper()
	out := run("rawfile")
	big, err := os.ReadFile(filepath.Join(dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(big)
	hexSum := hex.EncodeToString(sum[:])
	if len(big) != 64<<20 {
		t.Fatalf("recipe rawfile wrote %d bytes, want 64 MiB", len(big))
	}
	want("rawfile", out, `"writtenBytes":"67108864"`, `"sha256":"`+hexSum+`"`, hexSum+"  big.bin", hexSum+"  back.bin")

	out = run("archive")
	want("archive", out, `"files":"6"`)
	got := readSandboxFile(t, e, sb, "/tmp/etc-copy/shells")
	shells, err := os.ReadFile("../build/rootfs/etc/shells")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(shells) {
		t.Errorf("/etc/shells through the archive routes: %q, want %q", got, shells)
	}

	// Cut-off uploads: 3 MiB of a body said to be 64 MiB, and 3 MiB of a
	// chunked body without its last chunk; then the connection closes.
	addr := strings.TrimPrefix(url, "http://")
	for _, framing := range []string{"Content-Length: 67108864\r\n", "Transfer-Encoding: chunked\r\n"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "PUT /v1/sandboxes/%s/files/content?path=/tmp/raw/big.bin HTTP/1.1\r\nHost: berthd\r\nAuthorization: Bearer %s\r\n%s\r\n", sb, httpToken, framing)
		part := make([]byte, 3<<20)
		if strings.HasPrefix(framing, "Transfer") {
			fmt.Fprintf(c, "%x\r\n", len(part))
		}
		if _, err := c.Write(part); err != nil {
			t.Fatal(err)
		}
		// The agent's temporary file shows the write under way; it goes
		// when the cut call ended.
		waitTempFile(t, e, sb, true)
		c.Close()
		waitTempFile(t, e, sb, false)
		back := readSandboxFile(t, e, sb, "/tmp/raw/big.bin")
		if sha256.Sum256(back) != sum {
			t.Errorf("after an upload cut off (%s): /tmp/raw/big.bin is %d bytes, not the old content", strings.TrimSpace(framing), len(back))
		}
	}

	// Another principal's sandbox: the same status and body as a missing
	// one's, the sandbox id aside.
	get := func(token, sandbox string) (int, string) {
		req, _ := http.NewRequest("GET", url+"/v1/sandboxes/"+sandbox+"/files/content?path=/etc/shells", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.ReplaceAll(string(b), sandbox, "SB")
	}
	otherCode, otherBody := get(otherToken, sb)
	missingCode, missingBody := get(httpToken, "no-such-sandbox")
	if otherCode != 404 || otherBody != missingBody || !strings.Contains(otherBody, `"reason":"SANDBOX_NOT_FOUND"`) {
		t.Errorf("ReadFile raw of another principal's sandbox: %d %s\nof a missing one: %d %s\nwant the same 404 SANDBOX_NOT_FOUND", otherCode, otherBody, missingCode, missingBody)
	}
	want("rawnotfound", run("rawnotfound"), "HTTP 404", `"reason":"SANDBOX_NOT_FOUND"`)
}

// readSandboxFile reads a sandbox file over gRPC.
func readSandboxFile(t *testing.T, e *berthEnv, sb, path string) []byte {
	t.Helper()
	stream, err := berthv1.NewFileServiceClient(e.conn).ReadFile(context.Background(), &berthv1.ReadFileRequest{SandboxId: sb, Location: &berthv1.ReadFileRequest_Path{Path: path}})
	if err != nil {
		t.Fatal(err)
	}
	return []byte(readAll(t, stream))
}

// waitTempFile waits (at most a minute) until /tmp/raw holds a WriteFile
// temporary file (present) or none (!present).
func waitTempFile(t *testing.T, e *berthEnv, sb string, present bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		stream, err := berthv1.NewFileServiceClient(e.conn).ListDir(context.Background(), &berthv1.ListDirRequest{SandboxId: sb, Location: &berthv1.ListDirRequest_Path{Path: "/tmp/raw"}})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for {
			m, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range m.GetEntries() {
				if strings.HasSuffix(string(f.GetPath()), ".tmp") && strings.Contains(string(f.GetPath()), ".berth-") {
					found = true
				}
			}
		}
		if found == present {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/tmp/raw: a temporary file present is %v after a minute, want %v", found, present)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// jsonLines runs docs/http.md's JSON lines recipe, then attaches to a
// running cat over REST and sees each output event as it comes: the line
// arrives while cat still runs, before its stdin closes.
func jsonLines(t *testing.T, e *berthEnv, url, sb string, run func(string) string, want func(string, string, ...string)) {
	t.Helper()
	out := run("events")
	want("events", out, `"started":{"execId":"ticks-1"`, `"data":"dHdvCg=="`, `"exitCode":0`)
	if strings.Contains(out, `"data":"b25lCg=="`) {
		t.Errorf("recipe events from seq 1: want two and not one:\n%s", out)
	}

	ctx := context.Background()
	start, err := e.sandboxes.StartExec(ctx, &berthv1.StartExecRequest{SandboxId: sb, ExecId: "cat-lines", Process: &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := start.Recv(); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", url+"/v1/sandboxes/"+sb+"/execs/cat-lines/events?sinceSeq=0", nil)
	req.Header.Set("Authorization", "Bearer "+httpToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("attach over REST: %s %s, want 200 application/x-ndjson", resp.Status, ct)
	}
	lines := bufio.NewScanner(resp.Body)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("attach over REST: the stream ended early: %v", lines.Err())
		}
		return lines.Text()
	}
	if l := next(); !strings.Contains(l, `"started"`) {
		t.Fatalf("attach over REST: first line %s, want started", l)
	}
	for i, word := range []string{"ping\n", "pong\n"} {
		if _, err := e.sandboxes.WriteExecStdin(ctx, &berthv1.WriteExecStdinRequest{SandboxId: sb, ExecId: "cat-lines", Offset: uint64(5 * i), Data: []byte(word)}); err != nil {
			t.Fatal(err)
		}
		// cat still runs (its stdin is open): this line came as the
		// output did, not at the end.
		l := next()
		if m := regexp.MustCompile(`"data": *"([^"]*)"`).FindStringSubmatch(l); m == nil || m[1] != base64.StdEncoding.EncodeToString([]byte(word)) {
			t.Fatalf("attach over REST: line %s, want the output %q", l, word)
		}
	}
	if _, err := e.sandboxes.WriteExecStdin(ctx, &berthv1.WriteExecStdinRequest{SandboxId: sb, ExecId: "cat-lines", Offset: 10, CloseStdin: true}); err != nil {
		t.Fatal(err)
	}
	for l := next(); !strings.Contains(l, `"exited"`); l = next() {
		if strings.Contains(l, `"error"`) {
			t.Fatalf("attach over REST: %s", l)
		}
	}
}
