package main

import (
	"fmt"
	"strings"
	"unicode"
)

// terminalSafe returns s with the characters that can steer a terminal or
// disguise text written as \xNN escapes of their UTF-8 bytes: C0 and C1
// control characters (ESC starts escape sequences that can retitle the
// window, rewrite the screen or, on some terminals, answer back as
// input), DEL, and the bidirectional formatting characters (which reorder
// what is shown). Names and messages that come from a sandbox pass through
// it before berth prints them for people; file contents and command output
// are printed byte for byte, as cat(1) would.
func terminalSafe(s string) string {
	if strings.IndexFunc(s, unsafeRune) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !unsafeRune(r) {
			b.WriteRune(r)
			continue
		}
		for _, c := range []byte(string(r)) {
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

// terminalSafeLines is terminalSafe keeping line breaks and tabs, which
// cannot steer a terminal: for berth's own messages that span lines, like
// cobra's "Did you mean this?" suggestions.
func terminalSafeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		fields := strings.Split(l, "\t")
		for j, f := range fields {
			fields[j] = terminalSafe(f)
		}
		lines[i] = strings.Join(fields, "\t")
	}
	return strings.Join(lines, "\n")
}

func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}
