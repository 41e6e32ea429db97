package tartree_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/tartree"
)

type entry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
}

func makeTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if e.typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// listing returns every path under dir with its type and content, to
// compare a tree before and after.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, p+" "+err.Error())
			return nil
		}
		line := strings.TrimPrefix(p, dir) + " " + d.Type().String()
		switch {
		case d.Type().IsRegular():
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		}
		out = append(out, line)
		return nil
	})
	return out
}

// TestExtractRefusesEscapes feeds archives that try to write outside
// their directory: each fails naming the entry, nothing appears outside,
// and the directory is as it was (only the symlink planted before).
func TestExtractRefusesEscapes(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o777)
	os.WriteFile(filepath.Join(outside, "target"), []byte("t"), 0o666)
	tests := []struct {
		name    string
		entries []entry
		bad     string
	}{
		{"dotdot", []entry{{name: "../outside/evil", typ: tar.TypeReg, body: "x"}}, "../outside/evil"},
		{"dotdot inside", []entry{{name: "a/../../outside/evil", typ: tar.TypeReg, body: "x"}}, "a/../../outside/evil"},
		{"absolute", []entry{{name: outside + "/evil", typ: tar.TypeReg, body: "x"}}, outside + "/evil"},
		{"through an absolute symlink", []entry{
			{name: "l", typ: tar.TypeSymlink, link: outside},
			{name: "l/evil", typ: tar.TypeReg, body: "x"},
		}, "l/evil"},
		{"through a climbing symlink", []entry{
			{name: "d/l", typ: tar.TypeSymlink, link: "../../outside"},
			{name: "d/l/evil", typ: tar.TypeReg, body: "x"},
		}, "d/l/evil"},
		{"through a symlink landing higher", []entry{
			{name: "a", typ: tar.TypeSymlink, link: "."},
			{name: "a/up", typ: tar.TypeSymlink, link: ".."},
			{name: "a/up/evil", typ: tar.TypeReg, body: "x"},
		}, "a/up/evil"},
		{"through an existing symlink", []entry{{name: "pre/evil", typ: tar.TypeReg, body: "x"}}, "pre/evil"},
		{"dir through an existing symlink", []entry{{name: "pre/sub/", typ: tar.TypeDir}}, "pre/sub/"},
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../outside/target"}}, "h"},
		{"hard link through an existing symlink", []entry{{name: "h", typ: tar.TypeLink, link: "pre/target"}}, "h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dest := filepath.Join(base, "dest-"+strings.ReplaceAll(tt.name, " ", "-"))
			os.Mkdir(dest, 0o777)
			// A symlink that leads out, planted before the upload.
			os.Symlink("../outside", filepath.Join(dest, "pre"))
			before := listing(t, dest)
			_, err := tartree.Extract(dest, bytes.NewReader(makeTar(t, tt.entries)), tartree.Options{})
			var entryErr *tartree.EntryError
			if !errors.As(err, &entryErr) || !entryErr.Unsafe || entryErr.Entry != tt.bad {
				t.Errorf("Extract = %v, want an unsafe entry error naming %q", err, tt.bad)
			}
			if after := listing(t, dest); !slices.Equal(after, before) {
				t.Errorf("dest holds %q after the failed extraction, want %q", after, before)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 1 || entries[0].Name() != "target" {
				t.Errorf("outside holds %v, want only target", entries)
			}
			if fi, _ := os.Stat(filepath.Join(outside, "target")); fi.Sys().(*syscall.Stat_t).Nlink != 1 {
				t.Errorf("outside/target got a hard link")
			}
		})
	}
}

// TestExtractKeepsSymlinkTargets keeps every symlink's target verbatim:
// a target is data, wherever it leads.
func TestExtractKeepsSymlinkTargets(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "venv")
	targets := map[string]string{
		"bin/python":  "/usr/bin/python3",
		"bin/python3": "python",
		"lib64":       "lib",
		"up":          "../../../..",
		"x":           "d/../secret",
		"empty-dir/l": "../bin/./python",
	}
	var entries []entry
	for name, target := range targets {
		entries = append(entries, entry{name: name, typ: tar.TypeSymlink, link: target})
	}
	counts, err := tartree.Extract(dest, bytes.NewReader(makeTar(t, entries)), tartree.Options{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if counts.Symlinks != uint64(len(targets)) {
		t.Errorf("Extract made %d symlinks, want %d", counts.Symlinks, len(targets))
	}
	for name, want := range targets {
		if got, err := os.Readlink(filepath.Join(dest, filepath.Clean(name))); got != want {
			t.Errorf("%s -> %q (%v), want %q", name, got, err, want)
		}
	}
}

// TestExtractIsAtomic fails extractions in several ways: into a missing
// directory, nothing is left; into an existing one, it is as it was; no
// staging directory remains.
func TestExtractIsAtomic(t *testing.T) {
	good := []entry{
		{name: "dir/", typ: tar.TypeDir},
		{name: "dir/f", typ: tar.TypeReg, body: "new"},
		{name: "top", typ: tar.TypeReg, body: "new top"},
	}
	truncated := makeTar(t, append(good, entry{name: "big", typ: tar.TypeReg, body: strings.Repeat("b", 10_000)}))
	truncated = truncated[:len(truncated)-6000]
	failures := map[string][]byte{
		"truncated":    truncated,
		"unsafe entry": makeTar(t, append(good, entry{name: "../x", typ: tar.TypeReg, body: "x"})),
		"not a tar":    bytes.Repeat([]byte("garbage "), 200),
		"unsupported":  makeTar(t, append(good, entry{name: "x", typ: 'Z'})),
	}
	for name, archive := range failures {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			fresh := filepath.Join(base, "a", "b", "c")
			if _, err := tartree.Extract(fresh, bytes.NewReader(archive), tartree.Options{}); err == nil {
				t.Fatal("Extract into a missing directory succeeded")
			}
			if entries, _ := os.ReadDir(base); len(entries) != 0 {
				t.Errorf("%s holds %v after the failed extraction, want nothing", base, entries)
			}
			existing := filepath.Join(base, "existing")
			os.MkdirAll(filepath.Join(existing, "dir"), 0o755)
			os.WriteFile(filepath.Join(existing, "dir", "f"), []byte("old"), 0o644)
			os.WriteFile(filepath.Join(existing, "top"), []byte("old top"), 0o644)
			before := listing(t, existing)
			if _, err := tartree.Extract(existing, bytes.NewReader(archive), tartree.Options{}); err == nil {
				t.Fatal("Extract into an existing directory succeeded")
			}
			if after := listing(t, existing); !slices.Equal(after, before) {
				t.Errorf("%s holds %q after the failed extraction, want %q", existing, after, before)
			}
		})
	}
	// A conflict found before anything moves: a file of the archive where
	// the directory has a non-empty directory.
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "top", "x"), 0o755)
	before := listing(t, base)
	_, err := tartree.Extract(base, bytes.NewReader(makeTar(t, good)), tartree.Options{})
	if !errors.Is(err, unix.EISDIR) {
		t.Errorf("Extract over a non-empty directory = %v, want EISDIR", err)
	}
	if after := listing(t, base); !slices.Equal(after, before) {
		t.Errorf("%s holds %q after the conflict, want %q", base, after, before)
	}
}

// TestExtractMerges extracts into an existing directory as tar(1) does:
// files are replaced, directories merged, entries below a directory the
// archive does not hold go through an existing symlink that stays inside,
// a directory entry replaces a file, a file replaces an empty directory.
func TestExtractMerges(t *testing.T) {
	dest := t.TempDir()
	for p, body := range map[string]string{"a": "old a", "d/keep": "kept", "e": "a file", "h": "linked"} {
		os.MkdirAll(filepath.Join(dest, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dest, p), []byte(body), 0o644)
	}
	os.Symlink("d", filepath.Join(dest, "s"))
	os.Mkdir(filepath.Join(dest, "emptydir"), 0o755)
	_, err := tartree.Extract(dest, bytes.NewReader(makeTar(t, []entry{
		{name: "a", typ: tar.TypeReg, body: "new a"},
		{name: "d/new", typ: tar.TypeReg, body: "new in d"},
		{name: "s/x", typ: tar.TypeReg, body: "through s"},
		{name: "e/", typ: tar.TypeDir},
		{name: "e/in", typ: tar.TypeReg, body: "in e"},
		{name: "emptydir", typ: tar.TypeReg, body: "was a dir"},
		{name: "hl", typ: tar.TypeLink, link: "h"},
	})), tartree.Options{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	want := []string{
		" d---------", "/a ---------- new a", "/d d---------", "/d/keep ---------- kept", "/d/new ---------- new in d",
		"/d/x ---------- through s", "/e d---------", "/e/in ---------- in e", "/emptydir ---------- was a dir",
		"/h ---------- linked", "/hl ---------- linked", "/s L--------- -> d",
	}
	if got := listing(t, dest); !slices.Equal(got, want) {
		t.Errorf("after the merge:\n%q\nwant\n%q", got, want)
	}
}

// TestExtractRootEntry applies the archive's "." entry to a directory the
// extraction makes, and leaves an existing directory's mode alone.
func TestExtractRootEntry(t *testing.T) {
	archive := makeTar(t, []entry{{name: "./", typ: tar.TypeDir, mode: 0o700}, {name: "./f", typ: tar.TypeReg, body: "f"}})
	fresh := filepath.Join(t.TempDir(), "new")
	if _, err := tartree.Extract(fresh, bytes.NewReader(archive), tartree.Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("new directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	existing := t.TempDir()
	os.Chmod(existing, 0o755)
	if _, err := tartree.Extract(existing, bytes.NewReader(archive), tartree.Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(existing); fi.Mode().Perm() != 0o755 {
		t.Errorf("existing directory got mode %v, want it kept (0755)", fi.Mode())
	}
}

// TestExtractStagingHook checks Options.Staging: it is called once, with
// the staging directory's path before it exists (merge mode: inside dir;
// otherwise beside the first missing component), a name IsStagingName
// accepts; the path is gone when Extract returns; its error stops the
// extraction with nothing made.
func TestExtractStagingHook(t *testing.T) {
	archive := makeTar(t, []entry{{name: "f", typ: tar.TypeReg, body: "x"}})
	for _, tt := range []struct {
		name, dir, wantParent string
	}{
		{"merge", "d", "d"},
		{"new", "new/sub", "."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			os.Mkdir(filepath.Join(root, "d"), 0o755)
			var got []string
			opts := tartree.Options{Staging: func(p string) error {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("staging %s exists at the call: %v", p, err)
				}
				got = append(got, p)
				return nil
			}}
			if _, err := tartree.Extract(filepath.Join(root, tt.dir), bytes.NewReader(archive), opts); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || filepath.Dir(got[0]) != filepath.Join(root, tt.wantParent) || !tartree.IsStagingName(filepath.Base(got[0])) {
				t.Fatalf("Staging called with %q, want one staging name in %s", got, filepath.Join(root, tt.wantParent))
			}
			if _, err := os.Lstat(got[0]); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("staging %s after Extract: %v, want it gone", got[0], err)
			}
		})
	}
	root := t.TempDir()
	refused := errors.New("no record")
	_, err := tartree.Extract(filepath.Join(root, "x"), bytes.NewReader(archive), tartree.Options{Staging: func(string) error { return refused }})
	if !errors.Is(err, refused) {
		t.Errorf("Extract with a failing Staging = %v, want its error", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("%s holds %v after a refused staging, want nothing", root, entries)
	}
}

func TestIsStagingName(t *testing.T) {
	for name, want := range map[string]bool{
		".berth-upload-0123456789ab":  true,
		".berth-upload-0123456789AB":  false,
		".berth-upload-0123456789a":   false,
		".berth-upload-0123456789abc": false,
		".berth-upload-0123456789ag":  false,
		"berth-upload-0123456789ab":   false,
	} {
		if got := tartree.IsStagingName(name); got != want {
			t.Errorf("IsStagingName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestExtractSyncFewFiles: with Options.Sync, an archive of a few files
// (berth cp of one file is one entry) is made durable by fsync(2) of its
// files and directories, not syncfs(2) of the whole file system, which
// also writes every other tenant's unwritten data on a shared pool (berth
// cp in fell to 0.16x of cp && sync so, issue 21); a large archive still
// takes one syncfs and no fsync of a file: its first files are not fsynced
// before the extraction knows the archive is large (5,000 files took 62
// fsyncs, 0.2-0.6 s of an Upload's 1.5 s under load, issue 23). The trees
// are complete either way.
func TestExtractSyncFewFiles(t *testing.T) {
	calls, fsyncs := tartree.CountSyncfs(t), tartree.CountFsync(t)
	base := t.TempDir()
	one := makeTar(t, []entry{{name: "f.bin", typ: tar.TypeReg, body: "data"}})
	for _, dir := range []string{base, filepath.Join(base, "new", "deeper")} {
		if _, err := tartree.Extract(dir, bytes.NewReader(one), tartree.Options{Sync: true}); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "f.bin")); err != nil || string(b) != "data" {
			t.Fatalf("%s/f.bin = %q, %v", dir, b, err)
		}
	}
	few := makeTar(t, []entry{{name: "d/", typ: tar.TypeDir}, {name: "d/a", typ: tar.TypeReg, body: "a"}, {name: "d/l", typ: tar.TypeSymlink, link: "a"}})
	if _, err := tartree.Extract(filepath.Join(base, "few"), bytes.NewReader(few), tartree.Options{Sync: true}); err != nil {
		t.Fatal(err)
	}
	if *calls != 0 || *fsyncs != 3 {
		t.Errorf("Extract of a few files called syncfs %d times and fsync of a file %d times, want 0 and 3 (fsync of each)", *calls, *fsyncs)
	}
	*fsyncs = 0
	var many []entry
	for i := range 100 {
		many = append(many, entry{name: "m/" + strings.Repeat("x", i+1), typ: tar.TypeReg, body: "x"})
	}
	counts, err := tartree.Extract(filepath.Join(base, "many"), bytes.NewReader(makeTar(t, many)), tartree.Options{Sync: true})
	if err != nil || counts.Files != 100 {
		t.Fatalf("Extract of 100 files = %+v, %v", counts, err)
	}
	if *calls != 1 || *fsyncs != 0 {
		t.Errorf("Extract of 100 files called syncfs %d times and fsync of a file %d times, want 1 and 0", *calls, *fsyncs)
	}
}

// TestExtractFileModesAndTimes extracts files of every kind of mode under
// umasks that leave it whole and that would cut it: a file made with its
// final mode (no fchmod) and one whose mode fchmod sets end up with the
// archive's mode (setuid and setgid cleared without Chown) and its times.
func TestExtractFileModesAndTimes(t *testing.T) {
	modes := []int64{0o000, 0o400, 0o444, 0o600, 0o640, 0o644, 0o666, 0o700, 0o755, 0o777, 0o1644, 0o2755, 0o4755}
	mtime := time.Date(2021, 3, 4, 5, 6, 7, 891011121, time.UTC)
	atime := time.Date(2022, 1, 2, 3, 4, 5, 600000000, time.UTC)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range modes {
		body := fmt.Sprintf("mode %o", m)
		hdr := &tar.Header{Name: fmt.Sprintf("f%o", m), Typeflag: tar.TypeReg, Mode: m, Size: int64(len(body)), ModTime: mtime, AccessTime: atime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	for _, umask := range []int{0, 0o022, 0o077, 0o777} {
		t.Run(fmt.Sprintf("umask%03o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			t.Cleanup(func() { syscall.Umask(old) })
			dir := filepath.Join(t.TempDir(), "out")
			if _, err := tartree.Extract(dir, bytes.NewReader(buf.Bytes()), tartree.Options{}); err != nil {
				t.Fatal(err)
			}
			for _, m := range modes {
				name := filepath.Join(dir, fmt.Sprintf("f%o", m))
				var st unix.Stat_t
				if err := unix.Lstat(name, &st); err != nil {
					t.Fatal(err)
				}
				want := uint32(m) &^ 0o6000
				if got := st.Mode & 0o7777; got != want {
					t.Errorf("mode of %s = %04o, want %04o", name, got, want)
				}
				if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
					t.Errorf("mtime of %s = %v, want %v", name, got, mtime)
				}
				if got := time.Unix(st.Atim.Unix()); !got.Equal(atime) {
					t.Errorf("atime of %s = %v, want %v", name, got, atime)
				}
				if b, err := os.ReadFile(name); err != nil || string(b) != fmt.Sprintf("mode %o", m) {
					t.Errorf("content of %s = %q, %v", name, b, err)
				}
			}
		})
	}
}
