package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// dialClient returns the public Go client connected to the test berthd.
func fileCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// randomData returns n random bytes, with NUL and 0xFF at both ends.
func randomData(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	if n >= 4 {
		b[0], b[1], b[n-2], b[n-1] = 0x00, 0xff, 0xff, 0x00
	}
	return b
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// hashWriter hashes and counts what is written to it.
type hashWriter struct {
	h hash.Hash
	n int
}

func newHashWriter() *hashWriter { return &hashWriter{h: sha256.New()} }

func (w *hashWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return w.h.Write(p)
}

func (w *hashWriter) sum() string { return hex.EncodeToString(w.h.Sum(nil)) }

// sandboxSHA runs sha256sum on path inside the sandbox.
func sandboxSHA(t *testing.T, sandboxID, path string) string {
	t.Helper()
	r := run(t, sandboxID, "sha256sum", path)
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("sha256sum %s: exit %d: %s", path, r.GetResult().GetExitCode(), r.GetStderr())
	}
	sum, _, _ := strings.Cut(string(r.GetStdout()), " ")
	return sum
}

// wantFileError fails unless err is a *client.Error with code and reason
// naming path (when path is not empty).
func wantFileError(t *testing.T, err error, code codes.Code, reason, path string) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code || ce.Reason != reason {
		t.Fatalf("error = %v, want %v %s", err, code, reason)
	}
	if path != "" && ce.Metadata["path"] != path {
		t.Errorf("error %v names path %q, want %q", err, ce.Metadata["path"], path)
	}
	return ce
}

// TestFilesRoundTrip writes random binary files through the public API,
// reads them back, and checks the SHA-256 three ways: the write response
// (asked for with WithSHA256; a write that did not ask gets none), the
// bytes read back, and sha256sum inside the sandbox.
func TestFilesRoundTrip(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	for _, size := range []int{0, 1, 18433, 1<<20 + 1, 128 << 20} {
		data := randomData(size)
		want := hexSHA(data)
		path := "/workspace/rt/data.bin"
		resp, err := c.WriteFile(fileCtx(t), sb.GetId(), path, bytes.NewReader(data), client.WithCreateParents())
		if err != nil || resp.GetWrittenBytes() != uint64(size) || resp.GetSha256() != "" {
			t.Fatalf("WriteFile %d bytes without WithSHA256 = %v, %v; want %d bytes, no sha256", size, resp, err, size)
		}
		resp, err = c.WriteFile(fileCtx(t), sb.GetId(), path, bytes.NewReader(data), client.WithSHA256())
		if err != nil {
			t.Fatalf("WriteFile %d bytes: %v", size, err)
		}
		if resp.GetWrittenBytes() != uint64(size) || resp.GetSha256() != want {
			t.Errorf("WriteFile %d bytes = %d bytes, sha %s; want sha %s", size, resp.GetWrittenBytes(), resp.GetSha256(), want)
		}
		got := newHashWriter()
		header, err := c.ReadFile(fileCtx(t), sb.GetId(), path, got)
		if err != nil {
			t.Fatalf("ReadFile %d bytes: %v", size, err)
		}
		if got.n != size || got.sum() != want || header.GetInfo().GetSizeBytes() != uint64(size) {
			t.Errorf("ReadFile = %d bytes sha %s (header size %d), want %d bytes sha %s", got.n, got.sum(), header.GetInfo().GetSizeBytes(), size, want)
		}
		if in := sandboxSHA(t, sb.GetId(), path); in != want {
			t.Errorf("sha256sum in the sandbox of the %d-byte file = %s, want %s", size, in, want)
		}
	}
}

// TestFilesOddNames sends names with spaces, emoji and bytes that are not
// UTF-8 through write, list, stat, read and remove.
func TestFilesOddNames(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	dir := "/workspace/names"
	names := []string{"with space.txt", "emoji 🚢⚓.txt", "caf\xe9-latin1", "\xff\xfe"}
	for _, name := range names {
		p := dir + "/" + name
		if _, err := c.WriteFile(ctx, sb.GetId(), p, strings.NewReader("content of "+name), client.WithCreateParents()); err != nil {
			t.Fatalf("WriteFile(%q): %v", name, err)
		}
		info, err := c.Stat(ctx, sb.GetId(), p)
		if err != nil || string(info.GetName()) != name || string(info.GetPath()) != p {
			t.Errorf("Stat(%q) = %v, %v", name, info, err)
		}
		var buf bytes.Buffer
		if _, err := c.ReadFile(ctx, sb.GetId(), p, &buf); err != nil || buf.String() != "content of "+name {
			t.Errorf("ReadFile(%q) = %q, %v", name, buf.String(), err)
		}
	}
	entries, errs, err := c.ListDir(ctx, sb.GetId(), dir, 1)
	if err != nil || len(errs) > 0 {
		t.Fatalf("ListDir: %v %v", err, errs)
	}
	var got, display []string
	for _, e := range entries {
		got = append(got, string(e.GetName()))
		display = append(display, e.GetDisplayName())
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ListDir names = %q, want %q", got, want)
	}
	if !slices.Contains(display, `caf\xe9-latin1`) || !slices.Contains(display, `\xff\xfe`) {
		t.Errorf("display names %q lack the escaped forms", display)
	}
	// The sandbox sees the same bytes.
	r := run(t, sb.GetId(), "ls", dir)
	if gotLs := strings.Split(strings.TrimSpace(string(r.GetStdout())), "\n"); len(gotLs) != len(names) {
		t.Errorf("ls in the sandbox = %q, want %d names", r.GetStdout(), len(names))
	}
	for _, name := range names {
		if err := c.Remove(ctx, sb.GetId(), dir+"/"+name, false); err != nil {
			t.Errorf("Remove(%q): %v", name, err)
		}
	}
	if entries, _, err := c.ListDir(ctx, sb.GetId(), dir, 1); err != nil || len(entries) != 0 {
		t.Errorf("ListDir after removing = %v, %v; want empty", entries, err)
	}
}

// TestFilesSymlinks checks stat and recursive listing of a relative, a
// dangling and a looping symlink, and a link to a parent directory that
// would loop a listing that followed it.
func TestFilesSymlinks(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	r := run(t, sb.GetId(), "sh", "-c", "mkdir -p /workspace/l/d && echo x > /workspace/l/d/f && cd /workspace/l && ln -s d/f rel && ln -s missing dangling && ln -s loop loop && ln -s .. d/up")
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("setup: %s", r.GetStderr())
	}
	for name, target := range map[string]string{"rel": "d/f", "dangling": "missing", "loop": "loop"} {
		info, err := c.Stat(ctx, sb.GetId(), "/workspace/l/"+name)
		if err != nil || info.GetType() != berthv1.FileType_FILE_TYPE_SYMLINK || string(info.GetSymlinkTarget()) != target {
			t.Errorf("Stat(%s) = %v, %v; want a symlink to %q", name, info, err, target)
		}
	}
	entries, _, err := c.ListDir(ctx, sb.GetId(), "/workspace/l", 50)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, strings.TrimPrefix(string(e.GetPath()), "/workspace/l/")+"="+e.GetType().String())
	}
	want := []string{"d=FILE_TYPE_DIRECTORY", "d/f=FILE_TYPE_REGULAR", "d/up=FILE_TYPE_SYMLINK", "dangling=FILE_TYPE_SYMLINK", "loop=FILE_TYPE_SYMLINK", "rel=FILE_TYPE_SYMLINK"}
	if !slices.Equal(got, want) {
		t.Errorf("recursive ListDir = %q, want %q", got, want)
	}
	_, err = c.ReadFile(ctx, sb.GetId(), "/workspace/l/dangling", io.Discard)
	wantFileError(t, err, codes.NotFound, "FILE_NOT_FOUND", "/workspace/l/dangling")
}

// TestFilesErrors checks the errors named in the API, each naming its
// path, and that a write through a regular file creates nothing.
func TestFilesErrors(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	if _, err := c.WriteFile(ctx, sb.GetId(), "/workspace/file", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Stat(ctx, sb.GetId(), "/workspace/missing")
	wantFileError(t, err, codes.NotFound, "FILE_NOT_FOUND", "/workspace/missing")
	_, err = c.WriteFile(ctx, sb.GetId(), "/workspace/file/a/b", strings.NewReader("x"), client.WithCreateParents())
	wantFileError(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "/workspace/file")
	_, err = c.WriteFile(ctx, sb.GetId(), "/workspace", strings.NewReader("x"))
	wantFileError(t, err, codes.FailedPrecondition, "IS_A_DIRECTORY", "/workspace")
	_, err = c.ReadFile(ctx, sb.GetId(), "/workspace", io.Discard)
	wantFileError(t, err, codes.FailedPrecondition, "IS_A_DIRECTORY", "/workspace")
	_, err = c.WriteFile(ctx, sb.GetId(), "/workspace/x/y/file", strings.NewReader("x")) // no create parents
	wantFileError(t, err, codes.NotFound, "FILE_NOT_FOUND", "/workspace/x/y/file")
	err = c.Remove(ctx, sb.GetId(), "/workspace", false)
	wantFileError(t, err, codes.FailedPrecondition, "DIRECTORY_NOT_EMPTY", "/workspace")
	// The agent binary is mounted read-only.
	_, err = c.WriteFile(ctx, sb.GetId(), "/.berth-agent", strings.NewReader("x"), client.WithAppend())
	if ce := (*client.Error)(nil); !errors.As(err, &ce) || ce.Code == codes.OK || ce.Code == codes.Internal {
		t.Errorf("append to the read-only agent binary: %v, want a named error", err)
	}
	entries, _, err := c.ListDir(ctx, sb.GetId(), "/workspace", 10)
	if err != nil || len(entries) != 1 || string(entries[0].GetName()) != "file" {
		t.Errorf("/workspace after failed writes = %v, %v; want only file", entries, err)
	}
	// Invalid requests name the field.
	_, err = c.Stat(ctx, sb.GetId(), "relative")
	if ce := wantFileError(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", ""); len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != "path" {
		t.Errorf("field violations %v, want path", ce.FieldViolations)
	}
	_, err = c.Stat(ctx, "no-such-sandbox", "/")
	wantFileError(t, err, codes.NotFound, "SANDBOX_NOT_FOUND", "")
}

// TestFilesModeAndOwner checks, in a sandbox whose workload user is
// 1000:1000, that mode 0640 is applied exactly and that the file and the
// parents created for it belong to the workload user — and that the user's
// permissions hold: it cannot write where only root may.
func TestFilesModeAndOwner(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000"})
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	resp, err := c.WriteFile(ctx, sb.GetId(), "/workspace/m1/m2/f", strings.NewReader("x"), client.WithMode(0o640), client.WithCreateParents())
	if err != nil {
		t.Fatal(err)
	}
	if info := resp.GetInfo(); info.GetMode() != 0o640 || info.GetUid() != 1000 || info.GetGid() != 1000 {
		t.Errorf("written file = mode %o owner %d:%d, want 640 and the workload user 1000:1000", info.GetMode(), info.GetUid(), info.GetGid())
	}
	r := run(t, sb.GetId(), "stat", "-c", "%n %a %u:%g", "/workspace/m1", "/workspace/m1/m2", "/workspace/m1/m2/f")
	want := "/workspace/m1 755 1000:1000\n/workspace/m1/m2 755 1000:1000\n/workspace/m1/m2/f 640 1000:1000\n"
	if string(r.GetStdout()) != want {
		t.Errorf("stat in the sandbox = %q, want %q", r.GetStdout(), want)
	}
	_, err = c.WriteFile(ctx, sb.GetId(), "/etc/berth-test", strings.NewReader("x"))
	wantFileError(t, err, codes.PermissionDenied, "PERMISSION_DENIED", "/etc/berth-test")
	if r := run(t, sb.GetId(), "sh", "-c", "test -e /etc/berth-test && echo exists || echo absent"); string(r.GetStdout()) != "absent\n" {
		t.Errorf("/etc/berth-test after the refused write: %q, want absent", r.GetStdout())
	}
}

// TestFilesChangedDuringRead truncates a file in the sandbox while it is
// being read: the read must fail with FILE_CHANGED, not end short.
func TestFilesChangedDuringRead(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	path := "/workspace/changing"
	if _, err := c.WriteFile(fileCtx(t), sb.GetId(), path, bytes.NewReader(randomData(128<<20))); err != nil {
		t.Fatal(err)
	}
	files := berthv1.NewFileServiceClient(env.conn)
	stream, err := files.ReadFile(fileCtx(t), &berthv1.ReadFileRequest{SandboxId: sb.GetId(), Location: &berthv1.ReadFileRequest_Path{Path: path}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetHeader().GetLengthBytes() != 128<<20 {
		t.Fatalf("first message = %v, %v; want the header of 128 MiB", first, err)
	}
	// Flow control holds the agent back while this test does not read.
	if r := run(t, sb.GetId(), "sh", "-c", ": > "+path); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("truncate: %s", r.GetStderr())
	}
	var got int
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatalf("ReadFile ended OK after %d of %d bytes of a truncated file", got, 128<<20)
		}
		if err != nil {
			if status.Code(err) != codes.Aborted || rpcstatus.Reason(err) != "FILE_CHANGED" {
				t.Fatalf("ReadFile of a truncated file: %v, want ABORTED FILE_CHANGED", err)
			}
			t.Logf("after %d bytes: %v", got, err)
			return
		}
		got += len(msg.GetChunk())
	}
}

// TestFilesTarEscapes uploads archives that try to write outside their
// directory; each is refused naming the entry, and nothing appears
// outside. Symlinks that lead out are kept as they are (a target is data);
// a device node is skipped and listed (no CAP_MKNOD in a sandbox).
func TestFilesTarEscapes(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	if r := run(t, sb.GetId(), "sh", "-c", "mkdir -p /outside /workspace/dest && ln -s /outside /workspace/dest/abs && ln -s ../../outside /workspace/dest/rel"); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("setup: %s", r.GetStderr())
	}
	upload := func(hdrs ...tar.Header) (*berthv1.UploadResponse, error) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, hdr := range hdrs {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeReg {
				hdr.Size = 4
			}
			tw.WriteHeader(&hdr)
			if hdr.Size > 0 {
				tw.Write([]byte("evil"))
			}
		}
		tw.Close()
		return c.Upload(ctx, sb.GetId(), "/workspace/dest", &buf)
	}
	tests := []struct {
		name string
		hdrs []tar.Header
		bad  string
	}{
		{"dotdot", []tar.Header{{Name: "../../outside/a", Typeflag: tar.TypeReg}}, "../../outside/a"},
		{"absolute", []tar.Header{{Name: "/outside/b", Typeflag: tar.TypeReg}}, "/outside/b"},
		{"through absolute symlink", []tar.Header{{Name: "abs/c", Typeflag: tar.TypeReg}}, "abs/c"},
		{"through relative symlink", []tar.Header{{Name: "rel/d", Typeflag: tar.TypeReg}}, "rel/d"},
		{"dir through symlink", []tar.Header{{Name: "rel/e/", Typeflag: tar.TypeDir}}, "rel/e/"},
		{"through its own symlink", []tar.Header{{Name: "j", Typeflag: tar.TypeSymlink, Linkname: "/outside"}, {Name: "j/k", Typeflag: tar.TypeReg}}, "j/k"},
		{"hard link out", []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}, "h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := upload(tt.hdrs...)
			ce := wantFileError(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", "")
			if ce.Metadata["entry"] != tt.bad {
				t.Errorf("error names entry %q, want %q", ce.Metadata["entry"], tt.bad)
			}
		})
	}
	resp, err := upload(
		tar.Header{Name: "f", Typeflag: tar.TypeSymlink, Linkname: "/outside"},
		tar.Header{Name: "g", Typeflag: tar.TypeSymlink, Linkname: "../../outside"},
		tar.Header{Name: "i", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		tar.Header{Name: "p", Typeflag: tar.TypeFifo},
	)
	if err != nil {
		t.Fatalf("upload of symlinks that lead out, a device and a FIFO: %v", err)
	}
	if resp.GetSymlinks() != 2 || resp.GetSpecialFiles() != 1 || resp.GetSkippedCount() != 1 || len(resp.GetSkipped()) != 1 || string(resp.GetSkipped()[0]) != "i" {
		t.Errorf("Upload = %v, want 2 symlinks, 1 special file, i skipped", resp)
	}
	entries, _, err := c.ListDir(ctx, sb.GetId(), "/outside", 10)
	if err != nil || len(entries) != 0 {
		t.Errorf("/outside after the uploads = %v, %v; want empty", entries, err)
	}
	r := run(t, sb.GetId(), "sh", "-c", "ls -A /outside /workspace/dest; readlink /workspace/dest/f; readlink /workspace/dest/g; grep -c evil /etc/passwd")
	if got := string(r.GetStdout()); got != "/outside:\n\n/workspace/dest:\nabs\nf\ng\np\nrel\n/outside\n../../outside\n0\n" {
		t.Errorf("after the uploads: %q", got)
	}
}

// TestFilesUploadDownload moves a directory in as gzip tar and out again.
func TestFilesUploadDownload(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	data := randomData(3<<20 + 7)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "src/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "src/blob", Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(data))})
	tw.Write(data)
	tw.WriteHeader(&tar.Header{Name: "src/link", Typeflag: tar.TypeSymlink, Linkname: "blob"})
	tw.Close()
	resp, err := c.Upload(ctx, sb.GetId(), "/workspace/up", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFiles() != 1 || resp.GetSymlinks() != 1 || resp.GetContentBytes() != uint64(len(data)) {
		t.Errorf("Upload = %v", resp)
	}
	if got := sandboxSHA(t, sb.GetId(), "/workspace/up/src/link"); got != hexSHA(data) {
		t.Errorf("sha256sum of the uploaded file = %s, want %s", got, hexSHA(data))
	}
	var out bytes.Buffer
	sum, err := c.Download(ctx, sb.GetId(), "/workspace/up", &out)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "src/blob" {
			body, _ := io.ReadAll(tr)
			if hexSHA(body) != hexSHA(data) || h.Mode != 0o600 {
				t.Errorf("downloaded blob: sha %s mode %o", hexSHA(body), h.Mode)
			}
		}
	}
	if !slices.Equal(names, []string{"src/", "src/blob", "src/link"}) || sum.GetEntries() != 3 {
		t.Errorf("downloaded entries %q, summary %v", names, sum)
	}
}

// TestFilesWriteParentsAndOwner writes with create_parents and an
// explicit owner in a root sandbox (root without capabilities): the file
// and its parents appear, owned as asked. A regular file where a
// directory is needed is NOT_A_DIRECTORY for WriteFile with and without
// create_parents and for MakeDir.
func TestFilesWriteParentsAndOwner(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	if _, err := c.WriteFile(ctx, id, "/workspace/o/p/q.txt", strings.NewReader("q"), client.WithOwner(1234, 2345), client.WithCreateParents()); err != nil {
		t.Fatalf("WriteFile with an owner and create_parents: %v", err)
	}
	r := run(t, id, "sh", "-c", "stat -c '%u:%g %n' /workspace/o /workspace/o/p /workspace/o/p/q.txt; ls -A /workspace")
	if got, want := string(r.GetStdout()), "1234:2345 /workspace/o\n1234:2345 /workspace/o/p\n1234:2345 /workspace/o/p/q.txt\no\n"; got != want {
		t.Errorf("after the write: %q, want %q", got, want)
	}
	if _, err := c.WriteFile(ctx, id, "/workspace/f", strings.NewReader("a file")); err != nil {
		t.Fatal(err)
	}
	_, err := c.WriteFile(ctx, id, "/workspace/f/g", strings.NewReader("x"))
	wantFileError(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
	_, err = c.WriteFile(ctx, id, "/workspace/f/g", strings.NewReader("x"), client.WithCreateParents())
	wantFileError(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
	_, err = c.MakeDir(ctx, id, "/workspace/f/g", true)
	wantFileError(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
}
