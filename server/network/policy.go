package network

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Bounds of an allow-list.
const (
	// MaxAllowEntries bounds the entries of one sandbox's allow-list.
	MaxAllowEntries = 128
	// maxNameBytes is the longest DNS name (RFC 1035, without the final
	// dot).
	maxNameBytes = 253
)

// Rule is one parsed allow-list entry: an address range (Prefix) or a DNS
// name (Name, lower case, without the final dot; Wildcard for "*.name",
// which matches every name below it but not the name itself), and a port
// (0: every port and protocol; otherwise that TCP and UDP port).
type Rule struct {
	Prefix   netip.Prefix
	Name     string
	Wildcard bool
	Port     uint16
}

// IsName reports whether r names hosts by DNS name.
func (r Rule) IsName() bool { return r.Name != "" }

// String is the canonical form of r, as ParseRule reads it.
func (r Rule) String() string {
	var host string
	switch {
	case r.IsName() && r.Wildcard:
		host = "*." + r.Name
	case r.IsName():
		host = r.Name
	case r.Prefix.IsSingleIP():
		host = r.Prefix.Addr().String()
	default:
		host = r.Prefix.String()
	}
	if r.Port != 0 {
		return host + ":" + strconv.Itoa(int(r.Port))
	}
	return host
}

// Matches reports whether the DNS name (lower case, without the final dot)
// is one r allows.
func (r Rule) Matches(name string) bool {
	if !r.IsName() {
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Name)
	}
	return name == r.Name
}

// ParseRule parses one allow-list entry:
//
//	10.0.0.0/8         an IPv4 range, every port and protocol
//	192.0.2.7          one address
//	192.0.2.7:443      one address, TCP and UDP port 443
//	10.1.0.0/16:5432   a range, one port
//	pypi.org           a DNS name: the addresses berth's resolver returns for it
//	pypi.org:443       a name, one port
//	*.github.com:443   every name below github.com (not github.com itself)
//
// Names are case-insensitive, at most 253 bytes, of labels of letters,
// digits, '-' and '_' (1 to 63 bytes each). IPv6 is refused: sandboxes
// have IPv4 only.
func ParseRule(s string) (Rule, error) {
	host, portText := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, portText = s[:i], s[i+1:]
		if strings.Contains(host, ":") {
			return Rule{}, errors.New("IPv6 is not supported: sandboxes have IPv4 only")
		}
	}
	var r Rule
	if portText != "" || strings.HasSuffix(s, ":") {
		p, err := strconv.ParseUint(portText, 10, 16)
		if err != nil || p == 0 {
			return Rule{}, fmt.Errorf("port %q must be a number from 1 to 65535", portText)
		}
		r.Port = uint16(p)
	}
	if host == "" {
		return Rule{}, errors.New("is empty; want an address, a range (CIDR) or a DNS name, with an optional :PORT")
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return Rule{}, fmt.Errorf("%q is not a CIDR range like 10.0.0.0/8", host)
		}
		if !pfx.Addr().Is4() {
			return Rule{}, errors.New("IPv6 is not supported: sandboxes have IPv4 only")
		}
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if !addr.Is4() {
			return Rule{}, errors.New("IPv6 is not supported: sandboxes have IPv4 only")
		}
		r.Prefix = netip.PrefixFrom(addr, 32)
		return r, nil
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		r.Wildcard, name = true, rest
	}
	if err := checkName(name); err != nil {
		return Rule{}, err
	}
	if !strings.Contains(name, ".") && r.Wildcard {
		return Rule{}, fmt.Errorf("wildcard %q covers a whole top-level domain; name one below it", s)
	}
	r.Name = name
	return r, nil
}

// checkName checks a DNS name's syntax (RFC 1123 host names, '_' allowed
// for service labels).
func checkName(name string) error {
	if len(name) == 0 || len(name) > maxNameBytes {
		return fmt.Errorf("name %q must be 1 to %d bytes", name, maxNameBytes)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Errorf("name %q has an empty label or one longer than 63 bytes", name)
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("name %q holds %q; names are letters, digits, '-' and '_' (and '*.' first for a wildcard)", name, c)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("name %q has a label that begins or ends with '-'", name)
		}
	}
	return nil
}

// Policy is what a sandbox's network allows.
type Policy struct {
	// Allow is the parsed allow-list, in canonical order (sorted, without
	// duplicates).
	Allow []Rule
	// MaxConnections caps the connections the sandbox has open through
	// the bridge at once (new ones beyond are refused); 0: no cap.
	MaxConnections uint32
	// EgressBytesPerSecond and IngressBytesPerSecond cap what the sandbox
	// sends and receives (CNI bandwidth plugin: token buckets on its host
	// interface and an ifb device); 0: no cap.
	EgressBytesPerSecond, IngressBytesPerSecond uint64
}

// MaxBytesPerSecond bounds a bandwidth cap.
const MaxBytesPerSecond = 1 << 40

// FieldError is an invalid allow-list entry: Field names it
// ("network.allow[3]").
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// ParsePolicy parses entries (the request's network.allow, named field) into
// a policy for a network of subnet: sorted, duplicates removed. An entry
// inside subnet is refused: sandboxes never reach each other.
func ParsePolicy(field string, entries []string, maxConns uint32, subnet netip.Prefix) (Policy, error) {
	if len(entries) > MaxAllowEntries {
		return Policy{}, &FieldError{field, fmt.Errorf("has %d entries; the limit is %d", len(entries), MaxAllowEntries)}
	}
	p := Policy{MaxConnections: maxConns}
	for i, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return Policy{}, &FieldError{fmt.Sprintf("%s[%d]", field, i), err}
		}
		if !r.IsName() && subnet.IsValid() && subnet.Contains(r.Prefix.Addr()) && r.Prefix.Bits() >= subnet.Bits() {
			return Policy{}, &FieldError{fmt.Sprintf("%s[%d]", field, i), fmt.Errorf("%s is inside the sandboxes' network %s: sandboxes never reach each other (use PortForward)", r, subnet)}
		}
		p.Allow = append(p.Allow, r)
	}
	slices.SortFunc(p.Allow, func(a, b Rule) int { return strings.Compare(a.String(), b.String()) })
	p.Allow = slices.CompactFunc(p.Allow, func(a, b Rule) bool { return a.String() == b.String() })
	return p, nil
}

// Entries returns p's allow-list in canonical text form.
func (p Policy) Entries() []string {
	out := make([]string, len(p.Allow))
	for i, r := range p.Allow {
		out[i] = r.String()
	}
	return out
}

// NameRules returns the rules of p that match name, and whether any does.
func (p Policy) NameRules(name string) []Rule {
	var out []Rule
	for _, r := range p.Allow {
		if r.Matches(name) {
			out = append(out, r)
		}
	}
	return out
}
