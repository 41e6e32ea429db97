package agentproof

import (
	"bytes"
	"testing"
)

func TestVerify(t *testing.T) {
	secret, err := ParseSecret(NewSecret())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ParseSecret(NewSecret())
	challenge := NewChallenge()
	proof := Prove(secret, challenge)
	if err := Verify(secret, challenge, proof); err != nil {
		t.Errorf("Verify(the agent's own proof) = %v, want nil", err)
	}
	for name, tt := range map[string]struct{ challenge, proof []byte }{
		"another secret":    {challenge, Prove(other, challenge)},
		"another challenge": {challenge, Prove(secret, NewChallenge())},
		"no proof":          {challenge, nil},
		"a replayed proof":  {NewChallenge(), proof},
	} {
		if err := Verify(secret, tt.challenge, tt.proof); err != ErrMismatch {
			t.Errorf("%s: Verify = %v, want ErrMismatch", name, err)
		}
	}
	if err := Verify(nil, challenge, Prove(nil, challenge)); err != ErrMismatch {
		t.Errorf("Verify without a secret = %v, want ErrMismatch", err)
	}
	if _, err := ParseSecret("abc"); err == nil {
		t.Error(`ParseSecret("abc") = nil error, want one`)
	}
}

// TestAskProofs: berthd's quiesce and wake proofs differ from each other
// and from every answer Info gives (a workload can have Info prove any
// challenge of at most MaxChallengeBytes, the domain and token included).
func TestAskProofs(t *testing.T) {
	secret, _ := ParseSecret(NewSecret())
	other, _ := ParseSecret(NewSecret())
	token := NewWakeToken()
	quiesce, wake := ProveQuiesce(secret, token), ProveWake(secret, token)
	if err := VerifyAsk(quiesce, ProveQuiesce(secret, token)); err != nil {
		t.Errorf("VerifyAsk(the quiesce proof) = %v, want nil", err)
	}
	forged := map[string][]byte{
		"the wake proof for a quiesce":   wake,
		"the quiet proof for a quiesce":  ProveQuiet(secret, token),
		"another secret's":               ProveQuiesce(other, token),
		"another token's":                ProveQuiesce(secret, NewWakeToken()),
		"Info of the token":              Prove(secret, token),
		"Info of the domain and a token": Prove(secret, append([]byte(quiesceDomain), token[:MaxChallengeBytes-len(quiesceDomain)]...)),
		"none":                           nil,
	}
	for name, proof := range forged {
		if err := VerifyAsk(quiesce, proof); err != ErrMismatch {
			t.Errorf("%s: VerifyAsk = %v, want ErrMismatch", name, err)
		}
	}
	if q := ProveQuiet(secret, token); q == nil || VerifyAsk(q, wake) != ErrMismatch || VerifyAsk(q, ProveQuiet(secret, token)) != nil {
		t.Errorf("ProveQuiet = %x: want a proof of its own, not the wake proof's", q)
	}
	if p := ProveQuiesce(nil, token); p != nil {
		t.Errorf("ProveQuiesce without a secret = %x, want nil", p)
	}
	if p := ProveWake(secret, token[:8]); p != nil {
		t.Errorf("ProveWake of a short token = %x, want nil", p)
	}
	if err := VerifyAsk(nil, nil); err != ErrMismatch {
		t.Errorf("VerifyAsk(nil, nil) = %v, want ErrMismatch", err)
	}
}

func TestForkProofs(t *testing.T) {
	secret, _ := ParseSecret(NewSecret())
	token, nonce, other := NewWakeToken(), NewForkNonce(), NewForkNonce()
	wake := ProveForkWake(secret, token, nonce)
	if len(wake) != ForkWakeBytes-ForkNonceBytes {
		t.Fatalf("ProveForkWake = %d bytes, want %d", len(wake), ForkWakeBytes-ForkNonceBytes)
	}
	for name, proof := range map[string][]byte{
		"the plain wake proof":    ProveWake(secret, token),
		"another child's":         ProveForkWake(secret, token, other),
		"another token's":         ProveForkWake(secret, NewWakeToken(), nonce),
		"the child's secret":      ForkSecret(secret, token, nonce),
		"Info of token and nonce": Prove(secret, append(append([]byte{}, token...), nonce[:MaxChallengeBytes-TokenBytes]...)),
	} {
		if err := VerifyAsk(wake, proof); err != ErrMismatch {
			t.Errorf("%s: VerifyAsk(fork wake) = %v, want ErrMismatch", name, err)
		}
	}
	child := ForkSecret(secret, token, nonce)
	if len(child) != SecretBytes {
		t.Fatalf("ForkSecret = %d bytes, want %d (a secret's size)", len(child), SecretBytes)
	}
	if bytes.Equal(child, secret) || bytes.Equal(child, ForkSecret(secret, token, other)) {
		t.Error("ForkSecret gave a child the parent's or a sibling's secret")
	}
	if !bytes.Equal(child, ForkSecret(secret, token, nonce)) {
		t.Error("ForkSecret is not a function of secret, token and nonce: berthd and the agent would disagree")
	}
	if p := ProveForkWake(secret, token, nonce[:8]); p != nil {
		t.Errorf("ProveForkWake of a short nonce = %x, want nil", p)
	}
	if s := ForkSecret(nil, token, nonce); s != nil {
		t.Errorf("ForkSecret without a secret = %x, want nil", s)
	}
}
