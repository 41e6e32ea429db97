package auth_test

import (
	"fmt"

	"github.com/berth-sandbox/berth/server/auth"
)

// A token file line for principal alice. Real tokens are random: 32 bytes
// from /dev/urandom, hex-encoded.
func ExampleTokenHash() {
	token := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	fmt.Println(auth.TokenHash(token), "alice")
	// Output: sha256:a8ae6e6ee929abea3afcfc5258c8ccd6f85273e0d4626d26c7279f3250f77c8e alice
}
