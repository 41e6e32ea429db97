package execsvc

import (
	"context"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// SignalExec has the agent signal an exec's process group.
func (s *Service) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	var resp *agentv1.SignalExecResponse
	err := s.toExec(ctx, req.GetSandboxId(), req.GetExecId(), func(agent agentv1.AgentServiceClient) (err error) {
		resp, err = agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: req.GetExecId(), Signal: req.GetSignal()})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &berthv1.SignalExecResponse{State: resp.GetState()}, nil
}
