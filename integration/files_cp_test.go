package integration

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/client"
)

// TestCLICpKeepsTimes copies a single file into a sandbox and out again,
// and a directory out, with berth cp: each keeps its mtime to the
// nanosecond and its mode, as cp -a and docker cp do, the downloaded
// directory's top level included (issue 21).
func TestCLICpKeepsTimes(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	local := t.TempDir()
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 123456789, time.UTC)

	// A single file in: the sandbox's file has the local one's mtime.
	one := filepath.Join(local, "one.txt")
	if err := os.WriteFile(one, []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(one, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := berthCLI(t, nil, "cp", one, id+":/workspace/in/one.txt"); code != 0 {
		t.Fatalf("cp file in: exit %d: %s", code, errOut)
	}
	info, err := c.Stat(ctx, id, "/workspace/in/one.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetModifiedAt().AsTime(); !got.Equal(mtime) || info.GetMode()&0o7777 != 0o640 {
		t.Errorf("uploaded file: mtime %v mode %o, want %v and 0640", got, info.GetMode()&0o7777, mtime)
	}

	// A single file out, under another name: the local file has the
	// sandbox's mtime.
	run(t, id, "touch", "-d", "2002-03-04 05:06:07", "/workspace/in/one.txt")
	info, err = c.Stat(ctx, id, "/workspace/in/one.txt")
	if err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(local, "back.txt")
	if _, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/in/one.txt", back); code != 0 {
		t.Fatalf("cp file out: exit %d: %s", code, errOut)
	}
	if fi, err := os.Stat(back); err != nil || !fi.ModTime().Equal(info.GetModifiedAt().AsTime()) || fi.Mode() != 0o640 {
		t.Errorf("downloaded file: %v, %v; want mtime %v and mode 0640", fi, err, info.GetModifiedAt().AsTime())
	}
	if got, _ := os.ReadFile(back); string(got) != "one\n" {
		t.Errorf("downloaded file holds %q", got)
	}
	if entries, _ := os.ReadDir(local); len(entries) != 2 {
		t.Errorf("the download left %d entries in its directory, want one.txt and back.txt", len(entries))
	}

	// A directory out: its top level keeps the sandbox's mode and mtime.
	run(t, id, "mkdir", "-m", "0750", "/workspace/tree")
	run(t, id, "touch", "/workspace/tree/f")
	run(t, id, "touch", "-d", "2003-04-05 06:07:08", "/workspace/tree")
	dirInfo, err := c.Stat(ctx, id, "/workspace/tree")
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(local, "tree")
	if _, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/tree", tree); code != 0 {
		t.Fatalf("cp dir out: exit %d: %s", code, errOut)
	}
	want := dirInfo.GetModifiedAt().AsTime()
	if fi, err := os.Stat(tree); err != nil || !fi.ModTime().Equal(want) || fi.Mode().Perm() != 0o750 {
		t.Errorf("downloaded directory: %v, %v; want mtime %v and mode 0750", fi, err, want)
	}
}

// TestCLICpSparse copies a 1 GiB file of three data blocks into a
// sandbox and out again with berth cp: its holes stay holes on both sides
// (few blocks allocated), and neither copy writes or sends the zeros.
func TestCLICpSparse(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	local := t.TempDir()
	const size = 1 << 30
	offsets := []int64{0, size / 2, size - 4096}
	src := filepath.Join(local, "sparse.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[int64][]byte{}
	for _, off := range offsets {
		blocks[off] = randomData(4096)
		if _, err := f.WriteAt(blocks[off], off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if _, errOut, code := berthCLI(t, nil, "cp", src, id+":/workspace/sparse.img"); code != 0 {
		t.Fatalf("cp sparse in: exit %d: %s", code, errOut)
	}
	t.Logf("cp of the 1 GiB sparse file in: %v", time.Since(start))
	// In the sandbox: 1 GiB long, the data where it was, few blocks.
	r := run(t, id, "stat", "-c", "%s %b", "/workspace/sparse.img")
	fields := strings.Fields(string(r.GetStdout()))
	if len(fields) != 2 || fields[0] != strconv.Itoa(size) {
		t.Fatalf("stat in the sandbox = %q (%s), want size %d", r.GetStdout(), r.GetStderr(), size)
	}
	if n, _ := strconv.Atoi(fields[1]); n == 0 || n > 1024 {
		t.Errorf("the uploaded file has %d blocks of 512 bytes allocated, want a few (3 blocks of 4 KiB were written)", n)
	}
	for _, off := range offsets {
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, id, "/workspace/sparse.img", &got, client.WithRange(uint64(off), 4096)); err != nil || !bytes.Equal(got.Bytes(), blocks[off]) {
			t.Errorf("the uploaded file at %d: %d bytes, %v; want the block written there", off, got.Len(), err)
		}
	}

	back := filepath.Join(local, "back.img")
	start = time.Now()
	if _, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/sparse.img", back); code != 0 {
		t.Fatalf("cp sparse out: exit %d: %s", code, errOut)
	}
	t.Logf("cp of the 1 GiB sparse file out: %v", time.Since(start))
	var st unix.Stat_t
	if err := unix.Stat(back, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks == 0 || st.Blocks > 1024 {
		t.Errorf("the downloaded file: size %d, %d blocks of 512 bytes; want %d and a few", st.Size, st.Blocks, size)
	}
	if !sameContent(t, src, back) {
		t.Errorf("the downloaded file differs from the one uploaded")
	}
}

// sameContent reports whether the files a and b hold the same bytes. It
// reads only where either has data (lseek(2) SEEK_DATA): what it passes
// over is a hole in both, zeros (reading 1 GiB of holes takes seconds).
func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	var files [2]*os.File
	for i, name := range []string{a, b} {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	var st [2]unix.Stat_t
	for i, f := range files {
		if err := unix.Fstat(int(f.Fd()), &st[i]); err != nil {
			t.Fatal(err)
		}
	}
	size := st[0].Size
	if st[1].Size != size {
		return false
	}
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(bufA)) {
		next := size
		for _, f := range files {
			if data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA); err == nil {
				next = min(next, data)
			} else if err != unix.ENXIO { // ENXIO: only a hole is left
				t.Fatal(err)
			}
		}
		if off = next; off >= size {
			return true
		}
		na, errA := files[0].ReadAt(bufA, off)
		nb, errB := files[1].ReadAt(bufB, off)
		if (errA != nil && errA != io.EOF) || (errB != nil && errB != io.EOF) {
			t.Fatalf("comparing %s and %s: %v, %v", a, b, errA, errB)
		}
		if na != nb || !bytes.Equal(bufA[:na], bufB[:nb]) {
			return false
		}
	}
	return true
}
