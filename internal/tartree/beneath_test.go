package tartree

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBeneath resolves names with openat2 and with the component-walk
// fallback: symlinks that lead out fail with ErrEscape in both; the
// fallback follows no symlink at all.
func TestBeneath(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "in", "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink(outside, filepath.Join(root, "abs"))
	os.Symlink("../outside", filepath.Join(root, "up"))
	os.Symlink("in", filepath.Join(root, "alias"))
	for _, fallback := range []bool{false, true} {
		b, err := openBeneath(root)
		if err != nil {
			t.Fatal(err)
		}
		if b.fallback && !fallback {
			t.Log("openat2 is unavailable here: both runs use the fallback")
		}
		b.fallback = fallback
		for _, name := range []string{"abs/x", "up/x", "abs", "up"} {
			fd, err := b.dir(name)
			if !errors.Is(err, ErrEscape) {
				t.Errorf("fallback %v: dir(%q) = %d, %v; want ErrEscape", fallback, name, fd, err)
			}
			if err == nil {
				unix.Close(fd)
			}
		}
		fd, err := b.dir("alias/sub")
		if fallback && !errors.Is(err, ErrEscape) || !fallback && err != nil {
			t.Errorf("fallback %v: dir(alias/sub) = %v", fallback, err)
		}
		if err == nil {
			unix.Close(fd)
		}
		fd, err = b.mkdirAll("in/new/deeper")
		if err != nil {
			t.Errorf("fallback %v: mkdirAll(in/new/deeper): %v", fallback, err)
		} else {
			unix.Close(fd)
		}
		if _, err := b.mkdirAll("up/new"); !errors.Is(err, ErrEscape) {
			t.Errorf("fallback %v: mkdirAll(up/new) = %v, want ErrEscape", fallback, err)
		}
		b.close()
		os.RemoveAll(filepath.Join(root, "in", "new"))
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("outside holds %v", entries)
	}
}
