package runtime

import (
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/agent"
)

func TestAgentEventOverhead(t *testing.T) {
	if AgentEventOverhead != agent.EventOverhead {
		t.Errorf("AgentEventOverhead = %d, want agent.EventOverhead %d", AgentEventOverhead, agent.EventOverhead)
	}
}

// TestCheckAgentFlags: a ring the agent would refuse (issue 21: berthd
// took --exec-ring-bytes 160 and no sandbox could start) is refused by
// berthd; zero keeps the agent's default.
func TestCheckAgentFlags(t *testing.T) {
	for _, tc := range []struct {
		ring    uint64
		wantErr bool
	}{{0, false}, {1, true}, {AgentEventOverhead, true}, {AgentEventOverhead + 1, false}, {8 << 20, false}} {
		err := (&Config{ExecRingBytes: tc.ring}).checkAgentFlags()
		if (err != nil) != tc.wantErr || err != nil && !strings.Contains(err.Error(), "--ring-bytes") {
			t.Errorf("checkAgentFlags(ExecRingBytes %d) = %v, want error %v naming --ring-bytes", tc.ring, err, tc.wantErr)
		}
	}
}
