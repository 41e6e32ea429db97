package network

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" : an error
		errHas   string
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "192.0.2.7", want: "192.0.2.7"},
		{in: "192.0.2.7:443", want: "192.0.2.7:443"},
		{in: "10.1.0.0/16:5432", want: "10.1.0.0/16:5432"},
		{in: "PyPI.org.", want: "pypi.org"},
		{in: "pypi.org:443", want: "pypi.org:443"},
		{in: "*.github.com:443", want: "*.github.com:443"},
		{in: "_srv.example.com", want: "_srv.example.com"},
		{in: "", errHas: "is empty"},
		{in: ":443", errHas: "is empty"},
		{in: "pypi.org:", errHas: "port"},
		{in: "pypi.org:0", errHas: "port"},
		{in: "pypi.org:65536", errHas: "port"},
		{in: "::1", errHas: "IPv6"},
		{in: "[::1]:443", errHas: "IPv6"},
		{in: "2001:db8::/32", errHas: "IPv6"},
		{in: "10.0.0.0/33", errHas: "CIDR"},
		{in: "*.com", errHas: "top-level"},
		{in: "a..b", errHas: "empty label"},
		{in: "-a.b", errHas: "begins or ends"},
		{in: "a b.c", errHas: "holds"},
		{in: "*.*.b.c", errHas: "holds"},
		{in: strings.Repeat("a", 64) + ".b", errHas: "longer than 63"},
	} {
		r, err := ParseRule(tc.in)
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
			t.Errorf("ParseRule(%q) = %v, %v; want an error with %q", tc.in, r, err, tc.errHas)
		case tc.want != "" && (err != nil || r.String() != tc.want):
			t.Errorf("ParseRule(%q) = %v, %v; want %s", tc.in, r, err, tc.want)
		}
	}
}

func TestRuleMatches(t *testing.T) {
	exact, _ := ParseRule("pypi.org")
	wild, _ := ParseRule("*.github.com")
	for _, tc := range []struct {
		r    Rule
		name string
		want bool
	}{
		{exact, "pypi.org", true},
		{exact, "files.pypi.org", false},
		{exact, "notpypi.org", false},
		{wild, "api.github.com", true},
		{wild, "a.b.github.com", true},
		{wild, "github.com", false},
		{wild, "evilgithub.com", false},
	} {
		if got := tc.r.Matches(tc.name); got != tc.want {
			t.Errorf("%v.Matches(%q) = %v, want %v", tc.r, tc.name, got, tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	subnet := netip.MustParsePrefix("10.89.0.0/16")
	p, err := ParsePolicy("network.allow", []string{"b.example", "10.0.0.0/8", "B.example.", "10.0.0.0/8"}, 5, subnet)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Entries(), []string{"10.0.0.0/8", "b.example"}; !slices.Equal(got, want) || p.MaxConnections != 5 {
		t.Errorf("ParsePolicy = %v (max %d), want %v sorted without duplicates (max 5)", got, p.MaxConnections, want)
	}
	for _, tc := range []struct {
		entries []string
		field   string
	}{
		{[]string{"ok.example", "bad entry"}, "network.allow[1]"},
		{[]string{"10.89.0.7"}, "network.allow[0]"},
		{[]string{"10.89.4.0/24:80"}, "network.allow[0]"},
		{make([]string, MaxAllowEntries+1), "network.allow"},
	} {
		_, err := ParsePolicy("network.allow", tc.entries, 0, subnet)
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != tc.field {
			t.Errorf("ParsePolicy(%q) = %v, want a FieldError naming %s", tc.entries, err, tc.field)
		}
	}
}
