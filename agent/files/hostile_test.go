package files_test

import (
	"archive/tar"
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestUploadEntryCap uploads more entries than --max-list-entries: the
// upload is refused by name (LIST_TOO_LARGE) once the cap is crossed and
// leaves nothing (uploads are atomic); empty entries (which cost no
// content bytes but an inode each) count.
func TestUploadEntryCap(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000", "--max-list-entries", "3")
	dir := filepath.Join(a.dir, "up")
	archive := makeTar(t, []tarEntry{
		{name: "a", typ: tar.TypeReg}, {name: "b", typ: tar.TypeReg}, {name: "d/", typ: tar.TypeDir, mode: 0o755}, {name: "c", typ: tar.TypeReg},
	}, true)
	_, err := a.upload(t, dir, archive)
	meta := wantStatus(t, err, codes.FailedPrecondition, "LIST_TOO_LARGE", dir)
	if meta["limit"] != "3" {
		t.Errorf("limit = %q, want 3", meta["limit"])
	}
	if entries, err := os.ReadDir(a.dir); err != nil || len(entries) != 0 {
		t.Errorf("%s holds %v (%v) after the refused upload, want nothing", a.dir, entries, err)
	}
}

// TestUploadRepeatedDirectory archives a directory twice with different
// modes: the last entry's mode holds, as tar(1) leaves it.
func TestUploadRepeatedDirectory(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dir := filepath.Join(a.dir, "rep")
	archive := makeTar(t, []tarEntry{
		{name: "d/", typ: tar.TypeDir, mode: 0o700}, {name: "d/f", typ: tar.TypeReg, body: "x"}, {name: "d/", typ: tar.TypeDir, mode: 0o750},
	}, false)
	resp, err := a.upload(t, dir, archive)
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if resp.GetResult().GetDirectories() != 2 || resp.GetResult().GetFiles() != 1 {
		t.Errorf("Upload = %v, want 2 directory entries and 1 file", resp.GetResult())
	}
	fi, err := os.Stat(filepath.Join(dir, "d"))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("d after the upload: %v, %v; want mode 0750 from the last entry", fi.Mode(), err)
	}
}

// badRequestField returns the field the BadRequest of err blames, or "".
func badRequestField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestLongestNames writes, renames and stats names of NAME_MAX (255) bytes,
// which Linux allows, and one byte more, which is INVALID_ARGUMENT naming
// the request field, as every invalid argument is.
func TestLongestNames(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	ctx := testCtx(t)
	longest := filepath.Join(a.dir, "sub", strings.Repeat("n", 255))
	for _, mode := range []berthv1.WriteMode{berthv1.WriteMode_WRITE_MODE_REPLACE, berthv1.WriteMode_WRITE_MODE_APPEND} {
		resp, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(longest), CreateParents: true, WriteMode: mode}, []byte("data"))
		if err != nil {
			t.Fatalf("WriteFile %v of a 255-byte name: %v", mode, err)
		}
		if resp.GetResult().GetWrittenBytes() != 4 {
			t.Errorf("WriteFile %v = %v, want 4 bytes", mode, resp.GetResult())
		}
	}
	if b, err := os.ReadFile(longest); err != nil || string(b) != "datadata" {
		t.Errorf("file with the 255-byte name = %q, %v; want datadata", b, err)
	}
	if names, _ := os.ReadDir(filepath.Dir(longest)); len(names) != 1 {
		t.Errorf("directory after the writes holds %d entries, want the file alone (no temporary file left)", len(names))
	}
	renamed := filepath.Join(a.dir, "sub", strings.Repeat("r", 255))
	if _, err := a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(longest), ToPath: []byte(renamed)}); err != nil {
		t.Errorf("Rename to a 255-byte name: %v", err)
	}

	tooLong := filepath.Join(a.dir, strings.Repeat("x", 256))
	check := func(what string, err error, field string) {
		t.Helper()
		wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
		if got := badRequestField(err); got != field {
			t.Errorf("%s with a 256-byte name: BadRequest blames %q, want %q (%v)", what, got, field, err)
		}
	}
	_, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(tooLong)}, []byte("x"))
	check("WriteFile", err, "header.path")
	_, err = a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(tooLong + "/f")})
	check("Stat", err, "path")
	_, err = a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(renamed), ToPath: []byte(tooLong)})
	check("Rename", err, "to_path")
	_, err = a.upload(t, tooLong, makeTar(t, []tarEntry{{name: "f", typ: tar.TypeReg}}, false))
	check("Upload", err, "header.path")
	_, err = a.upload(t, filepath.Join(a.dir, "up"), makeTar(t, []tarEntry{{name: strings.Repeat("e", 256), typ: tar.TypeReg}}, false))
	meta := wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSUPPORTED", "")
	if meta["entry"] != strings.Repeat("e", 256) {
		t.Errorf("Upload of an entry with a 256-byte name names entry %q", meta["entry"])
	}
}

// TestSpecialFilesAreNotRegular reads and appends to a unix socket, which
// open(2) refuses with ENXIO: that is NOT_A_REGULAR_FILE like a device or
// FIFO, not an internal error.
func TestSpecialFilesAreNotRegular(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	sock := filepath.Join(a.dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.Chmod(sock, 0o777)
	_, err = a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(sock)})
	wantStatus(t, err, codes.FailedPrecondition, "NOT_A_REGULAR_FILE", sock)
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(sock), WriteMode: berthv1.WriteMode_WRITE_MODE_APPEND}, []byte("x"))
	wantStatus(t, err, codes.FailedPrecondition, "NOT_A_REGULAR_FILE", sock)
}

// TestRenameIntoItself moves a directory into its own subdirectory, which
// rename(2) refuses with EINVAL: the caller's mistake, INVALID_ARGUMENT
// naming to_path, not an internal error.
func TestRenameIntoItself(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	d := filepath.Join(a.dir, "d")
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chown(d, 1000, 1000)
	_, err := a.files.Rename(testCtx(t), &agentv1.RenameRequest{FromPath: []byte(d), ToPath: []byte(d + "/sub")})
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
	if got := badRequestField(err); got != "to_path" {
		t.Errorf("BadRequest blames %q, want to_path (%v)", got, err)
	}
}

// TestUploadSymlinksVerbatim keeps symlink targets as archived, absolute
// and climbing ones too (a venv's bin/python -> /usr/bin/python3), and
// refuses, naming the entry, what would be written through them out of the
// directory.
func TestUploadSymlinksVerbatim(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dest := filepath.Join(a.dir, "venv")
	resp, err := a.upload(t, dest, makeTar(t, []tarEntry{
		{name: "bin/python", typ: tar.TypeSymlink, link: "/usr/bin/python3"},
		{name: "bin/python3", typ: tar.TypeSymlink, link: "python"},
		{name: "up", typ: tar.TypeSymlink, link: "../../.."},
		{name: "self", typ: tar.TypeSymlink, link: "."},
		{name: "self/through-self", typ: tar.TypeReg, body: "fine"},
	}, false))
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if resp.GetResult().GetSymlinks() != 4 {
		t.Errorf("Upload = %v, want 4 symlinks", resp.GetResult())
	}
	for name, want := range map[string]string{"bin/python": "/usr/bin/python3", "bin/python3": "python", "up": "../../.."} {
		if got, err := os.Readlink(filepath.Join(dest, name)); got != want {
			t.Errorf("%s -> %q (%v), want %q", name, got, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dest, "through-self")); string(b) != "fine" {
		t.Errorf("through-self = %q, %v", b, err)
	}
	for name, entries := range map[string][]tarEntry{
		"abs/evil": {{name: "abs", typ: tar.TypeSymlink, link: a.dir}, {name: "abs/evil", typ: tar.TypeReg, body: "x"}},
		"up/evil":  {{name: "up", typ: tar.TypeSymlink, link: ".."}, {name: "up/evil", typ: tar.TypeReg, body: "x"}},
		"up/evil2": nil, // through the symlink "up" already in dest
	} {
		if entries == nil {
			entries = []tarEntry{{name: "up/evil2", typ: tar.TypeReg, body: "x"}}
		}
		target := filepath.Join(a.dir, "t-"+strings.Trim(strings.ReplaceAll(name, "/", "-"), "-"))
		if name == "up/evil2" {
			target = dest
		}
		_, err := a.upload(t, target, makeTar(t, entries, false))
		if meta := wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", ""); meta["entry"] != name {
			t.Errorf("error names entry %q, want %q", meta["entry"], name)
		}
		if _, err := os.Lstat(filepath.Join(a.dir, "evil")); !os.IsNotExist(err) {
			t.Fatalf("%s/evil was written: %v", a.dir, err)
		}
	}
}

// TestReadPseudoFiles reads files of /proc and /sys, whose size fstat(2)
// does not know (0, or 4096 on sysfs): the read gives their whole content
// with a header that says how long it is, not FILE_CHANGED; a range works
// too.
func TestReadPseudoFiles(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	for _, p := range []string{"/proc/cpuinfo", "/proc/self/status", "/proc/sys/kernel/osrelease", "/sys/class/net/lo/mtu"} {
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(p)})
		if err != nil {
			t.Errorf("ReadFile %s: %v", p, err)
			continue
		}
		if got := r.header.GetHeader().GetLengthBytes(); got != uint64(len(r.data)) || len(r.data) == 0 {
			t.Errorf("ReadFile %s: header length %d, %d bytes sent; want them equal and not zero", p, got, len(r.data))
		}
		if p != "/proc/self/status" && string(r.data) != string(want) {
			t.Errorf("ReadFile %s = %q, want %q", p, r.data, want)
		}
		if p == "/proc/self/status" && !strings.Contains(string(r.data), "berth-agent") {
			t.Errorf("ReadFile %s = %q, want the agent's status", p, r.data)
		}
	}
	r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte("/proc/self/status"), OffsetBytes: 6, LimitBytes: 11})
	if err != nil || string(r.data) != "berth-agent" || r.header.GetHeader().GetLengthBytes() != 11 {
		t.Errorf("ReadFile of a range of /proc/self/status = %q, %v; want berth-agent", r.data, err)
	}
}

// TestUploadIsAtomic refuses an entry after others were extracted, and
// cancels an upload half-way: either leaves the directory as it was, and
// no staging directory behind.
func TestUploadIsAtomic(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dest := filepath.Join(a.dir, "keep")
	os.MkdirAll(dest, 0o777)
	os.Chmod(dest, 0o777)
	os.WriteFile(filepath.Join(dest, "x"), []byte("keep"), 0o666)
	_, err := a.upload(t, dest, makeTar(t, []tarEntry{
		{name: "x", typ: tar.TypeReg, body: "replaced"},
		{name: "new", typ: tar.TypeReg, body: "new"},
		{name: "../escape", typ: tar.TypeReg, body: "no"},
	}, false))
	wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", "")
	wantOnly := func(when string) {
		t.Helper()
		entries, _ := os.ReadDir(dest)
		if b, err := os.ReadFile(filepath.Join(dest, "x")); len(entries) != 1 || err != nil || string(b) != "keep" {
			t.Errorf("%s: dest holds %v, x = %q (%v); want only x as it was", when, entries, b, err)
		}
	}
	wantOnly("after a refused entry")

	// Cancel after part of a large archive was sent.
	big := makeTar(t, []tarEntry{
		{name: "x", typ: tar.TypeReg, body: "replaced"},
		{name: "big", typ: tar.TypeReg, body: strings.Repeat("b", 4<<20)},
	}, false)
	ctx, cancel := context.WithCancel(testCtx(t))
	stream, err := a.files.Upload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: []byte(dest)}}})
	stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Chunk{Chunk: big[:2<<20]}})
	// The agent has the first chunk once a staging directory holds it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if staged, _ := filepath.Glob(filepath.Join(dest, ".berth-upload-*", "big")); len(staged) > 0 || time.Now().After(deadline) {
			break
		}
	}
	cancel()
	// The agent ends the upload when it sees the cancellation; it then
	// removes the staging directory.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if entries, _ := os.ReadDir(dest); len(entries) == 1 {
			break
		}
	}
	wantOnly("after a canceled upload")
}

// TestUploadSpecialFiles creates FIFOs, lists device nodes the workload
// user may not create (no CAP_MKNOD) as skipped, and with keep_owners
// gives entries the archive's owners.
func TestUploadSpecialFiles(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dest := filepath.Join(a.dir, "special")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o640},
		{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "owned", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1234, Gid: 5678},
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 4321, Gid: 8765},
		{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "/x", Uid: 42, Gid: 43},
	} {
		tw.WriteHeader(h)
	}
	tw.Close()
	for _, keep := range []bool{false, true} {
		os.RemoveAll(dest)
		stream, err := a.files.Upload(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: []byte(dest), KeepOwners: keep}}})
		stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Chunk{Chunk: buf.Bytes()}})
		resp, err := stream.CloseAndRecv()
		if err != nil {
			t.Fatalf("keep_owners %v: Upload: %v", keep, err)
		}
		r := resp.GetResult()
		if r.GetSpecialFiles() != 1 || r.GetSkippedCount() != 1 || len(r.GetSkipped()) != 1 || string(r.GetSkipped()[0]) != "null" {
			t.Errorf("keep_owners %v: Upload = %v, want 1 special file and null skipped", keep, r)
		}
		if fi, err := os.Lstat(filepath.Join(dest, "fifo")); err != nil || fi.Mode() != os.ModeNamedPipe|0o640 {
			t.Errorf("fifo: %v, %v", fi, err)
		}
		want := map[string][3]uint32{"owned": {1000, 1000, 0o755}, "d": {1000, 1000, 0o750}, "d/l": {1000, 1000, 0o777}}
		if keep {
			want = map[string][3]uint32{"owned": {1234, 5678, 0o4755}, "d": {4321, 8765, 0o750}, "d/l": {42, 43, 0o777}}
		}
		for name, w := range want {
			fi, err := os.Lstat(filepath.Join(dest, name))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			st := fi.Sys().(*syscallStat)
			if st.Uid != w[0] || st.Gid != w[1] || st.Mode&0o7777 != w[2] {
				t.Errorf("keep_owners %v: %s is %d:%d mode %o, want %d:%d mode %o", keep, name, st.Uid, st.Gid, st.Mode&0o7777, w[0], w[1], w[2])
			}
		}
	}
}
