package main

import (
	"strings"

	"github.com/berth-sandbox/berth/internal/textsafe"
)

// terminalSafe returns s with the characters that can steer a terminal or
// disguise text written as \xNN escapes of their UTF-8 bytes
// (textsafe.Escape): C0 and C1 control characters (ESC starts escape
// sequences that can retitle the window, rewrite the screen or, on some
// terminals, answer back as input), DEL, and the bidirectional formatting
// characters (which reorder what is shown). Names and messages that come
// from a sandbox pass through it before berth prints them for people; file
// contents and command output are printed byte for byte, as cat(1) would.
func terminalSafe(s string) string { return textsafe.Escape(s) }

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
