package agentproof

import "testing"

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
