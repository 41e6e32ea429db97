// Package agentproof lets berthd tell a sandbox's real agent from a
// workload that put its own listener where the agent's socket was. berthd
// gives every sandbox's agent a random secret at create, in a file of the
// sandbox's run directory that the agent reads and removes before any
// process of the workload runs (not in its environment: gVisor lets a
// process of the same uid read /proc/1/environ, and its 2022 release can
// write neither /proc/self/mem nor process_vm_writev to scrub it); berthd
// then sends a fresh random challenge with every Info call and
// accepts only an answer that is HMAC-SHA256 (crypto/hmac) of the challenge
// under that secret.
package agentproof

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// SecretFile is the name of the secret's file in the sandbox's run
// directory: hex, written by berthd before each task start, removed by the
// agent once read.
const SecretFile = "agent.secret"

// SecretBytes and ChallengeBytes are the sizes of a secret and of a
// challenge.
const (
	SecretBytes    = 32
	ChallengeBytes = 16
	// MaxChallengeBytes bounds the challenge an agent answers.
	MaxChallengeBytes = 64
)

// ErrMismatch is returned by Verify for a proof that does not match.
var ErrMismatch = errors.New("the answer does not prove the sandbox's agent secret")

// NewSecret returns a new secret, hex-encoded for EnvSecret.
func NewSecret() string {
	return hex.EncodeToString(random(SecretBytes))
}

// NewChallenge returns a new random challenge.
func NewChallenge() []byte { return random(ChallengeBytes) }

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand)
	return b
}

// ReadSecretFile reads the secret at path and removes the file.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if rerr := os.Remove(path); err == nil && rerr != nil {
		return nil, fmt.Errorf("remove the secret file: %w", rerr)
	}
	if err != nil {
		return nil, err
	}
	return ParseSecret(strings.TrimSpace(string(b)))
}

// ParseSecret decodes a hex secret as NewSecret makes it.
func ParseSecret(hexSecret string) ([]byte, error) {
	b, err := hex.DecodeString(hexSecret)
	if err != nil || len(b) != SecretBytes {
		return nil, fmt.Errorf("agent secret: want %d hex-encoded bytes", SecretBytes)
	}
	return b, nil
}

// Prove returns the agent's answer to challenge: HMAC-SHA256(secret,
// challenge). It returns nil without a secret or a challenge, or for a
// challenge longer than MaxChallengeBytes.
func Prove(secret, challenge []byte) []byte {
	if len(secret) == 0 || len(challenge) == 0 || len(challenge) > MaxChallengeBytes {
		return nil
	}
	m := hmac.New(sha256.New, secret)
	m.Write(challenge)
	return m.Sum(nil)
}

// Verify checks that proof answers challenge under secret, in constant
// time; ErrMismatch otherwise.
func Verify(secret, challenge, proof []byte) error {
	want := Prove(secret, challenge)
	if want == nil || !hmac.Equal(want, proof) {
		return ErrMismatch
	}
	return nil
}

// Proofs of berthd's own asks (memory hibernation, package
// internal/quiesce). A workload that reaches the agent's socket may have
// Info prove any challenge of at most MaxChallengeBytes, so these prove
// messages longer than that: no Info answer is ever one of them.
const (
	// TokenBytes is the size of a quiesce's wake token.
	TokenBytes = 48
	// quiesceDomain and wakeDomain prefix the token in the message each
	// proof is of.
	quiesceDomain = "berth-agent quiesce v1\x00"
	wakeDomain    = "berth-agent wake v1\x00"
	quietDomain   = "berth-agent quiet v1\x00"
	// forkWakeDomain and forkSecretDomain prefix the token and a fork
	// child's nonce in the messages of ProveForkWake and ForkSecret.
	forkWakeDomain   = "berth-agent fork wake v1\x00"
	forkSecretDomain = "berth-agent fork secret v1\x00"
	// ForkNonceBytes is the size of a fork child's nonce: a fork wake
	// file holds the nonce, then ProveForkWake (ForkWakeBytes in all).
	ForkNonceBytes = 32
	// ForkWakeBytes is the size of a fork wake file's content.
	ForkWakeBytes = ForkNonceBytes + sha256.Size
)

// NewWakeToken returns a new random wake token of TokenBytes.
func NewWakeToken() []byte { return random(TokenBytes) }

// ProveQuiesce returns berthd's proof that it asks the agent with secret
// to quiesce, the wake token being token; nil when secret is empty or the
// token is not TokenBytes long.
func ProveQuiesce(secret, token []byte) []byte { return proveAsk(secret, quiesceDomain, token) }

// ProveWake returns berthd's proof that the agent with secret, quiesced
// with token, was restored and may listen again; nil as for ProveQuiesce.
func ProveWake(secret, token []byte) []byte { return proveAsk(secret, wakeDomain, token) }

// ProveQuiet returns the agent's proof, written into its quiesce mark,
// that it quiesced for berthd's ask with wake token token: a mark without
// it (made by the workload, which can write the run directory) is not
// the agent's word; nil as for ProveQuiesce.
func ProveQuiet(secret, token []byte) []byte { return proveAsk(secret, quietDomain, token) }

// VerifyAsk checks proof against want (ProveQuiesce or ProveWake of the
// agent's own secret and token; ProveQuiet of the sandbox's, in berthd)
// in constant time: ErrMismatch when they differ or want is nil.
func VerifyAsk(want, proof []byte) error {
	if want == nil || !hmac.Equal(want, proof) {
		return ErrMismatch
	}
	return nil
}

// ProveForkWake returns berthd's proof that it restored the memory of the
// agent with secret, quiesced with token, into a new sandbox (a fork's
// child, ForkSandbox with memory) whose nonce is nonce: the agent then
// serves under ForkSecret(secret, token, nonce) and a new boot id. nil
// as for ProveQuiesce, or when nonce is not ForkNonceBytes long.
func ProveForkWake(secret, token, nonce []byte) []byte {
	if len(nonce) != ForkNonceBytes {
		return nil
	}
	return proveAsk(secret, forkWakeDomain, token, nonce)
}

// ForkSecret returns the secret of a fork's child whose agent was
// restored from the memory of the agent with secret, quiesced with token,
// and woken with nonce (ProveForkWake): each child its own, which neither
// the parent nor a sibling proves. Its message is longer than
// MaxChallengeBytes, so no Info answer of the parent's agent is a child's
// secret. nil as for ProveForkWake.
func ForkSecret(secret, token, nonce []byte) []byte {
	if len(nonce) != ForkNonceBytes {
		return nil
	}
	return proveAsk(secret, forkSecretDomain, token, nonce)
}

// NewForkNonce returns a new random nonce of ForkNonceBytes.
func NewForkNonce() []byte { return random(ForkNonceBytes) }

func proveAsk(secret []byte, domain string, token []byte, more ...[]byte) []byte {
	if len(secret) == 0 || len(token) != TokenBytes {
		return nil
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(domain))
	m.Write(token)
	for _, b := range more {
		m.Write(b)
	}
	return m.Sum(nil)
}
