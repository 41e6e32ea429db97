package tarbomb

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
)

func TestBombsUnpackToTheirSize(t *testing.T) {
	gz, err := Gzip("zeros", 200<<20+3)
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := Sparse(t.TempDir(), "holes", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, entry string
		archive     []byte
		compressed  bool
		size        int64
		maxArchive  int
	}{
		{"gzip", "zeros", gz, true, 200<<20 + 3, 400 << 10},
		{"sparse", "holes", sparse, false, 1 << 30, 64 << 10},
	} {
		if len(tt.archive) > tt.maxArchive {
			t.Errorf("%s: archive of %d bytes, want at most %d", tt.name, len(tt.archive), tt.maxArchive)
		}
		var r io.Reader = bytes.NewReader(tt.archive)
		if tt.compressed {
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		tr := tar.NewReader(r)
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		n, err := io.Copy(io.Discard, tr)
		if err != nil || hdr.Name != tt.entry || hdr.Size != tt.size || n != tt.size {
			t.Errorf("%s: entry %q of size %d yields %d bytes (%v), want %q of %d", tt.name, hdr.Name, hdr.Size, n, err, tt.entry, tt.size)
		}
		if _, err := tr.Next(); err != io.EOF {
			t.Errorf("%s: after the entry: %v, want the end of the archive", tt.name, err)
		}
	}
}
