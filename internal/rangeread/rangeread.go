// Package rangeread sends a byte range of an open regular file as chunk
// messages, with the checks that a file did not change while it was
// read: the agent's ReadFile and berthd's reads from the descriptor an
// agent handed it (server/filesvc) make the same reads and give the same
// answers.
package rangeread

import (
	"context"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/tartree"
	"github.com/berth-sandbox/berth/internal/wire"
)

// Range is what Send reads: length bytes from Offset of the regular
// file open at FD (named Path in errors), whose fstat(2) when its size
// was taken is First. ToEnd says the range runs to the end of the file
// (no limit asked): a byte past it means the file grew.
type Range struct {
	FD     int
	Path   string
	First  *unix.Stat_t
	Offset uint64
	Length uint64
	ToEnd  bool
}

// Send sends r as chunk messages (the bytes field numbered field) of at
// most chunk bytes, each read with pread(2) straight into the buffer gRPC
// sends it from, through send; moved counts each chunk's bytes. It fails
// with a *tartree.ChangedError when the file yields fewer bytes than the
// range, more (ToEnd), or another size or modification time than First by
// fstat(2) after the last chunk; with an *fs.PathError ("read", "fstat")
// carrying the errno of a failing call; with ctx's error once ctx ends;
// and with send's error.
func Send(ctx context.Context, send func(*wire.Frame) error, field protoreflect.FieldNumber, chunk int, r Range, moved func(int)) error {
	var fr wire.Frame
	defer fr.Free()
	var done uint64
	for done < r.Length {
		if err := ctx.Err(); err != nil {
			return err
		}
		want := min(uint64(chunk), r.Length-done)
		n, err := fr.Fill(field, int(want), func(p []byte) (int, error) {
			for {
				n, err := unix.Pread(r.FD, p, int64(r.Offset+done))
				if err != unix.EINTR {
					return n, err
				}
			}
		})
		if err != nil {
			return &fs.PathError{Op: "read", Path: r.Path, Err: err}
		}
		if n == 0 {
			return &tartree.ChangedError{Path: r.Path, Why: fmt.Sprintf("it ended after %d of the %d bytes its size promised", done, r.Length)}
		}
		moved(n)
		if err := send(&fr); err != nil {
			return err
		}
		done += uint64(n)
	}
	return r.finish()
}

// finish checks, after the range was read whole, that the file did not
// change: no byte past the range when it runs to the end, and the size
// and modification time of First.
func (r Range) finish() error {
	size := uint64(r.First.Size)
	if r.ToEnd {
		// Reading to the end: a byte past it means the file grew.
		var one [1]byte
		n, err := unix.Pread(r.FD, one[:], int64(r.Offset+r.Length))
		if err == nil && n > 0 && r.Offset <= size {
			return &tartree.ChangedError{Path: r.Path, Why: fmt.Sprintf("it grew past the %d bytes its size promised", size)}
		}
	}
	var last unix.Stat_t
	if err := unix.Fstat(r.FD, &last); err != nil {
		return &fs.PathError{Op: "fstat", Path: r.Path, Err: err}
	}
	if last.Size != r.First.Size || last.Mtim != r.First.Mtim {
		return &tartree.ChangedError{Path: r.Path, Why: fmt.Sprintf("its size or modification time changed (size %d then %d)", r.First.Size, last.Size)}
	}
	return nil
}
