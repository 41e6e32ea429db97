package files_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// oddNames are names that must survive write, list, stat, read and remove:
// spaces, emoji, and bytes that are not UTF-8.
var oddNames = []string{"with space.txt", "emoji-🚢.txt", "latin1-caf\xe9.txt", "\xff\xfe raw"}

func (a *testAgent) list(t testing.TB, path string, depth uint32) ([]*berthv1.FileInfo, []*berthv1.ListDirError) {
	t.Helper()
	stream, err := a.files.ListDir(testCtx(t), &agentv1.ListDirRequest{Path: []byte(path), MaxDepth: depth})
	if err != nil {
		t.Fatal(err)
	}
	var entries []*berthv1.FileInfo
	var errs []*berthv1.ListDirError
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return entries, errs
		}
		if err != nil {
			t.Fatalf("ListDir(%q): %v", path, err)
		}
		entries = append(entries, msg.GetBatch().GetEntries()...)
		errs = append(errs, msg.GetBatch().GetErrors()...)
	}
}

func TestOddNames(t *testing.T) {
	a := startAgent(t, "--user", "65534:65534")
	ctx := testCtx(t)
	for _, name := range oddNames {
		p := filepath.Join(a.dir, name)
		if _, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(p)}, []byte(name)); err != nil {
			t.Fatalf("WriteFile(%q): %v", name, err)
		}
		st, err := a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(p)})
		if err != nil || string(st.GetInfo().GetName()) != name || st.GetInfo().GetSizeBytes() != uint64(len(name)) {
			t.Errorf("Stat(%q) = %v, %v", name, st, err)
		}
		r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(p)})
		if err != nil || string(r.data) != name {
			t.Errorf("ReadFile(%q) = %q, %v", name, r.data, err)
		}
	}
	entries, _ := a.list(t, a.dir, 1)
	var got []string
	for _, e := range entries {
		got = append(got, string(e.GetName()))
		if !strings.Contains(e.GetDisplayName(), "\\x") && string(e.GetName()) != e.GetDisplayName() {
			t.Errorf("display name %q of %q", e.GetDisplayName(), e.GetName())
		}
	}
	want := slices.Clone(oddNames)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ListDir names = %q, want %q", got, want)
	}
	if d := entries[len(entries)-1].GetDisplayName(); d != `\xff\xfe raw` {
		t.Errorf("display name of the last entry = %q, want %q", d, `\xff\xfe raw`)
	}
	for _, name := range oddNames {
		if _, err := a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(filepath.Join(a.dir, name))}); err != nil {
			t.Errorf("Remove(%q): %v", name, err)
		}
	}
	if entries, _ := os.ReadDir(a.dir); len(entries) != 0 {
		t.Errorf("left after removing: %v", entries)
	}
}

func TestSymlinksInStatAndList(t *testing.T) {
	a := startAgent(t)
	d := a.dir
	os.MkdirAll(filepath.Join(d, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(d, "sub", "deep", "f"), []byte("x"), 0o644)
	os.Symlink("sub/deep/f", filepath.Join(d, "rel"))
	os.Symlink("nowhere", filepath.Join(d, "dangling"))
	os.Symlink("loop", filepath.Join(d, "loop"))
	os.Symlink("..", filepath.Join(d, "sub", "up")) // a directory loop if followed
	ctx := testCtx(t)
	for name, target := range map[string]string{"rel": "sub/deep/f", "dangling": "nowhere", "loop": "loop"} {
		st, err := a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(filepath.Join(d, name))})
		if err != nil {
			t.Fatalf("Stat(%s): %v", name, err)
		}
		if info := st.GetInfo(); info.GetType() != berthv1.FileType_FILE_TYPE_SYMLINK || string(info.GetSymlinkTarget()) != target {
			t.Errorf("Stat(%s) = %v, want a symlink to %q", name, info, target)
		}
	}
	entries, errs := a.list(t, d, 100)
	var got []string
	for _, e := range entries {
		got = append(got, strings.TrimPrefix(string(e.GetPath()), d+"/")+":"+strings.TrimPrefix(e.GetType().String(), "FILE_TYPE_"))
	}
	want := []string{"dangling:SYMLINK", "loop:SYMLINK", "rel:SYMLINK", "sub:DIRECTORY", "sub/deep:DIRECTORY", "sub/deep/f:REGULAR", "sub/up:SYMLINK"}
	if !slices.Equal(got, want) || len(errs) != 0 {
		t.Errorf("recursive ListDir = %q (errors %v), want %q", got, errs, want)
	}
	if entries[4].GetDepth() != 2 || entries[5].GetDepth() != 3 {
		t.Errorf("depths of sub/deep and sub/deep/f = %d, %d, want 2, 3", entries[4].GetDepth(), entries[5].GetDepth())
	}
	// Reading through a loop is a named error.
	_, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(filepath.Join(d, "loop"))})
	wantStatus(t, err, codes.FailedPrecondition, "SYMLINK_LOOP", filepath.Join(d, "loop"))
}

func TestListCapAndUnreadable(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000", "--max-list-entries", "3")
	for _, n := range []string{"a", "b"} {
		os.WriteFile(filepath.Join(a.dir, n), nil, 0o644)
	}
	os.Mkdir(filepath.Join(a.dir, "closed"), 0o700) // root's: 1000 cannot list it
	entries, errs := a.list(t, a.dir, 2)
	if len(entries) != 3 || len(errs) != 1 || errs[0].GetReason() != "PERMISSION_DENIED" {
		t.Errorf("ListDir = %d entries, errors %v; want 3 entries and PERMISSION_DENIED for closed", len(entries), errs)
	}
	os.WriteFile(filepath.Join(a.dir, "c"), nil, 0o644)
	stream, err := a.files.ListDir(testCtx(t), &agentv1.ListDirRequest{Path: []byte(a.dir)})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if msg != nil {
		t.Errorf("a listing over the cap sent %v", msg)
	}
	wantStatus(t, err, codes.FailedPrecondition, "LIST_TOO_LARGE", a.dir)
}

// TestFileChangedDuringRead truncates and grows files while they are read:
// the stream must end with FILE_CHANGED, never look complete.
func TestFileChangedDuringRead(t *testing.T) {
	a := startAgent(t)
	for _, change := range []string{"truncate", "append", "rewrite"} {
		t.Run(change, func(t *testing.T) {
			path := filepath.Join(a.dir, change)
			data := randomBytes(t, 64<<20)
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			stream, err := a.files.ReadFile(testCtx(t), &agentv1.ReadFileRequest{Path: []byte(path)})
			if err != nil {
				t.Fatal(err)
			}
			first, err := stream.Recv()
			if err != nil || first.GetHeader() == nil {
				t.Fatalf("first message %v, %v; want the header", first, err)
			}
			// The agent is held back by flow control: at most a few MiB
			// are in flight while the client does not read.
			switch change {
			case "truncate":
				err = os.Truncate(path, 32<<20)
			case "append":
				f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
				_, err = f.Write([]byte("more"))
				f.Close()
			case "rewrite":
				f, _ := os.OpenFile(path, os.O_WRONLY, 0)
				_, err = f.WriteAt([]byte("changed"), 60<<20)
				f.Close()
				later := time.Now().Add(time.Hour)
				os.Chtimes(path, later, later) // mtime granularity: make it visible
			}
			if err != nil {
				t.Fatal(err)
			}
			var got int
			for {
				msg, err := stream.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) {
						t.Fatalf("ReadFile ended OK after %d bytes while the file changed (%s)", got, change)
					}
					wantStatus(t, err, codes.Aborted, "FILE_CHANGED", path)
					return
				}
				got += len(msg.GetChunk())
			}
		})
	}
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
}

func makeTar(t testing.TB, entries []tarEntry, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body)), ModTime: time.Unix(1_700_000_000, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func (a *testAgent) upload(t testing.TB, dir string, archive []byte) (*agentv1.UploadResponse, error) {
	t.Helper()
	stream, err := a.files.Upload(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: []byte(dir)}}})
	for len(archive) > 0 {
		n := min(len(archive), 100_000)
		if err := stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Chunk{Chunk: archive[:n]}}); err != nil {
			break
		}
		archive = archive[n:]
	}
	return stream.CloseAndRecv()
}

func (a *testAgent) download(t testing.TB, path string, c berthv1.Compression) ([]byte, *berthv1.DownloadSummary, error) {
	t.Helper()
	return a.downloadRequest(t, &agentv1.DownloadRequest{Path: []byte(path), Compression: c})
}

func (a *testAgent) downloadRequest(t testing.TB, req *agentv1.DownloadRequest) ([]byte, *berthv1.DownloadSummary, error) {
	t.Helper()
	stream, err := a.files.Download(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	var sum *berthv1.DownloadSummary
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return buf, sum, nil
		}
		if err != nil {
			return buf, sum, err
		}
		if sum != nil {
			t.Fatal("a message after the summary")
		}
		buf = append(buf, msg.GetChunk()...)
		sum = msg.GetSummary()
	}
}

func TestUploadDownloadRoundTrip(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	big := string(randomBytes(t, 300_000))
	archive := makeTar(t, []tarEntry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "dir/", typ: tar.TypeDir, mode: 0o750},
		{name: "dir/big.bin", typ: tar.TypeReg, body: big, mode: 0o640},
		{name: "implicit/parent/f", typ: tar.TypeReg, body: "p"},
		{name: "dir/link", typ: tar.TypeSymlink, link: "big.bin"},
		{name: "toplink", typ: tar.TypeSymlink, link: "dir/../implicit"},
		{name: "hard", typ: tar.TypeLink, link: "dir/big.bin"},
		{name: "caf\xe9", typ: tar.TypeReg, body: "latin1"},
		{name: "suid", typ: tar.TypeReg, body: "s", mode: 0o4755},
	}, true)
	dest := filepath.Join(a.dir, "up", "here")
	resp, err := a.upload(t, dest, archive)
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if r := resp.GetResult(); r.GetFiles() != 4 || r.GetSymlinks() != 2 || r.GetHardLinks() != 1 || r.GetDirectories() != 2 || r.GetContentBytes() != uint64(len(big)+1+6+1) || r.GetArchiveBytes() != uint64(len(archive)) {
		t.Errorf("Upload = %v", r)
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "hard")); string(got) != big {
		t.Errorf("hard link content differs")
	}
	for p, want := range map[string]os.FileMode{"dir": os.ModeDir | 0o750, "dir/big.bin": 0o640, "suid": 0o755, "implicit/parent": os.ModeDir | 0o755} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil || fi.Mode() != want || fi.Sys().(*syscallStat).Uid != 1000 {
			t.Errorf("%s: %v (%v), want mode %v owned by 1000", p, fi, err, want)
		}
	}
	if fi, _ := os.Lstat(filepath.Join(dest, "dir/big.bin")); !fi.ModTime().Equal(time.Unix(1_700_000_000, 0)) {
		t.Errorf("mtime %v, want the archive's", fi.ModTime())
	}

	out, sum, err := a.download(t, dest, berthv1.Compression_COMPRESSION_GZIP)
	if err != nil {
		t.Fatalf("Download: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	readTar(t, zr, func(h *tar.Header, body io.Reader) {
		b, _ := io.ReadAll(body)
		got[h.Name] = string(h.Typeflag) + ":" + h.Linkname + ":" + string(b)
	})
	want := map[string]string{
		"caf\xe9": "0::latin1", "dir/": "5::", "dir/big.bin": "0::" + big, "dir/link": "2:big.bin:",
		"hard": "1:dir/big.bin:", "implicit/": "5::", "implicit/parent/": "5::", "implicit/parent/f": "0::p",
		"suid": "0::s", "toplink": "2:dir/../implicit:",
	}
	if len(got) != len(want) {
		t.Errorf("downloaded %d entries, want %d: %q", len(got), len(want), keys(got))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("entry %q = %.40q, want %.40q", k, got[k], v)
		}
	}
	if sum.GetEntries() != uint64(len(want)) || sum.GetArchiveBytes() != uint64(len(out)) {
		t.Errorf("summary %v, want %d entries and %d archive bytes", sum, len(want), len(out))
	}
	// A single file downloads as one entry named by its base name.
	out, _, err = a.download(t, filepath.Join(dest, "suid"), berthv1.Compression_COMPRESSION_NONE)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(bytes.NewReader(out)).Next()
	if err != nil || h.Name != "suid" || h.Size != 1 {
		t.Errorf("single-file download header %v, %v", h, err)
	}
}

// TestDownloadIncludeRoot archives a directory itself first, as "./" with
// its mode and mtime, when the request asks for it (berth cp does, so
// that a downloaded directory's top level keeps them), and only its
// contents otherwise.
func TestDownloadIncludeRoot(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dir := filepath.Join(a.dir, "d")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2003, 4, 5, 6, 7, 8, 123456789, time.UTC)
	if err := os.Chtimes(dir, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		includeRoot bool
		want        string
	}{
		{false, "f"},
		{true, "./ 750 " + mtime.String() + "|f"},
	} {
		out, sum, err := a.downloadRequest(t, &agentv1.DownloadRequest{Path: []byte(dir), IncludeRoot: tc.includeRoot})
		if err != nil {
			t.Fatalf("Download(include_root %v): %v", tc.includeRoot, err)
		}
		var got []string
		readTar(t, bytes.NewReader(out), func(h *tar.Header, _ io.Reader) {
			if h.Typeflag == tar.TypeDir {
				got = append(got, fmt.Sprintf("%s %o %v", h.Name, h.Mode, h.ModTime.UTC()))
			} else {
				got = append(got, h.Name)
			}
		})
		if strings.Join(got, "|") != tc.want || sum.GetEntries() != uint64(len(got)) {
			t.Errorf("Download(include_root %v) = %q (summary %v), want %q", tc.includeRoot, got, sum, tc.want)
		}
	}
}

// readTar calls visit with each entry of the tar stream r, in order.
func readTar(t testing.TB, r io.Reader, visit func(h *tar.Header, body io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		visit(h, tr)
	}
}

func keys(m map[string]string) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// TestUploadEscapes feeds archives that try to write outside their
// directory: each is refused naming the entry, and nothing appears
// outside (internal/tartree tests every way in detail).
func TestUploadEscapes(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	outside := filepath.Join(a.dir, "outside")
	os.Mkdir(outside, 0o777)
	tests := []struct {
		name    string
		entries []tarEntry
		bad     string
	}{
		{"dotdot", []tarEntry{{name: "../outside/evil", typ: tar.TypeReg, body: "x"}}, "../outside/evil"},
		{"absolute", []tarEntry{{name: outside + "/evil", typ: tar.TypeReg, body: "x"}}, outside + "/evil"},
		{"through an absolute symlink", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: outside}, {name: "l/evil", typ: tar.TypeReg, body: "x"}}, "l/evil"},
		{"through an existing symlink", []tarEntry{{name: "pre/evil", typ: tar.TypeReg, body: "x"}}, "pre/evil"},
		{"hard link out", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../outside/target"}}, "h"},
	}
	os.WriteFile(filepath.Join(outside, "target"), []byte("t"), 0o666)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dest := filepath.Join(a.dir, "dest-"+strings.ReplaceAll(tt.name, " ", "-"))
			os.Mkdir(dest, 0o777)
			os.Chmod(dest, 0o777)
			os.Symlink("../outside", filepath.Join(dest, "pre"))
			_, err := a.upload(t, dest, makeTar(t, tt.entries, false))
			if meta := wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", ""); meta["entry"] != tt.bad {
				t.Errorf("error names entry %q, want %q", meta["entry"], tt.bad)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 1 || entries[0].Name() != "target" {
				t.Errorf("outside holds %v after the upload, want only target", entries)
			}
			if fi, _ := os.Stat(filepath.Join(outside, "target")); fi.Sys().(*syscallStat).Nlink != 1 {
				t.Errorf("outside/target got a hard link")
			}
		})
	}
	// Garbage is not an archive; an unknown entry type is unsupported.
	dest := filepath.Join(a.dir, "ok")
	_, err := a.upload(t, dest, []byte(strings.Repeat("not a tar ", 100)))
	wantStatus(t, err, codes.InvalidArgument, "ARCHIVE_INVALID", "")
	_, err = a.upload(t, dest, makeTar(t, []tarEntry{{name: "v", typ: 'Z'}}, false))
	wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSUPPORTED", "")
}
