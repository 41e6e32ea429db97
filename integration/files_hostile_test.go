package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"strings"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestUploadHeaderBomb uploads a 0.4 MB gzip archive of 400 directory
// entries whose pax headers carry 1 MiB of records each: 400 MiB once
// decompressed. The agent must not hold what it does not need: the upload
// succeeds in a sandbox limited to 128 MiB, and the agent (PID 1, whose
// death kills every process in the sandbox) survives it.
func TestUploadHeaderBomb(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 128 << 20}})
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	pad := strings.Repeat("p", 1000<<10)
	const dirs = 400
	for i := range dirs {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("d%03d/", i), Mode: 0o755, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"BERTH.pad": pad}}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	archive := buf.Len()
	resp, err := c.Upload(fileCtx(t), sb.GetId(), "/workspace/bomb", &buf)
	if err != nil {
		t.Fatalf("Upload of a %d-byte archive of %d large headers: %v", archive, dirs, err)
	}
	if resp.GetDirectories() != dirs {
		t.Errorf("Upload = %v, want %d directories", resp, dirs)
	}
	after, err := c.GetSandbox(fileCtx(t), sb.GetId())
	if err != nil || after.GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId() {
		t.Errorf("after the upload the sandbox runs %v (%v), want the same agent %s", after.GetRuntime(), err, sb.GetRuntime().GetAgentBootId())
	}
	entries, _, err := c.ListDir(fileCtx(t), sb.GetId(), "/workspace/bomb", 1)
	if err != nil || len(entries) != dirs {
		t.Errorf("ListDir after the upload = %d entries, %v; want %d", len(entries), err, dirs)
	}
}
