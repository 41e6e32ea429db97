package files_test

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
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
