package tartree_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/tartree"
	"github.com/berth-sandbox/berth/internal/tartree/treetest"
)

// symlinks (absolute and relative), hard links, a FIFO, a device node, a
// sparse file, names and link targets beyond ustar's 100 bytes, owners
// other than root, setuid and sticky bits, and mtimes to the nanosecond.

// archive writes src as berth does, IncludeRoot as berth cp does.
func archive(t *testing.T, src string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := tartree.NewWriter(&buf)
	err := tartree.Walk(src, tartree.WalkOptions{IncludeRoot: true}, func(e *tartree.Entry) error {
		_, err := w.Add(e)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func needRoot(t *testing.T) {
	e2e.NeedRoot(t, "a test tree with a device node and other owners")
}

// TestToolsReadBerth archives the tree as berth does and extracts it with
// GNU tar, bsdtar and busybox tar: each lists it (tvf) and extracts it
// without a word on stderr, and the tree comes out whole.
func TestToolsReadBerth(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		tool    string
		x       []string
		sparse  bool
		compare treetest.Compare
	}{
		{"gnu", []string{"--numeric-owner", "-xpf", "-"}, true, treetest.Compare{Owners: true}},
		{"bsdtar", []string{"--numeric-owner", "-xpf", "-"}, true, treetest.Compare{Owners: true}},
		// busybox keeps whole seconds, restores neither directory times
		// nor symlink times and owners, and cannot read sparse entries.
		{"busybox", []string{"--numeric-owner", "-xf", "-"}, false, treetest.Compare{Owners: true, Seconds: true, NoLinkTimes: true, NoDirTimes: true, NoLinkOwners: true}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			argv := treetest.Tool(t, tc.tool)
			src := filepath.Join(t.TempDir(), "src")
			treetest.Make(t, src, treetest.Options{NoSparse: !tc.sparse})
			tarball := archive(t, src)
			list := treetest.Run(t, "", tarball, append(argv, "-tvf", "-")...)
			if !bytes.Contains(list, []byte("venv/bin/python -> /usr/bin/python3")) {
				t.Errorf("listing lacks the venv's absolute symlink:\n%s", list)
			}
			dst := t.TempDir()
			treetest.Run(t, dst, tarball, append(argv, tc.x...)...)
			treetest.Check(t, src, dst, tc.compare)
		})
	}
}

// TestBerthReadsTools extracts archives that GNU tar (pax and GNU formats,
// --sparse), bsdtar and busybox tar write, with owners kept.
func TestBerthReadsTools(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name    string
		tool    string
		c       []string
		compare treetest.Compare
	}{
		{"gnu pax", "gnu", []string{"--format=pax", "--sparse", "--numeric-owner", "-cf", "-", "."}, treetest.Compare{Owners: true}},
		{"gnu gnu", "gnu", []string{"--format=gnu", "--sparse", "-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true}},
		{"bsdtar", "bsdtar", []string{"-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true}},
		{"busybox", "busybox", []string{"-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := treetest.Tool(t, tc.tool)
			src := filepath.Join(t.TempDir(), "src")
			treetest.Make(t, src, treetest.Options{})
			cmd := exec.Command(argv[0], append(argv[1:], tc.c...)...)
			cmd.Dir = src
			tarball, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", cmd, err)
			}
			dst := filepath.Join(t.TempDir(), "new", "dst")
			counts, err := tartree.Extract(dst, bytes.NewReader(tarball), tartree.Options{Chown: chown})
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if counts.HardLinks != 2 || counts.Special != 2 || counts.Symlinks != 4 {
				t.Errorf("Extract = %+v, want 2 hard links, 2 special files and 4 symlinks", counts)
			}
			treetest.Check(t, src, dst, tc.compare)
		})
	}
}

func chown(fd, uid, gid int, mode uint32) error {
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil || mode == 0 {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// TestBerthRoundTrip archives with berth and extracts with berth: every
// nanosecond and owner survives.
func TestBerthRoundTrip(t *testing.T) {
	needRoot(t)
	src := filepath.Join(t.TempDir(), "src")
	treetest.Make(t, src, treetest.Options{})
	dst := filepath.Join(t.TempDir(), "dst")
	if _, err := tartree.Extract(dst, bytes.NewReader(archive(t, src)), tartree.Options{Chown: chown}); err != nil {
		t.Fatal(err)
	}
	treetest.Check(t, src, dst, treetest.Compare{Owners: true})
	// Without Chown, the extracting user owns everything and setuid and
	// setgid bits are dropped.
	dst = filepath.Join(t.TempDir(), "dst")
	if _, err := tartree.Extract(dst, bytes.NewReader(archive(t, src)), tartree.Options{}); err != nil {
		t.Fatal(err)
	}
	treetest.Check(t, src, dst, treetest.Compare{NoSpecialSet: true})
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(dst, "data/owned"), &st); st.Uid != 0 {
		t.Errorf("data/owned is owned by %d without Chown, want 0", st.Uid)
	}
}
