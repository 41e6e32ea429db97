package files_test

import (
	"archive/tar"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestUploadEntryCap uploads more entries than --max-list-entries: the
// upload is refused by name (LIST_TOO_LARGE) once the cap is crossed, the
// entries before stay, and empty entries (which cost no content bytes but
// an inode each) count.
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
	for _, n := range []string{"a", "b", "d"} {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("entry %s before the refused one: %v", n, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "c")); !os.IsNotExist(err) {
		t.Errorf("entry c past the cap: lstat %v, want not-exist", err)
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

// TestUploadSymlinkRealLocation creates symlinks whose target stays inside
// the directory when resolved from the entry's name, but leads out from
// where the link really lands (its parent is reached through a symlink of
// the same archive) or through a symlink inside the target itself. Each
// must be refused like any symlink that leads out; harmless climbing
// targets still work.
func TestUploadSymlinkRealLocation(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	tests := []struct {
		name    string
		entries []tarEntry
		bad     string
	}{
		{"parent through a symlink", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "."},
			{name: "a/x", typ: tar.TypeSymlink, link: "../secret"},
		}, "a/x"},
		{"deeper parent through a symlink", []tarEntry{
			{name: "s/", typ: tar.TypeDir, mode: 0o755},
			{name: "s/up", typ: tar.TypeSymlink, link: ".."},
			{name: "s/up/y", typ: tar.TypeSymlink, link: "../secret"},
		}, "s/up/y"},
		{"dotdot after a symlink in the target", []tarEntry{
			{name: "d", typ: tar.TypeSymlink, link: "."},
			{name: "z", typ: tar.TypeSymlink, link: "d/../secret"},
		}, "z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dest := filepath.Join(a.dir, strings.ReplaceAll(tt.name, " ", "-"), "dest")
			_, err := a.upload(t, dest, makeTar(t, tt.entries, false))
			if meta := wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", ""); meta["entry"] != tt.bad {
				t.Errorf("error names entry %q, want %q", meta["entry"], tt.bad)
			}
			// No symlink left in dest leads out of it.
			filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.Type()&os.ModeSymlink == 0 {
					return nil
				}
				target, _ := filepath.EvalSymlinks(p)
				if target != "" && !strings.HasPrefix(target+"/", dest+"/") {
					t.Errorf("symlink %s leads to %s, out of %s", p, target, dest)
				}
				return nil
			})
		})
	}
	dest := filepath.Join(a.dir, "fine")
	_, err := a.upload(t, dest, makeTar(t, []tarEntry{
		{name: "lib/", typ: tar.TypeDir, mode: 0o755},
		{name: "lib/real.so", typ: tar.TypeReg, body: "so"},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", typ: tar.TypeSymlink, link: "../lib/./real.so"},
		{name: "self", typ: tar.TypeSymlink, link: "."},
		{name: "self/top", typ: tar.TypeSymlink, link: "lib/real.so"},
	}, false))
	if err != nil {
		t.Fatalf("upload of harmless symlinks: %v", err)
	}
	for _, p := range []string{"bin/tool", "top"} {
		if b, err := os.ReadFile(filepath.Join(dest, p)); err != nil || string(b) != "so" {
			t.Errorf("%s = %q, %v; want the library", p, b, err)
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

// TestRefusedSymlinkKeepsEarlierEntry refuses a symlink entry that would
// replace a file extracted before it: the refusal happens before anything
// is replaced, so the file stays as the earlier entry left it.
func TestRefusedSymlinkKeepsEarlierEntry(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dest := filepath.Join(a.dir, "keep")
	_, err := a.upload(t, dest, makeTar(t, []tarEntry{
		{name: "x", typ: tar.TypeReg, body: "keep"},
		{name: "x", typ: tar.TypeSymlink, link: "missing/../y"},
	}, false))
	wantStatus(t, err, codes.InvalidArgument, "TAR_ENTRY_UNSAFE", "")
	if b, err := os.ReadFile(filepath.Join(dest, "x")); err != nil || string(b) != "keep" {
		t.Errorf("x after the refused entry = %q, %v; want the earlier file", b, err)
	}
}
