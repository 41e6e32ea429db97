package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/quiesce"
)

// TestCheckpointError: runsc's refusal of a host socket names the socket
// in a line; any other failure is cut to maxCheckpointError bytes.
func TestCheckpointError(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"host socket", `runsc-berth did not terminate successfully: exit status 128: checkpoint failed: encoding error at object transport.connectionedEndpoint{baseEndpoint:transport.baseEndpoint{path:"/workspace/held.sock", ops:{}}}: Cannot save endpoint with bound host socket: path= /x/criu-dump.log: unknown`,
			`runsc checkpoint: a process (its socket /workspace/held.sock) holds a unix socket bound on the host, which gVisor cannot save ("Cannot save endpoint with bound host socket")`},
		{"short", "exit status 1: no such container", "runsc checkpoint: exit status 1: no such container"},
		{"long", strings.Repeat("x", 2000), "runsc checkpoint: " + strings.Repeat("x", maxCheckpointError) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkpointError(errors.New(tt.in)).Error(); got != tt.want {
				t.Errorf("checkpointError(%.40q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestWaitQuiet: a quiesce mark the workload could make — empty, another
// token's proof, a symlink to the real proof, a FIFO — is not the
// agent's word: the wait fails at its timeout saying so; the agent's
// proof (agentproof.ProveQuiet of the sandbox's secret and the token)
// ends it.
func TestWaitQuiet(t *testing.T) {
	secret, _ := agentproof.ParseSecret(agentproof.NewSecret())
	token := agentproof.NewWakeToken()
	want := agentproof.ProveQuiet(secret, token)
	dir := t.TempDir()
	real := filepath.Join(dir, "proof")
	if err := os.WriteFile(real, want, 0o600); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(dir, quiesce.Mark)
	forged := map[string]func() error{
		"empty": func() error { return os.WriteFile(mark, nil, 0o600) },
		"another token's": func() error {
			return os.WriteFile(mark, agentproof.ProveQuiet(secret, agentproof.NewWakeToken()), 0o600)
		},
		"the wake proof":      func() error { return os.WriteFile(mark, agentproof.ProveWake(secret, token), 0o600) },
		"a symlink to it":     func() error { return os.Symlink(real, mark) },
		"a FIFO":              func() error { return unix.Mkfifo(mark, 0o600) },
		"the proof, too long": func() error { return os.WriteFile(mark, append(append([]byte{}, want...), 'x'), 0o600) },
	}
	for name, forge := range forged {
		os.Remove(mark)
		if err := forge(); err != nil {
			t.Fatal(err)
		}
		err := waitQuiet(context.Background(), mark, want, 100*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "held no proof of the sandbox's secret") {
			t.Errorf("waitQuiet with a mark of %s = %v, want it not believed", name, err)
		}
	}
	os.Remove(mark)
	if err := waitQuiet(context.Background(), mark, want, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "did not close its sockets") {
		t.Errorf("waitQuiet without a mark = %v, want a timeout", err)
	}
	if err := os.WriteFile(mark, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := waitQuiet(context.Background(), mark, want, 100*time.Millisecond); err != nil {
		t.Errorf("waitQuiet with the agent's proof = %v, want nil", err)
	}
}
