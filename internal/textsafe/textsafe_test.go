package textsafe

import (
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text, café ☕", "plain text, café ☕"},
		{"a\x00b", `a\x00b`},
		{"\x1b[31mred", `\x1b[31mred`},
		{"line\nbreak\t", `line\x0abreak\x09`},
		{"evil\u202etxt", `evil\xe2\x80\xaetxt`},
		{"a\u0085b", `a\xc2\x85b`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"del\x7f", `del\x7f`},
	} {
		if got := Escape(tc.in); got != tc.want {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestQuote(t *testing.T) {
	if got := Quote("a\x00b"); got != `"a\x00b"` {
		t.Errorf(`Quote("a\x00b") = %s`, got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := Quote(long)
	if len(got) > MaxQuoted+40 || !strings.HasSuffix(got, "... (2000 bytes)") || !strings.HasPrefix(got, `"éé`) {
		t.Errorf("Quote of 2000 bytes = %s (%d bytes), want its first %d bytes and its length", got, len(got), MaxQuoted)
	}
	if got := Cut("héllo", 2); got != "h..." {
		t.Errorf(`Cut("héllo", 2) = %q, want "h..."`, got)
	}
}
