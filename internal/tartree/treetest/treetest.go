// Package treetest builds a directory tree that holds what real trees
// hold — a Python venv's symlinks (absolute and relative), hard links, a
// FIFO, a device node, a sparse file, names and link targets beyond
// ustar's 100 bytes, a name that is not UTF-8, owners other than root,
// setuid and sticky bits, mtimes to the nanosecond — and compares a copy
// with it. The tests of internal/tartree and the integration tests of
// berth cp and the file RPCs use it.
package treetest

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

var (
	longComponent = strings.Repeat("n", 200)
	longDir       = filepath.Join("deep", longComponent, longComponent)
)

// Options leave parts out of the tree.
type Options struct {
	NoSparse bool // busybox tar cannot read sparse entries
	NoDevice bool // making a device node needs CAP_MKNOD
	NoOwners bool // making files of other owners needs CAP_CHOWN
}

// Entries in the tree that options concern.
const (
	Device = "data/null"
	Sparse = "data/sparse"
)

// SparseSize is the apparent size of the test's sparse file; two 4 KiB
// runs of data are in it.
const SparseSize = 64 << 20

// Make builds the test tree under dir (which must not exist): see the
// package comment; o leaves parts out.
func Make(t testing.TB, dir string, o Options) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"venv/bin", "venv/lib/python3.11/site-packages", "data", longDir, "sticky"} {
		must(os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	files := map[string]string{
		"venv/pyvenv.cfg":                          "home = /usr/bin\n",
		"venv/lib/python3.11/site-packages/mod.py": "print('hi')\n",
		"data/empty":                               "",
		"data/binary":                              "\x00\x01\xff\xfe" + strings.Repeat("z", 70_000),
		filepath.Join(longDir, longComponent):      "long\n",
		"data/suid":                                "s",
		"caf\xe9 latin1":                           "name is not UTF-8",
		"café ü":                                   "name is UTF-8",
		"data/owned":                               "owned by 1234:5678",
	}
	for name, body := range files {
		must(os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	must(os.Chmod(filepath.Join(dir, "data/suid"), 0o4755))
	must(os.Chmod(filepath.Join(dir, "sticky"), 0o1777))
	must(os.Chmod(filepath.Join(dir, "data/binary"), 0o600))
	if !o.NoOwners {
		must(os.Chown(filepath.Join(dir, "data/owned"), 1234, 5678))
		must(os.Chown(filepath.Join(dir, "sticky"), 1234, 5678))
	}
	must(os.Symlink("/usr/bin/python3", filepath.Join(dir, "venv/bin/python")))
	must(os.Symlink("python", filepath.Join(dir, "venv/bin/python3")))
	must(os.Symlink("../../..", filepath.Join(dir, "venv/bin/up")))
	must(os.Symlink(filepath.Join(longDir, longComponent), filepath.Join(dir, "longlink")))
	if !o.NoOwners {
		must(os.Lchown(filepath.Join(dir, "venv/bin/python3"), 1234, 5678))
	}
	must(os.Link(filepath.Join(dir, "data/binary"), filepath.Join(dir, "venv/hard")))
	must(os.Link(filepath.Join(dir, longDir, longComponent), filepath.Join(dir, "data/hard-to-long")))
	must(unix.Mkfifo(filepath.Join(dir, "data/fifo"), 0o640))
	if !o.NoDevice {
		must(unix.Mknod(filepath.Join(dir, "data/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}
	if !o.NoSparse {
		f, err := os.Create(filepath.Join(dir, "data/sparse"))
		must(err)
		_, err = f.WriteAt(bytes.Repeat([]byte("a"), 4096), 1<<20)
		must(err)
		_, err = f.WriteAt(bytes.Repeat([]byte("b"), 4096), 30<<20)
		must(err)
		must(f.Truncate(SparseSize))
		must(f.Close())
	}
	// Times last, deepest first, so that making entries does not move
	// their directories' times.
	var paths []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	})
	for i := len(paths) - 1; i >= 0; i-- {
		ts := unix.NsecToTimespec(time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC).UnixNano() + int64(i)*1_000_000_007)
		must(unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// Compare says what Check may let pass: what a tar implementation or an
// archive format does not keep.
type Compare struct {
	Seconds      bool // mtimes only to the second (the archive format or tool keeps no more)
	NoLinkTimes  bool // symlink times are not restored
	NoDirTimes   bool // directory times are not restored
	Owners       bool // owners must match
	NoSpecialSet bool // setuid and setgid need not survive
	NoLinkOwners bool // symlink owners are not restored
	// Missing are names (relative, slash-separated) that dst may lack.
	Missing []string
}

// Check checks that dst holds what src holds: every entry's type, mode,
// owner, mtime, content, symlink target, device number, hard links among
// the entries, and for a sparse file at most twice the blocks allocated.
func Check(t testing.TB, src, dst string, c Compare) {
	t.Helper()
	srcIno := map[uint64]string{}
	dstIno := map[uint64]string{}
	n := 0
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		q := filepath.Join(dst, rel)
		n++
		var s, g unix.Stat_t
		if err := unix.Lstat(p, &s); err != nil {
			return err
		}
		if err := unix.Lstat(q, &g); err != nil {
			if slices.Contains(c.Missing, filepath.ToSlash(rel)) {
				n--
				return nil
			}
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if s.Mode&unix.S_IFMT != g.Mode&unix.S_IFMT {
			t.Errorf("%s: type %o, want %o", rel, g.Mode&unix.S_IFMT, s.Mode&unix.S_IFMT)
			return nil
		}
		typ := s.Mode & unix.S_IFMT
		wantMode := s.Mode & 0o7777
		if c.NoSpecialSet {
			wantMode &= 0o1777
		}
		if typ != unix.S_IFLNK && rel != "." && g.Mode&0o7777 != wantMode {
			t.Errorf("%s: mode %o, want %o", rel, g.Mode&0o7777, wantMode)
		}
		if c.Owners && !(typ == unix.S_IFLNK && c.NoLinkOwners) && (g.Uid != s.Uid || g.Gid != s.Gid) {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, g.Uid, g.Gid, s.Uid, s.Gid)
		}
		checkTime := !(typ == unix.S_IFLNK && c.NoLinkTimes) && !(typ == unix.S_IFDIR && c.NoDirTimes) && rel != "."
		if want, got := time.Unix(s.Mtim.Unix()), time.Unix(g.Mtim.Unix()); checkTime {
			// Names that are not UTF-8 travel in GNU headers: seconds.
			if c.Seconds || !utf8.ValidString(rel) {
				want, got = want.Truncate(time.Second), got.Truncate(time.Second)
			}
			if !got.Equal(want) {
				t.Errorf("%s: mtime %v, want %v", rel, got, want)
			}
		}
		switch typ {
		case unix.S_IFREG:
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(q)
			if !bytes.Equal(a, b) {
				t.Errorf("%s: content differs (%d bytes, want %d)", rel, len(b), len(a))
			}
			if s.Blocks*512 < s.Size && g.Blocks > 2*s.Blocks {
				t.Errorf("%s: %d blocks allocated, the sparse source has %d", rel, g.Blocks, s.Blocks)
			}
			if s.Nlink > 1 {
				if first, ok := srcIno[s.Ino]; ok {
					if dstIno[g.Ino] != first {
						t.Errorf("%s: not a hard link of %s", rel, first)
					}
				} else {
					srcIno[s.Ino] = rel
					dstIno[g.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(q)
			if a != b {
				t.Errorf("%s: symlink to %q, want %q", rel, b, a)
			}
		case unix.S_IFCHR:
			if g.Rdev != s.Rdev {
				t.Errorf("%s: device %x, want %x", rel, g.Rdev, s.Rdev)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m := 0
	filepath.WalkDir(dst, func(string, fs.DirEntry, error) error { m++; return nil })
	if m != n {
		t.Errorf("%s holds %d entries, %s %d", dst, m, src, n)
	}
}

// Tool returns the command line of a tar implementation: "gnu" (tar),
// "bsdtar" or "busybox" (busybox tar). When it is not installed the test
// fails under BERTH_E2E=1 (scripts/deps.sh installs all three) and is
// skipped otherwise.
func Tool(t testing.TB, name string) []string {
	t.Helper()
	argv := map[string][]string{"gnu": {"tar"}, "bsdtar": {"bsdtar"}, "busybox": {"busybox", "tar"}}[name]
	if _, err := exec.LookPath(argv[0]); err != nil {
		if os.Getenv("BERTH_E2E") != "" {
			t.Fatalf("%s is not installed (scripts/deps.sh installs it): %v", argv[0], err)
		}
		t.Skipf("%s is not installed: %v", argv[0], err)
	}
	return argv
}

// Run runs a tar implementation (argv from Tool) in dir with stdin and
// returns its stdout; failing, or any word on stderr, fails the test.
func Run(t testing.TB, dir string, stdin []byte, argv ...string) []byte {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: %v; stderr: %s", strings.Join(argv, " "), err, stderr.String())
	}
	return out
}
