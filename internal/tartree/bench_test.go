package tartree_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/tartree"
)

// BenchmarkExtractSmallFiles extracts an archive of 5,000 random 4 KiB
// files in 50 directories, as the side-by-side benchmark's Upload-5000
// does in a sandbox (BENCHMARKS.md), into a new directory of the test's
// temporary directory: the agent's work per file in that Upload, without
// the gRPC stream and without Options.Sync, whose syncfs(2) would time
// whatever else the machine left unwritten on that file system. Each tree
// is removed off the clock. Set TMPDIR to pick the file system
// (TMPDIR=/dev/shm: tmpfs, no disk).
func BenchmarkExtractSmallFiles(b *testing.B) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := make([]byte, 4<<10)
	mtime := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	for d := range 50 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%02d/", d), Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
			b.Fatal(err)
		}
		for i := range 100 {
			rand.Read(body)
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%02d/f%03d.txt", d, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: mtime}); err != nil {
				b.Fatal(err)
			}
			tw.Write(body)
		}
	}
	tw.Close()
	archive := buf.Bytes()
	b.SetBytes(50 * 100 * 4 << 10)
	tmp := b.TempDir()
	dir := filepath.Join(tmp, "x")
	for b.Loop() {
		c, err := tartree.Extract(dir, bytes.NewReader(archive), tartree.Options{})
		if err != nil || c.Files != 5000 {
			b.Fatalf("Extract: %v, %d files", err, c.Files)
		}
		b.StopTimer()
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
