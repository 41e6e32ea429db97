package execsvc

import (
	"context"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// ListExecs returns the agent's list of the sandbox's running and retained
// execs; the entries pass through without copying.
func (s *Service) ListExecs(ctx context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	sandboxID := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": sandboxID}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	agent, err := s.reach.Agent(ctx, sandboxID)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	resp, err := agent.ListExecs(ctx, &agentv1.ListExecsRequest{})
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
	}
	return &berthv1.ListExecsResponse{Execs: resp.GetExecs(), Omitted: resp.GetOmitted()}, nil
}
