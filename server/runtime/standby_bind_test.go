package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBindBeneath: bindBeneath mounts on the directory beneath dir, and
// refuses a name that is a symbolic link — to a directory outside dir
// or inside it — leaving the link's target unmounted.
func TestBindBeneath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("bindBeneath's test mounts: run it as root (CI and the make targets do)")
	}
	tmp := t.TempDir()
	src, dir, outside := filepath.Join(tmp, "src"), filepath.Join(tmp, "dir"), filepath.Join(tmp, "outside")
	for _, d := range []string{src, dir, outside, filepath.Join(dir, "next"), filepath.Join(dir, "inner")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "marker"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := bindBeneath(src, dir, "next"); err != nil {
		t.Fatalf("bindBeneath onto a directory: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "next"), unix.MNT_DETACH) })
	if _, err := os.Stat(filepath.Join(dir, "next", "marker")); err != nil {
		t.Errorf("after bindBeneath the source's file is not under dir/next: %v", err)
	}
	for name, target := range map[string]string{"out": outside, "in": filepath.Join(dir, "inner")} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		err := bindBeneath(src, dir, name)
		if err == nil {
			unix.Unmount(target, unix.MNT_DETACH)
			t.Errorf("bindBeneath onto a link to %s succeeded, want it refused", target)
		} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ENOTDIR) {
			t.Errorf("bindBeneath onto a link to %s = %v, want ELOOP, EXDEV or ENOTDIR", target, err)
		}
		if _, err := os.Stat(filepath.Join(target, "marker")); err == nil {
			t.Errorf("the link's target %s got the mount", target)
		}
	}
}
