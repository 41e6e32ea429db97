package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/quiesce"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// quiesceAgent starts an agent given a secret (--secret-file) and
// returns it with the secret.
func quiesceAgent(t *testing.T) (*testAgent, []byte) {
	t.Helper()
	hexSecret := agentproof.NewSecret()
	secret, err := agentproof.ParseSecret(hexSecret)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), agentproof.SecretFile)
	if err := os.WriteFile(file, []byte(hexSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	return startAgent(t, "--secret-file", file), secret
}

// writeWake puts proof in the agent's quiesce.Wake as berthd does: written
// aside, then renamed into place.
func writeWake(t *testing.T, dir string, proof []byte) {
	t.Helper()
	tmp := filepath.Join(dir, quiesce.Wake+".tmp")
	if err := os.WriteFile(tmp, proof, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, quiesce.Wake)); err != nil {
		t.Fatal(err)
	}
}

// quiesceAsBerthd calls the agent's Quiesce as berthd does (token, and
// the proof of secret) and waits for its quiesce mark; what names the
// call in failures.
func quiesceAsBerthd(t *testing.T, ctx context.Context, a *testAgent, secret, token []byte, what string) {
	t.Helper()
	if _, err := a.client.Quiesce(ctx, &agentv1.QuiesceRequest{WakeToken: token, Proof: agentproof.ProveQuiesce(secret, token)}); err != nil && status.Code(err) != codes.Unavailable {
		t.Fatalf("%s: %v", what, err)
	}
	mark := filepath.Join(a.dir, quiesce.Mark)
	if !pollFor(10*time.Second, func() bool { _, err := os.Lstat(mark); return err == nil }) {
		t.Fatalf("%s: quiesce mark %s never appeared\nagent log:\n%s", what, mark, a.stderr)
	}
}

// TestQuiesce: SIGUSR1 and SIGUSR2, which quiesced and woke the agent
// before and which any process of a sandbox can send its PID 1, change
// nothing; a Quiesce without the proof of the secret is PERMISSION_DENIED
// (one with a token of another size INVALID_ARGUMENT) and changes nothing;
// berthd's Quiesce makes the agent close its listener (the socket file
// goes) and its connections (a call fails), then write quiesce.Mark
// holding its proof of being quiet (agentproof.ProveQuiet); a
// quiesce.Wake that proves nothing is removed and the agent stays quiet;
// berthd's wake proof makes it remove the mark and serve again on the
// same path, with the same boot id and the exec that ran on meanwhile.
func TestQuiesce(t *testing.T) {
	a, secret := quiesceAgent(t)
	sock := filepath.Join(a.dir, "a.sock")
	mark := filepath.Join(a.dir, quiesce.Mark)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.startBackground(t, "loop", &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}})

	// What a workload can do: signal the agent, call Quiesce unproven.
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGUSR1} {
		if err := syscall.Kill(a.pid, sig); err != nil {
			t.Fatal(err)
		}
		if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}); err != nil {
			t.Fatalf("Info after %v: %v, want an answer (the signal changes nothing)", sig, err)
		}
	}
	token := agentproof.NewWakeToken()
	other, _ := agentproof.ParseSecret(agentproof.NewSecret())
	for name, tt := range map[string]struct {
		req  *agentv1.QuiesceRequest
		want codes.Code
	}{
		"no proof":           {&agentv1.QuiesceRequest{WakeToken: token}, codes.PermissionDenied},
		"another secret's":   {&agentv1.QuiesceRequest{WakeToken: token, Proof: agentproof.ProveQuiesce(other, token)}, codes.PermissionDenied},
		"Info's proof":       {&agentv1.QuiesceRequest{WakeToken: token, Proof: agentproof.Prove(secret, token)}, codes.PermissionDenied},
		"a token of 8 bytes": {&agentv1.QuiesceRequest{WakeToken: token[:8], Proof: agentproof.ProveQuiesce(secret, token)}, codes.InvalidArgument},
	} {
		if _, err := a.client.Quiesce(ctx, tt.req); status.Code(err) != tt.want {
			t.Errorf("Quiesce with %s: %v, want %v", name, err, tt.want)
		}
	}
	if _, err := os.Lstat(mark); !os.IsNotExist(err) {
		t.Fatalf("the quiesce mark after the workload's attempts: %v, want none", err)
	}
	if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Fatalf("Info after the workload's attempts: %v", err)
	}

	quiesceAsBerthd(t, ctx, a, secret, token, "berthd's Quiesce")
	// The mark is the agent's word, proved: berthd believes no other.
	if got, err := quiesce.ReadProof(mark); err != nil || agentproof.VerifyAsk(agentproof.ProveQuiet(secret, token), got) != nil {
		t.Errorf("quiesce mark holds %x (%v), want ProveQuiet of the secret and token", got, err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket while quiet: %v, want it removed", err)
	}
	quietNow := func(what string) {
		t.Helper()
		short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancelShort()
		if _, err := a.client.Info(short, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err == nil {
			t.Errorf("Info while quiet (%s) answered, want no connection", what)
		}
	}
	quietNow("quiesced")

	// A wake the workload could write: Info's proof of the token, and
	// the wake proof of another token. Each is removed, unheeded.
	for name, proof := range map[string][]byte{"Info's proof": agentproof.Prove(secret, token), "another token's": agentproof.ProveWake(secret, agentproof.NewWakeToken())} {
		writeWake(t, a.dir, proof)
		if !pollFor(10*time.Second, func() bool { _, err := os.Lstat(filepath.Join(a.dir, quiesce.Wake)); return os.IsNotExist(err) }) {
			t.Fatalf("a wake file of %s was never removed", name)
		}
		quietNow("after a wake of " + name)
		if _, err := os.Lstat(mark); err != nil {
			t.Errorf("the quiesce mark after a wake of %s: %v, want it kept", name, err)
		}
	}

	writeWake(t, a.dir, agentproof.ProveWake(secret, token))
	after, err := a.client.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Info after berthd's wake: %v\nagent log:\n%s", err, a.stderr)
	}
	if after.GetBootId() != before.GetBootId() || after.GetRunningExecs() != 1 {
		t.Errorf("after listening again: boot id %s, %d running execs; want %s, 1", after.GetBootId(), after.GetRunningExecs(), before.GetBootId())
	}
	if _, err := os.Lstat(mark); !os.IsNotExist(err) {
		t.Errorf("the quiesce mark after listening again: %v, want it removed", err)
	}
	// The token was for one quiesce: its proof does not quiesce again
	// unnoticed, and a second quiesce works as the first.
	token2 := agentproof.NewWakeToken()
	quiesceAsBerthd(t, ctx, a, secret, token2, "the second Quiesce")
	writeWake(t, a.dir, agentproof.ProveWake(secret, token))
	if !pollFor(10*time.Second, func() bool { _, err := os.Lstat(filepath.Join(a.dir, quiesce.Wake)); return os.IsNotExist(err) }) {
		t.Fatal("the first quiesce's wake was never removed")
	}
	quietNow("after the first quiesce's wake")
	writeWake(t, a.dir, agentproof.ProveWake(secret, token2))
	if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Info after the second wake: %v", err)
	}
}

// TestQuiesceWithoutSecret: an agent given no secret refuses Quiesce
// (FAILED_PRECONDITION: nothing could prove berthd's ask) and serves on.
func TestQuiesceWithoutSecret(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token := agentproof.NewWakeToken()
	if _, err := a.client.Quiesce(ctx, &agentv1.QuiesceRequest{WakeToken: token, Proof: agentproof.ProveQuiesce(make([]byte, 32), token)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Quiesce of an agent without a secret: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Errorf("Info after the refused Quiesce: %v", err)
	}
}

// pollFor reports whether cond became true within d.
func pollFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestQuiesceForkWake: a fork wake (berthd restored the quiet agent's
// memory into a fork's child) that another token, another nonce's proof
// or a forged nonce makes is removed and leaves the agent quiet; berthd's
// makes the agent serve again as the child: a new boot id, Info proving
// agentproof.ForkSecret of the parent's secret, the token and the nonce
// (and no longer the parent's secret), the exec that ran on still
// running; a later quiesce and wake work under the child's secret.
func TestQuiesceForkWake(t *testing.T) {
	a, secret := quiesceAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.startBackground(t, "loop", &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}})
	token := agentproof.NewWakeToken()
	quiesceAsBerthd(t, ctx, a, secret, token, "berthd's Quiesce")
	nonce := agentproof.NewForkNonce()
	forkWake := func(secret, token, nonce, proofNonce []byte) []byte {
		return append(append([]byte{}, nonce...), agentproof.ProveForkWake(secret, token, proofNonce)...)
	}
	for name, content := range map[string][]byte{
		"another token's":        forkWake(secret, agentproof.NewWakeToken(), nonce, nonce),
		"another nonce's proof":  forkWake(secret, token, nonce, agentproof.NewForkNonce()),
		"the plain wake, padded": append(agentproof.ProveWake(secret, token), make([]byte, agentproof.ForkNonceBytes)...),
	} {
		writeWake(t, a.dir, content)
		if !pollFor(10*time.Second, func() bool { _, err := os.Lstat(filepath.Join(a.dir, quiesce.Wake)); return os.IsNotExist(err) }) {
			t.Fatalf("a fork wake of %s was never removed", name)
		}
		short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
		if _, err := a.client.Info(short, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err == nil {
			t.Errorf("Info after a fork wake of %s answered, want the agent quiet", name)
		}
		cancelShort()
	}
	writeWake(t, a.dir, forkWake(secret, token, nonce, nonce))
	challenge := agentproof.NewChallenge()
	after, err := a.client.Info(ctx, &agentv1.InfoRequest{Challenge: challenge}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Info after berthd's fork wake: %v\nagent log:\n%s", err, a.stderr)
	}
	child := agentproof.ForkSecret(secret, token, nonce)
	if err := agentproof.Verify(child, challenge, after.GetProof()); err != nil {
		t.Errorf("the child's Info proof: %v, want it to prove ForkSecret(parent's secret, token, nonce)", err)
	}
	if agentproof.Verify(secret, challenge, after.GetProof()) == nil {
		t.Error("the child's Info proves the parent's secret")
	}
	if after.GetBootId() == before.GetBootId() || after.GetBootId() == "" || after.GetRunningExecs() != 1 {
		t.Errorf("the child: boot id %q (parent's %q), %d running execs; want a new boot id and the parent's 1 exec", after.GetBootId(), before.GetBootId(), after.GetRunningExecs())
	}
	// The child's secret is the one berthd proves from now on.
	token2 := agentproof.NewWakeToken()
	if _, err := a.client.Quiesce(ctx, &agentv1.QuiesceRequest{WakeToken: token2, Proof: agentproof.ProveQuiesce(secret, token2)}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Quiesce proving the parent's secret in the child: %v, want PermissionDenied", err)
	}
	quiesceAsBerthd(t, ctx, a, child, token2, "Quiesce proving the child's secret")
	writeWake(t, a.dir, agentproof.ProveWake(child, token2))
	if again, err := a.client.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil || again.GetBootId() != after.GetBootId() {
		t.Fatalf("Info after the child's wake: %v, boot id %q, want %q", err, again.GetBootId(), after.GetBootId())
	}
}
