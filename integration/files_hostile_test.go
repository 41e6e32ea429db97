package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
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

// fileErrorShape fails unless err is a status with code, an ErrorInfo of
// reason and a message, and (when field is set) a BadRequest naming field.
func fileErrorShape(t *testing.T, what string, err error, code codes.Code, reason, field string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != code || rpcstatus.Reason(err) != reason || st.Message() == "" {
		t.Errorf("%s: error %v (reason %q), want %v %s with a message", what, err, rpcstatus.Reason(err), code, reason)
		return
	}
	if field != "" && badRequestField(err) != field {
		t.Errorf("%s: BadRequest blames %q, want %q", what, badRequestField(err), field)
	}
}

// workspaceEntries lists /workspace/<dir> by running ls in the sandbox.
func workspaceEntries(t *testing.T, id, dir string) string {
	t.Helper()
	return strings.TrimSpace(string(run(t, id, "ls", "-A", "/workspace/"+dir).GetStdout()))
}

// TestWriteFileProtocolMisuse drives WriteFile and Upload through berthd
// the wrong ways: no header, a chunk first, two headers, more bytes than
// declared, a caller that gives up mid-stream. Each is a named error, and
// none leaves a file or a temporary file behind.
func TestWriteFileProtocolMisuse(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	run(t, id, "mkdir", "/workspace/m")
	fc := berthv1.NewFileServiceClient(env.conn)
	header := func(size *uint64) *berthv1.WriteFileRequest {
		return &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Header{Header: &berthv1.WriteFileHeader{
			SandboxId: id, Location: &berthv1.WriteFileHeader_Path{Path: "/workspace/m/f"}, SizeBytes: size}}}
	}
	chunk := func(b string) *berthv1.WriteFileRequest {
		return &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Chunk{Chunk: []byte(b)}}
	}
	write := func(msgs ...*berthv1.WriteFileRequest) error {
		stream, err := fc.WriteFile(fileCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				break // berthd ended the stream; CloseAndRecv has why
			}
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	three := uint64(3)
	huge := uint64(1 << 50)
	fileErrorShape(t, "no message", write(), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "chunk first", write(chunk("x"), header(nil)), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "two headers", write(header(nil), chunk("abc"), header(nil), chunk("def")), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "more than declared", write(header(&three), chunk("abcde")), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header.size_bytes")
	fileErrorShape(t, "fewer than declared", write(header(&three), chunk("a")), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header.size_bytes")
	fileErrorShape(t, "over the cap", write(header(&huge), chunk("a")), codes.FailedPrecondition, rpcstatus.ReasonFileTooLarge, "")
	// An owner the sandbox's user namespace does not map (it maps 65,536
	// ids): refused up front, naming the field (it was INTERNAL, from
	// chown(2)'s EINVAL after the bytes were written).
	unmapped := uint32(70000)
	owned := func(uid, gid *uint32) *berthv1.WriteFileRequest {
		h := header(nil)
		h.GetHeader().Uid, h.GetHeader().Gid = uid, gid
		return h
	}
	fileErrorShape(t, "unmapped uid", write(owned(&unmapped, nil), chunk("abc")), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header.uid")
	fileErrorShape(t, "unmapped gid", write(owned(nil, &unmapped), chunk("abc")), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header.gid")
	if got := workspaceEntries(t, id, "m"); got != "" {
		t.Errorf("left by the refused writes: %q", got)
	}

	// A caller that gives up mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := fc.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(header(nil))
	stream.Send(chunk(strings.Repeat("x", 1<<20)))
	// Until the agent made its temporary file: without one, the cleanup
	// checked below would prove nothing.
	if !poll(10*time.Second, func() bool { return workspaceEntries(t, id, "m") != "" }) {
		cancel()
		t.Fatal("the agent made no temporary file for a write in progress within 10 s")
	}
	deadline := time.Now().Add(10 * time.Second)
	cancel()
	for {
		left := workspaceEntries(t, id, "m")
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a canceled write /workspace/m holds %q", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if left := workspaceEntries(t, id, "m"); left != "" {
		t.Errorf("after the misused writes /workspace/m holds %q, want nothing", left)
	}

	upload := func(msgs ...*berthv1.UploadRequest) error {
		stream, err := fc.Upload(fileCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				break
			}
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	uh := &berthv1.UploadRequest{Part: &berthv1.UploadRequest_Header{Header: &berthv1.UploadHeader{SandboxId: id, Location: &berthv1.UploadHeader_Path{Path: "/workspace/u"}}}}
	uc := &berthv1.UploadRequest{Part: &berthv1.UploadRequest_Chunk{Chunk: []byte("not a tar")}}
	fileErrorShape(t, "upload without messages", upload(), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "upload chunk first", upload(uc), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "upload two headers", upload(uh, uh), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "header")
	fileErrorShape(t, "upload of garbage", upload(uh, uc), codes.InvalidArgument, rpcstatus.ReasonArchiveInvalid, "")
}

// TestConcurrentWritersSamePath has 8 writers replace one file at once:
// each succeeds, the file ends up as exactly one writer's content, and no
// temporary file is left.
func TestConcurrentWritersSamePath(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	const writers = 8
	sums := make(map[string]bool)
	datas := make([][]byte, writers)
	for i := range datas {
		datas[i] = randomData(300<<10 + i)
		sums[hexSHA(datas[i])] = true
	}
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			_, err := c.WriteFile(fileCtx(t), id, "/workspace/c/same", bytes.NewReader(datas[i]), client.WithCreateParents())
			errs <- err
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Errorf("concurrent WriteFile: %v", err)
		}
	}
	if got := sandboxSHA(t, id, "/workspace/c/same"); !sums[got] {
		t.Errorf("file after concurrent writes has sha %s, which no writer wrote", got)
	}
	if left := workspaceEntries(t, id, "c"); left != "same" {
		t.Errorf("/workspace/c holds %q, want only the file", left)
	}
}

// TestListDirLargeTree lists and downloads, recursively, 10 000 files whose paths are
// nearly PATH_MAX long (each FileInfo carries its path twice: about 80 MB
// in all) in a sandbox limited to 64 MiB: the listing must arrive whole,
// and the agent (PID 1) must survive it, so it cannot hold the whole
// listing in memory at once.
func TestListDirLargeTree(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 64 << 20}})
	const depth, files = 15, 10_000
	var dir string
	for i := range depth {
		dir += fmt.Sprintf("%02d%s/", i, strings.Repeat("n", 248))
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s%05d%s", dir, f, strings.Repeat("f", 200)), Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	if _, err := c.Upload(fileCtx(t), sb.GetId(), "/workspace/t", &buf); err != nil {
		t.Fatalf("Upload of the tree: %v", err)
	}
	entries, errs, err := c.ListDir(fileCtx(t), sb.GetId(), "/workspace/t", depth+1)
	if err != nil || len(errs) != 0 {
		t.Fatalf("ListDir of %d entries: %v, errors %v", depth+files, err, errs)
	}
	if len(entries) != depth+files || len(entries[len(entries)-1].GetPath()) < 3900 {
		t.Errorf("ListDir = %d entries, want %d with paths of about 4000 bytes", len(entries), depth+files)
	}
	// Download walks the same tree: it must not hold it either.
	summary, err := c.Download(fileCtx(t), sb.GetId(), "/workspace/t", io.Discard)
	if err != nil || summary.GetEntries() != depth+files {
		t.Errorf("Download of the tree = %v, %v; want %d entries", summary, err, depth+files)
	}
	after, err := c.GetSandbox(fileCtx(t), sb.GetId())
	if err != nil || after.GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId() {
		t.Errorf("after the listing and download the sandbox runs %v (%v), want the same agent %s", after.GetRuntime(), err, sb.GetRuntime().GetAgentBootId())
	}
}
