// Package textsafe makes text that came from outside berth safe to echo in
// a status message, a log line or on a terminal: bounded in length and
// free of the characters that can steer a terminal or disguise what is
// shown.
package textsafe

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports whether r is a character Escape rewrites: a C0 or C1
// control character (NUL, ESC, newline, ...), DEL, or a bidirectional
// formatting character (U+202E RIGHT-TO-LEFT OVERRIDE and its kin, which
// reorder what is shown).
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// Escape returns s with every Unsafe character, and every byte that is not
// part of valid UTF-8, written as \xNN escapes of its bytes. Text without
// either is returned as is.
func Escape(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, Unsafe) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || Unsafe(r) {
			for _, c := range []byte(s[i : i+size]) {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// MaxQuoted is how many bytes of a value Quote shows.
const MaxQuoted = 200

// Quote returns s as a Go-quoted string (strconv.Quote: control, format
// and invalid bytes escaped) showing at most its first MaxQuoted bytes, cut
// at a character boundary; a longer value is marked with its full length,
// e.g. "aaaa"... (102400 bytes). Use it wherever a request's value is
// echoed.
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	n := MaxQuoted
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:n]), len(s))
}

// Cut returns s cut to at most max bytes at a character boundary, with
// "..." appended when it was cut.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
