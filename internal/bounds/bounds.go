// Package bounds checks the sizes, counts, durations and strings that
// arrive in requests: sums and products that cannot wrap, values held
// between a floor and a cap, and strings of bounded length that are valid
// UTF-8. What is out of bounds is refused with INVALID_ARGUMENT naming the
// field (rpcstatus.InvalidArgument), never clamped: a caller learns that
// its request was not what it got.
package bounds

import (
	"fmt"
	"math/bits"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// Add returns a+b, and false when the sum does not fit in 64 bits.
func Add(a, b uint64) (uint64, bool) {
	sum, carry := bits.Add64(a, b, 0)
	return sum, carry == 0
}

// Mul returns a×b, and false when the product does not fit in 64 bits.
func Mul(a, b uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	return lo, hi == 0
}

// Uint checks v, the value of field, against lo and hi (inclusive; hi 0:
// no cap). unit follows the numbers in the message ("bytes", "pids"); why
// says where a floor comes from and may be empty.
func Uint(field string, v, lo, hi uint64, unit, why string) error {
	switch {
	case v < lo:
		msg := fmt.Sprintf("%d %s is below the minimum of %d %s", v, unit, lo, unit)
		if why != "" {
			msg += ": " + why
		}
		return rpcstatus.InvalidArgument(field, msg)
	case hi > 0 && v > hi:
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%d %s exceeds the maximum of %d %s", v, unit, hi, unit))
	}
	return nil
}

// Duration returns d, the value of field, once it is a valid, non-negative
// duration from lo to hi (inclusive). Unset or zero returns 0, for the
// caller's default.
func Duration(field string, d *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%ds %dns is not a valid duration: %v", d.GetSeconds(), d.GetNanos(), err))
	}
	v := d.AsDuration()
	switch {
	case v == 0:
		return 0, nil
	case v < 0:
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%v is negative", v))
	case v < lo:
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%v is below the minimum of %v", v, lo))
	case v > hi:
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%v exceeds the maximum of %v", v, hi))
	}
	return v, nil
}

// Text says what a string field may hold beyond being valid UTF-8.
type Text struct {
	// MaxBytes caps the length in bytes.
	MaxBytes int
	// NoNUL refuses NUL bytes: the kernel ends argv, environment strings
	// and paths at the first one (execve(2), path_resolution(7)).
	NoNUL bool
}

// String checks s, the value of field: at most t.MaxBytes bytes, valid
// UTF-8, and without NUL when t.NoNUL. Messages give offsets, never the
// value, which may be a secret (an env value).
func (t Text) String(field, s string) error {
	if len(s) > t.MaxBytes {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d", len(s), t.MaxBytes))
	}
	if !utf8.ValidString(s) {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("is not valid UTF-8 (at byte offset %d)", invalidAt(s)))
	}
	if t.NoNUL {
		if at := strings.IndexByte(s, 0); at >= 0 {
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("contains a NUL byte at offset %d", at))
		}
	}
	return nil
}

// invalidAt returns the offset of the first byte of s that is not part of
// a valid UTF-8 encoding, or -1.
func invalidAt(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return i
			}
		}
	}
	return -1
}
