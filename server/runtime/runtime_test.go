package runtime

import (
	"slices"
	"testing"
	"time"
)

func TestAgentArgs(t *testing.T) {
	base := []string{AgentPath, "--socket", RunDir + "/agent.sock", "--user", "1000:1001", "--workdir", "/home/dev"}
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
