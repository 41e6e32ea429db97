package switchroot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlainPath: a mount point of the new root is refused when it or
// any directory on its way is missing or a symbolic link (the parent's
// workload wrote that tree), accepted when every component is plain.
func TestPlainPath(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{"proc", "etc", "real"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/hosts"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hosts", filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, wantErr string
	}{
		{"/proc", ""},
		{"/etc/hosts", ""},
		{"/etc/resolv.conf", "/etc/resolv.conf is a symbolic link"},
		{"/linkdir/x", "no such file"},
		{"/linkdir", "/linkdir is a symbolic link"},
		{"/missing", "no such file"},
	} {
		err := plainPath(root, tc.path)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("plainPath(%s) = %v, want nil", tc.path, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("plainPath(%s) = %v, want an error containing %q", tc.path, err, tc.wantErr)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "real/x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := plainPath(root, "/linkdir/x"); err == nil || !strings.Contains(err.Error(), "/linkdir is a symbolic link") {
		t.Errorf("plainPath(/linkdir/x) through a linked directory = %v, want the link named", err)
	}
}
