package auth

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// MinTokenBytes is the shortest bearer token accepted. Tokens are stored as
// unsalted SHA-256 hashes, which is safe only for tokens nobody can guess:
// generate them (32 random bytes, hex-encoded: 64 characters), never pick
// them. A shorter token is refused before it is looked up.
const MinTokenBytes = 32

// tokenHashPrefix starts every hash in a token file, naming the algorithm.
const tokenHashPrefix = "sha256:"

// maxTokenFileBytes bounds the token file read at each (re)load.
const maxTokenFileBytes = 16 << 20

// tokenEntry is one line of a token file.
type tokenEntry struct {
	sum       [sha256.Size]byte
	principal string
}

// tokenSet is a loaded token file.
type tokenSet []tokenEntry

// loadTokens reads the token file at path. Its lines are
//
//	sha256:<64 hex digits of SHA-256(token)> <principal name>
//
// with blank lines and lines starting with # ignored. A malformed line, an
// invalid principal name (see ValidName; "unix:" names are refused) or a
// hash listed twice fails the whole file, naming the line.
func loadTokens(path string) (tokenSet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	return parseTokens(io.LimitReader(f, maxTokenFileBytes), path)
}

func parseTokens(r io.Reader, name string) (tokenSet, error) {
	var set tokenSet
	seen := make(map[[sha256.Size]byte]int)
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fail := func(format string, args ...any) (tokenSet, error) {
			return nil, fmt.Errorf("token file %s line %d: %s", name, n, fmt.Sprintf(format, args...))
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return fail("want %q, got %d fields", tokenHashPrefix+"<hex> <principal>", len(fields))
		}
		hexSum, ok := strings.CutPrefix(fields[0], tokenHashPrefix)
		if !ok {
			return fail("the hash must start with %q", tokenHashPrefix)
		}
		raw, err := hex.DecodeString(hexSum)
		if err != nil || len(raw) != sha256.Size {
			return fail("the hash must be %d hex digits", 2*sha256.Size)
		}
		if err := ValidName(fields[1], false); err != nil {
			return fail("%v", err)
		}
		var e tokenEntry
		copy(e.sum[:], raw)
		e.principal = fields[1]
		if prev, dup := seen[e.sum]; dup {
			return fail("the same hash as line %d", prev)
		}
		seen[e.sum] = n
		set = append(set, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token file %s: %w", name, err)
	}
	return set, nil
}

// lookup returns the principal of token. It compares the token's hash with
// every entry in constant time and never stops early, so the time taken
// says nothing about which entry, if any, matched.
func (s tokenSet) lookup(token string) (string, bool) {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i := range s {
		if subtle.ConstantTimeCompare(sum[:], s[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return s[found].principal, true
}

// TokenHash returns the token file form of token's hash,
// "sha256:<64 hex digits>".
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return tokenHashPrefix + hex.EncodeToString(sum[:])
}
