package server

import (
	"context"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ListExecs returns the agent's list of the sandbox's running and retained
// execs; the entries pass through without copying.
func (s *Service) ListExecs(ctx context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	sandboxID := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": sandboxID}
	if err := validateSandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	agent, err := s.agentFor(ctx, sandboxID)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	resp, err := agent.ListExecs(ctx, &agentv1.ListExecsRequest{})
	if err != nil {
		return nil, s.toStatus(ctx, agentError(sandboxID, err), meta)
	}
	return &berthv1.ListExecsResponse{Execs: resp.GetExecs(), Omitted: resp.GetOmitted()}, nil
}

// SignalExec has the agent signal an exec's process group.
func (s *Service) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	sandboxID := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": req.GetExecId()}
	if err := validateSandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	if err := validateExecID("exec_id", req.GetExecId()); err != nil {
		return nil, err
	}
	// Like attach and signal on an Exec stream: an exec id of an earlier
	// runtime is STALE_HANDLE, not a signal to whatever has its number now.
	agent, current, err := s.reach(ctx, sandboxID, req.GetExecId())
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	if prev, known := s.ids.execRuntime(sandboxID, req.GetExecId()); known && prev.BootID != current.BootID {
		return nil, s.toStatus(ctx, &staleHandleError{sandboxID: sandboxID, execID: req.GetExecId(), handle: prev, current: current}, meta)
	}
	resp, err := agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: req.GetExecId(), Signal: req.GetSignal()})
	if err != nil {
		return nil, s.toStatus(ctx, agentError(sandboxID, err), meta)
	}
	return &berthv1.SignalExecResponse{State: resp.GetState()}, nil
}
