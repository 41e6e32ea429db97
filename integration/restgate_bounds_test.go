package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
)

// TestHTTPRawStreamBounds checks the bounds of raw HTTP file streams
// (docs/http.md, "Bounds"): a principal past --max-raw-streams-per-principal
// (1 here) gets 429 FLEET_BUSY PRINCIPAL_RAW_STREAMS while another
// principal is not counted; a client that never reads its download is cut
// after --http-stream-stall (3 s here), which frees its stream; a client
// that stops sending its upload's body is cut too, storing nothing; and a
// client that reads slowly, pausing for less than the stall, gets every
// byte.
func TestHTTPRawStreamBounds(t *testing.T) {
	need(t)
	e, url := startTokenBerthd(t, "rawbounds", auth.TokenHash(httpToken)+" web\n"+auth.TokenHash(otherToken)+" other\n", "--max-raw-streams-per-principal", "1", "--http-stream-stall", "3s")
	sb := "raw-" + strings.ToLower(xid(t)[len(xid(t))-6:])
	httpCall(t, url, httpToken, "POST", "/berth.v1.SandboxService/CreateSandbox", fmt.Sprintf(`{"sandboxId": %q, "image": %q}`, sb, env.image), 200)
	t.Cleanup(func() {
		e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb})
	})
	const bigBytes = 32 << 20
	big := make([]byte, bigBytes)
	rand.Read(big)
	httpCall(t, url, httpToken, "PUT", "/v1/sandboxes/"+sb+"/files/content?path=/tmp/raw/big.bin&createParents=true", string(big), 200)
	addr := strings.TrimPrefix(url, "http://")

	// A download its client never reads past the header.
	stuck := rawRequest(t, addr, "GET", "/v1/sandboxes/"+sb+"/files/content?path=/tmp/raw/big.bin", "")
	br := bufio.NewReaderSize(stuck, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stuck download: %v %v", resp, err)
	}

	// Its principal is at its cap; another principal is not counted (its
	// call reaches the handler: the sandbox is not its).
	code, body := httpDo(t, url, httpToken, "GET", "/v1/sandboxes/"+sb+"/files/content?path=/etc/shells", "")
	if code != 429 || !strings.Contains(body, `"reason":"FLEET_BUSY"`) || !strings.Contains(body, "CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS") ||
		!strings.Contains(body, `principal \"web\" has 1 of at most 1 raw HTTP file streams open`) {
		t.Errorf("a second raw stream of the same principal: %d %s\nwant 429 FLEET_BUSY CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS", code, body)
	}
	if code, body := httpDo(t, url, otherToken, "GET", "/v1/sandboxes/"+sb+"/files/content?path=/etc/shells", ""); code != 404 {
		t.Errorf("another principal's raw stream: %d %s, want 404 (not counted against web's cap)", code, body)
	}

	// The stall cuts the stuck download: the principal's next stream is
	// admitted, and the stuck client gets fewer bytes than Content-Length.
	if !poll(2*time.Minute, func() bool {
		code, _ := httpDo(t, url, httpToken, "GET", "/v1/sandboxes/"+sb+"/files/content?path=/etc/shells", "")
		return code == 200
	}) {
		t.Fatal("the stuck download was not cut within 2 min (--http-stream-stall 3s): its principal's next raw stream is still refused")
	}
	stuck.SetReadDeadline(time.Now().Add(time.Minute))
	n, err := io.Copy(io.Discard, resp.Body)
	if n >= bigBytes || err == nil {
		t.Errorf("the stuck download got %d of %d bytes and ended with %v; want it cut short", n, bigBytes, err)
	}
	stuck.Close()

	// An upload whose client stops sending: cut, nothing stored.
	up := rawRequest(t, addr, "PUT", "/v1/sandboxes/"+sb+"/files/content?path=/tmp/raw/big.bin", "Content-Length: 67108864\r\n")
	if _, err := up.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	up.SetReadDeadline(time.Now().Add(2 * time.Minute))
	resp, err = http.ReadResponse(bufio.NewReader(up), nil)
	if err != nil {
		t.Fatalf("stalled upload: no answer within 2 min (--http-stream-stall 3s): %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 499 || !strings.Contains(string(b), "nothing was stored") {
		t.Errorf("stalled upload: %d %s, want 499 CANCELED, nothing was stored", resp.StatusCode, b)
	}
	up.Close()
	if back := readSandboxFile(t, e, sb, "/tmp/raw/big.bin"); !bytes.Equal(back, big) {
		t.Errorf("after a stalled upload /tmp/raw/big.bin is %d bytes, not the old content", len(back))
	}

	// A slow reader: 2 MiB, then a pause of 1 s (a third of the stall),
	// until the end: every byte, in order.
	slow := rawRequest(t, addr, "GET", "/v1/sandboxes/"+sb+"/files/content?path=/tmp/raw/big.bin", "")
	defer slow.Close()
	resp, err = http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("slow download: %v %v", resp, err)
	}
	var got bytes.Buffer
	for {
		slow.SetReadDeadline(time.Now().Add(time.Minute))
		n, err := io.CopyN(&got, resp.Body, 2<<20)
		if err == io.EOF || (err == nil && n == 0) {
			break
		}
		if err != nil {
			t.Fatalf("slow download after %d bytes: %v", got.Len(), err)
		}
		time.Sleep(time.Second)
	}
	if got.Len() != bigBytes || sha256.Sum256(got.Bytes()) != sha256.Sum256(big) {
		t.Errorf("slow download: %d bytes, want the %d written, byte-exact", got.Len(), bigBytes)
	}
}

// rawRequest opens a TCP connection to addr and sends an HTTP/1.1 request
// head (with httpToken, and extra header lines); the caller sends any body.
func rawRequest(t *testing.T, addr, method, path, extra string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: berthd\r\nAuthorization: Bearer %s\r\n%s\r\n", method, path, httpToken, extra)
	return c
}

// httpDo makes one HTTP/1.1 call with token and returns its status and
// body.
func httpDo(t *testing.T, url, token, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// httpCall is httpDo failing the test unless the status is want.
func httpCall(t *testing.T, url, token, method, path, body string, want int) string {
	t.Helper()
	code, out := httpDo(t, url, token, method, path, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, code, out, want)
	}
	return out
}
