// Package tarbomb makes small archives that unpack to far more than their
// size, for tests of what berth lets an Upload write: a gzip of zeros
// (about a thousandth of what it expands to) and a sparse tar (a few KiB
// for any apparent size).
package tarbomb

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// gzipBlock is the most zeros one gzip member of Gzip holds.
const gzipBlock = 64 << 20

// Gzip returns a gzipped tar of one regular file, name, of size zero bytes.
// It is a series of gzip members (RFC 1952 section 2.2 allows a file of
// several; Go's gzip.Reader and gzip(1) read them as one stream) of at most
// 64 MiB of zeros each, the full ones all the same bytes, so that a bomb of
// gigabytes costs one compression of 64 MiB.
func Gzip(name string, size int64) ([]byte, error) {
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	// WriteHeader writes the header blocks at once; what follows them, the
	// file's bytes, its padding to 512 and the two blocks that end the
	// archive, is all zeros.
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		return nil, err
	}
	out := member(hdr.Bytes())
	zeros := size + (512-size%512)%512 + 1024
	if zeros >= gzipBlock {
		full := member(make([]byte, gzipBlock))
		for ; zeros >= gzipBlock; zeros -= gzipBlock {
			out = append(out, full...)
		}
	}
	return append(out, member(make([]byte, zeros))...), nil
}

// member returns data as one gzip member, compressed as much as gzip can.
func member(data []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// Sparse returns a PAX tar, made by GNU tar --sparse (Go's archive/tar
// writes no sparse files), of one sparse file, name, of apparent size bytes
// that holds 4 KiB of 'x' at its start and holes after. dir is a scratch
// directory for the file.
func Sparse(dir, name string, size int64) ([]byte, error) {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(bytes.Repeat([]byte("x"), 4096))
	if err == nil {
		err = f.Truncate(size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("tar", "--sparse", "--format=posix", "-C", dir, "-cf", "-", name).Output()
	if err != nil {
		return nil, fmt.Errorf("tar --sparse: %w", err)
	}
	return out, nil
}

// Zeros reads as endless zero bytes.
type Zeros struct{}

func (Zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
