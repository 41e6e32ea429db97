// Package auth says who is calling berthd and what they may see.
//
// Every connection and request names a principal:
//
//   - on berthd's unix socket, the connecting process's uid, taken from the
//     kernel (SO_PEERCRED, unix(7)): "unix:uid:1000";
//   - on TCP, which needs TLS, the common name of a client certificate that
//     a configured CA signed (mTLS): "alice";
//   - on either, a bearer token in the "authorization" metadata
//     ("Bearer <token>"), looked up by its SHA-256 in a token file that maps
//     hashes to principal names and is re-read on Reload (berthd: SIGHUP).
//     A token, when given, decides: a wrong one is refused, never ignored.
//
// Admins (Config.Admins, and unix uid 0, see RootPrincipal) see and act on
// every sandbox. Any other principal sees only the sandboxes it created
// (Sees); the handlers answer NOT_FOUND for the rest. Image writes (import,
// pull, delete) are for admins only (AdminOnly). Node principals
// (Config.Nodes) may act on behalf of another principal by naming it in
// ForwardedHeader, for berthd nodes routing a caller's request to the node
// that holds its sandbox — and nothing else: only the services of
// ForwardedServices, never as themselves, and the principal they name is
// an admin only when they also pass on its own bearer token
// (ForwardedTokenHeader), so that the node credential that every node
// holds cannot act as an admin.
//
// The interceptors (Authenticator.UnaryInterceptors, StreamInterceptors)
// authenticate every request but the health service, then hand the
// handler a context that holds the Principal and no incoming metadata at
// all: nothing a caller sends as metadata reaches containerd (whose client
// reads a "containerd-namespace" header from incoming metadata) or an agent.
package auth

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Principal is who makes a request.
type Principal struct {
	// Name identifies the principal and is recorded as the owner of the
	// sandboxes it creates: "unix:uid:N" for a unix socket peer, the
	// principal name of a token file entry, or a client certificate's
	// common name.
	Name string
	// Admin principals see and act on every sandbox and may change the
	// image store.
	Admin bool
	// Via names the node principal that forwarded the request on Name's
	// behalf; empty for a direct caller.
	Via string
	// Method says how the principal was authenticated: "unix", "token" or
	// "tls".
	Method string
	// token is the bearer token the principal authenticated with, if
	// any: passed on when a node forwards an admin's call (ForwardingMD).
	token string
}

// ForwardingMD returns the metadata with which a node forwards a call made
// by p to another node: ForwardedHeader naming p and, when p is an admin
// who authenticated with a bearer token, that token in
// ForwardedTokenHeader, by which the receiving node checks that an admin
// made the call. Without it the receiver treats p as a non-admin.
func (p Principal) ForwardingMD() metadata.MD {
	md := metadata.Pairs(ForwardedHeader, p.Name)
	if p.Admin && p.token != "" {
		md.Set(ForwardedTokenHeader, p.token)
	}
	return md
}

// RootPrincipal is the principal of uid 0 on berthd's unix socket. It is an
// admin: whoever is root on berthd's host reaches containerd's socket, the
// sandboxes' files and berthd's memory anyway, so refusing root anything
// through berthd would protect nothing; and the scripts, the demo and the
// tests that call berthd as root keep seeing everything they did.
const RootPrincipal = "unix:uid:0"

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal ctx carries; false when there is none
// (a context the interceptors did not make).
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Sees reports whether the caller of ctx may see and act on something that
// owner owns: admins see everything, others what they own. Something
// without an owner ("", such as a sandbox created before berthd recorded
// owners) is for admins only, and a context without a principal sees
// nothing.
func Sees(ctx context.Context, owner string) bool {
	p, ok := FromContext(ctx)
	return ok && p.Sees(owner)
}

// Sees reports whether p may see and act on something owner owns.
func (p Principal) Sees(owner string) bool {
	return p.Admin || (p.Name != "" && p.Name == owner)
}

// String names p for logs: "alice", or "alice via node-2".
func (p Principal) String() string {
	if p.Via != "" {
		return p.Name + " via " + p.Via
	}
	return p.Name
}

// UnixPrincipal returns the principal name of a unix socket peer with uid.
func UnixPrincipal(uid uint32) string {
	return "unix:uid:" + strconv.FormatUint(uint64(uid), 10)
}

// unixPrefix starts the names of unix socket peers only: a token file or a
// certificate cannot name one.
const unixPrefix = "unix:"

// namePattern is what a token file or a certificate may name: a letter or
// digit, then up to 127 letters, digits and ._@:+- (enough for e-mail
// addresses, DNS names and SPIFFE-like paths without slashes).
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$`)

// ValidName checks a principal name given by a token file, a certificate,
// a flag or a forwarding node: the pattern above, and not in the unix
// socket peers' "unix:" space unless allowUnix.
func ValidName(name string, allowUnix bool) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("principal name %q must be 1 to 128 characters from [A-Za-z0-9._@:+-] starting with a letter or digit", name)
	}
	if !allowUnix && strings.HasPrefix(name, unixPrefix) {
		return fmt.Errorf("principal name %q: names starting with %q belong to unix socket peers", name, unixPrefix)
	}
	return nil
}
