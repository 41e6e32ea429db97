package auth

import (
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	tok := strings.Repeat("a", 40)
	good := "# berth tokens\n\n" + TokenHash(tok) + "  alice\n" + TokenHash(tok+"b") + "\tbob@example.com\n"
	set, err := parseTokens(strings.NewReader(good), "tokens")
	if err != nil {
		t.Fatalf("parseTokens(good file): %v", err)
	}
	for token, want := range map[string]string{tok: "alice", tok + "b": "bob@example.com"} {
		if got, ok := set.lookup(token); !ok || got != want {
			t.Errorf("lookup(%q) = %q, %v; want %q", token, got, ok, want)
		}
	}
	if got, ok := set.lookup(tok + "c"); ok {
		t.Errorf("lookup(unknown token) = %q, true; want no principal", got)
	}

	for _, tc := range []struct {
		name, file, want string
	}{
		{"one field", TokenHash(tok) + "\n", "line 1: want"},
		{"three fields", TokenHash(tok) + " alice extra\n", "line 1: want"},
		{"no algorithm", strings.TrimPrefix(TokenHash(tok), "sha256:") + " alice\n", `line 1: the hash must start with "sha256:"`},
		{"short hash", "sha256:abcd alice\n", "line 1: the hash must be 64 hex digits"},
		{"not hex", "sha256:" + strings.Repeat("zz", 32) + " alice\n", "line 1: the hash must be 64 hex digits"},
		{"unix name", TokenHash(tok) + " unix:uid:0\n", `line 1: principal name "unix:uid:0": names starting with "unix:" belong to unix socket peers`},
		{"bad name", "#\n" + TokenHash(tok) + " -alice\n", `line 2: principal name "-alice" must be`},
		{"duplicate", TokenHash(tok) + " alice\n" + TokenHash(tok) + " bob\n", "line 2: the same hash as line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTokens(strings.NewReader(tc.file), "tokens")
			if err == nil || !strings.Contains(err.Error(), "token file tokens "+tc.want) {
				t.Errorf("parseTokens = %v; want an error containing %q", err, "token file tokens "+tc.want)
			}
		})
	}
}

func TestTokenHash(t *testing.T) {
	// sha256("") is a well-known value.
	if got, want := TokenHash(""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; got != want {
		t.Errorf("TokenHash(\"\") = %s, want %s", got, want)
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"alice": true, "bob@example.com": true, "node-1.berth.internal": true, "spiffe:team:ci": true,
		"": false, "-x": false, "a b": false, "a/b": false, strings.Repeat("a", 129): false, "unix:uid:0": false,
	} {
		if got := ValidName(name, false) == nil; got != want {
			t.Errorf("ValidName(%q, false) ok = %v, want %v", name, got, want)
		}
	}
	if err := ValidName("unix:uid:1000", true); err != nil {
		t.Errorf("ValidName(unix:uid:1000, true) = %v, want ok", err)
	}
}

// TestForwardingMD checks what a node passes on when it forwards a call:
// the principal's name always, its bearer token only for an admin who
// authenticated with one (the receiver needs it to accept an admin;
// nobody else's token leaves the node it was sent to).
func TestForwardingMD(t *testing.T) {
	tok := strings.Repeat("t", 64)
	for _, tc := range []struct {
		p         Principal
		wantToken string
	}{
		{Principal{Name: "ops", Admin: true, Method: "token", token: tok}, tok},
		{Principal{Name: "alice", Method: "token", token: tok}, ""},
		{Principal{Name: "ops", Admin: true, Method: "tls"}, ""},
		{Principal{Name: RootPrincipal, Admin: true, Method: "unix"}, ""},
	} {
		md := tc.p.ForwardingMD()
		if got := md.Get(ForwardedHeader); len(got) != 1 || got[0] != tc.p.Name {
			t.Errorf("%v: %s = %v, want [%s]", tc.p, ForwardedHeader, got, tc.p.Name)
		}
		var got string
		if v := md.Get(ForwardedTokenHeader); len(v) > 0 {
			got = v[0]
		}
		if got != tc.wantToken || md.Len() != 1+len(md.Get(ForwardedTokenHeader)) {
			t.Errorf("%v (%s): %s = %q (metadata %d keys), want %q", tc.p, tc.p.Method, ForwardedTokenHeader, got, md.Len(), tc.wantToken)
		}
	}
}
