// Package sandboxid holds what berthd's handlers and its fleet router
// (server/cluster) both need to know about sandbox ids: their pattern, the
// id an idempotent create derives from a request id, and where a request
// names its sandbox.
package sandboxid

import (
	"crypto/rand"
	"crypto/sha256"
	"regexp"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// pattern keeps ids usable as hostnames (RFC 1123 labels), container ids,
// short socket paths and cluster store keys.
var pattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Valid reports whether id is 1 to 63 characters from [a-z0-9-] starting
// with a letter or digit.
func Valid(id string) bool { return pattern.MatchString(id) }

// Alphabet is lowercase letters and digits without look-alikes (0/o, 1/l):
// the characters of minted and derived ids.
const Alphabet = "abcdefghijkmnpqrstuvwxyz23456789"

// execIDPattern is the pattern of exec ids (ExecStart.exec_id).
var execIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidExec reports whether id is a valid exec id: 1 to 128 characters
// from [A-Za-z0-9._-].
func ValidExec(id string) bool { return execIDPattern.MatchString(id) }

// New returns prefix followed by n random characters of Alphabet: a
// minted sandbox id ("sb-"), exec id ("ex-") or incident id ("").
func New(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = Alphabet[int(b[i])%len(Alphabet)]
	}
	return prefix + string(b)
}

// FromRequest derives the sandbox id of owner's request id: "rq-" and 12
// characters of the SHA-256 of both (60 bits), so a retried request names
// the same sandbox on any berthd of a fleet, and the same request id of
// another principal another one.
func FromRequest(owner, requestID string) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + requestID))
	b := make([]byte, 12)
	for i := range b {
		b[i] = Alphabet[int(sum[i])%len(Alphabet)]
	}
	return "rq-" + string(b)
}

// Of returns the first non-empty string field named sandbox_id in m, or in
// its set message fields down to depth levels: every berth.v1 request that
// names a sandbox has one at the top (GetSandboxRequest) or one level down
// (ExecRequest.start, WriteFileRequest.header).
func Of(m protoreflect.Message, depth int) string {
	if fd := m.Descriptor().Fields().ByName("sandbox_id"); fd != nil && fd.Kind() == protoreflect.StringKind && fd.Cardinality() != protoreflect.Repeated {
		if id := m.Get(fd).String(); id != "" {
			return id
		}
	}
	if depth == 0 {
		return ""
	}
	var id string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.MessageKind && fd.Cardinality() != protoreflect.Repeated && !fd.IsMap() {
			id = Of(v.Message(), depth-1)
		}
		return id == ""
	})
	return id
}
