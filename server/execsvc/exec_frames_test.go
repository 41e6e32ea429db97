package execsvc

import (
	"testing"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestExecEventFields keeps the agent's exec events wire-compatible with the
// public ones: berthd relays output events as they are on the wire.
func TestExecEventFields(t *testing.T) {
	public := (&berthv1.ExecResponse{}).ProtoReflect().Descriptor().Fields()
	agent := (&agentv1.ExecResponse{}).ProtoReflect().Descriptor().Fields()
	for i := range public.Len() {
		p := public.Get(i)
		a := agent.ByName(p.Name())
		if a == nil || a.Number() != p.Number() || a.Message().FullName() != p.Message().FullName() {
			t.Errorf("ExecResponse.%s: public field %d of %s, agent's %v", p.Name(), p.Number(), p.Message().FullName(), a)
		}
	}
}
