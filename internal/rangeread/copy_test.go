package rangeread

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/tartree"
)

// source returns a file of content open read-only and its fstat.
func source(t *testing.T, content []byte) (*os.File, *unix.Stat_t) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, &st
}

func TestCopy(t *testing.T) {
	content := bytes.Repeat([]byte("0123456789abcdef"), (20<<20)/16+3) // past copyStepBytes twice, not page aligned
	src, st := source(t, content)
	for _, tc := range []struct {
		name           string
		offset, length uint64
		toEnd          bool
	}{
		{"whole", 0, uint64(len(content)), true},
		{"middle", 12345, 9 << 20, false},
		{"tail", uint64(len(content)) - 100, 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			// An existing offset: the copy goes after what is there.
			if _, err := dst.WriteString("prefix"); err != nil {
				t.Fatal(err)
			}
			var moved uint64
			r := Range{FD: int(src.Fd()), Path: "/src", First: st, Offset: tc.offset, Length: tc.length, ToEnd: tc.toEnd}
			mode, err := Copy(context.Background(), int(dst.Fd()), r, func(n int) { moved += uint64(n) })
			if err != nil {
				t.Fatalf("Copy (%s): %v", mode, err)
			}
			if moved != tc.length {
				t.Errorf("moved %d bytes, want %d", moved, tc.length)
			}
			if off, _ := dst.Seek(0, io.SeekCurrent); off != int64(6+tc.length) {
				t.Errorf("destination offset after the copy = %d, want %d", off, 6+tc.length)
			}
			got, err := os.ReadFile(dst.Name())
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte("prefix"), content[tc.offset:tc.offset+tc.length]...)
			if !bytes.Equal(got, want) {
				t.Errorf("destination holds %d bytes differing from the %d wanted (mode %s)", len(got), len(want), mode)
			}
		})
	}
}

func TestCopyChanged(t *testing.T) {
	content := bytes.Repeat([]byte("x"), 1<<20)
	src, st := source(t, content)
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	// The range promises more than the file holds: it "shrank".
	r := Range{FD: int(src.Fd()), Path: "/src", First: st, Length: 2 << 20, ToEnd: true}
	_, err = Copy(context.Background(), int(dst.Fd()), r, func(int) {})
	var changed *tartree.ChangedError
	if !errors.As(err, &changed) {
		t.Fatalf("Copy of a range past the end = %v, want a ChangedError", err)
	}
	// It grew: one byte appended past the size First recorded.
	if err := os.WriteFile(src.Name(), append(content, 'y'), 0o644); err != nil {
		t.Fatal(err)
	}
	r = Range{FD: int(src.Fd()), Path: "/src", First: st, Length: 1 << 20, ToEnd: true}
	if _, err := Copy(context.Background(), int(dst.Fd()), r, func(int) {}); !errors.As(err, &changed) {
		t.Fatalf("Copy of a file that grew = %v, want a ChangedError", err)
	}
}

func TestCopyToPipe(t *testing.T) {
	// A pipe refuses copy_file_range (EINVAL): sendfile moves it.
	content := bytes.Repeat([]byte("p"), 40000)
	src, st := source(t, content)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	pr := os.NewFile(uintptr(p[0]), "pipe")
	defer pr.Close()
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		t.Fatal(err)
	}
	r := Range{FD: int(src.Fd()), Path: "/src", First: st, Length: uint64(len(content)), ToEnd: true}
	mode, err := Copy(context.Background(), p[1], r, func(int) {})
	if err != nil {
		t.Fatalf("Copy into a pipe (%s): %v", mode, err)
	}
	if mode != "sendfile" {
		t.Errorf("Copy into a pipe used %s, want sendfile", mode)
	}
	got := make([]byte, len(content))
	if _, err := io.ReadFull(pr, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Error("the pipe yields other bytes than the file's")
	}
}
