package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWriteTree archives a directory as berth cp uploads it: the
// directory itself first as "./", hard links as links, and a unix socket
// named to skip instead of archived. (internal/tartree tests the archive
// against real tar implementations.)
func TestWriteTree(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var skipped []string
	var buf bytes.Buffer
	if err := writeTree(&buf, dir, "", func(name, why string) { skipped = append(skipped, name+": "+why) }); err != nil {
		t.Fatal(err)
	}
	var got []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(h.Typeflag)+" "+h.Name+" "+h.Linkname)
	}
	if want := []string{"5 ./ ", "0 a ", "1 b a"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("archive holds %q, want %q", got, want)
	}
	if len(skipped) != 1 || !strings.HasPrefix(skipped[0], sock+": ") {
		t.Errorf("skipped %q, want the socket", skipped)
	}
}

// TestWriteTreeFile archives a single file as berth cp uploads it: one
// entry named for its destination, with its mtime to the nanosecond, and
// a 1 GiB file of two data blocks as a sparse entry that carries the data
// alone, not the zeros.
func TestWriteTreeFile(t *testing.T) {
	const size = 1 << 30
	src := filepath.Join(t.TempDir(), "sparse.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{0xa5}, 4096)
	for _, off := range []int64{0, size - 4096} {
		if _, err := f.WriteAt(block, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 123456789, time.UTC)
	if err := os.Chtimes(src, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTree(&buf, src, "renamed.img", func(name, why string) { t.Errorf("skipped %s: %s", name, why) }); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 64<<10 {
		t.Errorf("the archive of a file of 8 KiB of data is %d bytes long", buf.Len())
	}
	tr := tar.NewReader(&buf)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "renamed.img" || h.Size != size || !h.ModTime.Equal(mtime) {
		t.Errorf("entry %q of %d bytes, mtime %v; want renamed.img of %d bytes, mtime %v", h.Name, h.Size, h.ModTime, size, mtime)
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("a second entry: %v", err)
	}
}

// TestCopierExit exits 1 after skipped entries, which are named on
// stderr, unless --skip-special accepts them.
func TestCopierExit(t *testing.T) {
	for _, accept := range []bool{false, true} {
		var stderr bytes.Buffer
		cp := &copier{opts: cpOptions{skipSpecial: accept}, stderr: &stderr}
		cp.skip("dev/null", "a character device node may not be created here")
		err := cp.exit()
		var status exitStatus
		if accept && err != nil || !accept && (!errors.As(err, &status) || status != 1) {
			t.Errorf("--skip-special=%v: exit = %v", accept, err)
		}
		if !strings.Contains(stderr.String(), "skipped dev/null: a character device") {
			t.Errorf("--skip-special=%v: stderr %q does not name the entry", accept, stderr.String())
		}
	}
}

// TestCopierExitSummary counts the entries left out in proper English and
// says that the rest was copied: exit 1 after a skip is not a failed copy.
func TestCopierExitSummary(t *testing.T) {
	for n, want := range map[int]string{
		1: "berth: cp: 1 entry was not copied, the rest was (--skip-special accepts that)\n",
		2: "berth: cp: 2 entries were not copied, the rest was (--skip-special accepts that)\n",
	} {
		var stderr bytes.Buffer
		cp := &copier{stderr: &stderr}
		for i := range n {
			cp.skip("s"+string(rune('0'+i)), "a unix socket cannot be archived")
		}
		var status exitStatus
		if err := cp.exit(); !errors.As(err, &status) || status != 1 {
			t.Errorf("%d skipped: exit = %v, want exit status 1", n, err)
		}
		if !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("%d skipped: stderr %q, want it to end with %q", n, stderr.String(), want)
		}
	}
}
