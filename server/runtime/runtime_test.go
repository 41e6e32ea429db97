package runtime

import (
	"slices"
	"testing"
	"time"
)

func TestAgentArgs(t *testing.T) {
	base := []string{AgentPath, "--socket", RunDir + "/agent.sock", "--user", "1000:1001", "--workdir", "/home/dev", "--login-env", "--name-host"}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"agent defaults", Config{}, base},
		{"exec settings", Config{ExecHeartbeat: 500 * time.Millisecond, ExecRetention: 90 * time.Second, ExecRingBytes: 1 << 20},
			append(slices.Clone(base), "--heartbeat-interval", "500ms", "--retention", "1m30s", "--ring-bytes", "1048576")},
	}
	for _, tt := range tests {
		r := &Runtime{cfg: tt.cfg}
		if got := r.agentArgs(SandboxSpec{UID: 1000, GID: 1001, WorkDir: "/home/dev"}); !slices.Equal(got, tt.want) {
			t.Errorf("%s: agentArgs() = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestDigestShm keeps the digest of a spec with the default /dev/shm size
// what it was before shm_bytes existed, so that a repeated create of a
// sandbox recorded by an older berthd still matches.
func TestDigestShm(t *testing.T) {
	old := SandboxSpec{Image: "i", PidsLimit: 10}
	def := old
	def.ShmBytes = DefaultShmBytes
	big := old
	big.ShmBytes = 256 << 20
	if old.Digest() != def.Digest() {
		t.Errorf("the default shm size changes the digest")
	}
	if big.Digest() == def.Digest() {
		t.Errorf("shm_bytes 256 MiB does not change the digest")
	}
}
