package execsvc

import (
	"context"

	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// SignalExec has the agent signal an exec's process group.
func (s *Service) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	sandboxID := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": req.GetExecId()}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	if err := validate.ExecID("exec_id", req.GetExecId()); err != nil {
		return nil, err
	}
	// Like attach and signal on an Exec stream: an exec id of an earlier
	// runtime is STALE_HANDLE, not a signal to whatever has its number now.
	agent, current, err := s.reach.Reach(ctx, sandboxID, req.GetExecId())
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	if prev, known := s.ids.ExecRuntime(sandboxID, req.GetExecId()); known && prev.BootID != current.BootID {
		return nil, apierr.WithMeta(&apierr.StaleHandle{SandboxID: sandboxID, ExecID: req.GetExecId(), Handle: prev, Current: current}, meta)
	}
	resp, err := agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: req.GetExecId(), Signal: req.GetSignal()})
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
	}
	return &berthv1.SignalExecResponse{State: resp.GetState()}, nil
}
