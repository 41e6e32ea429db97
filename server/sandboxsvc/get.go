package sandboxsvc

import (
	"context"
	"log/slog"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/validate"
)

// GetSandbox returns the sandbox's record from containerd with its state
// (starting, running, paused, stopping with the reason, stopped), its agent's
// identity and exec count, its deadlines and its live usage (containerd
// task metrics). Warm-pool members that no caller claimed, and sandboxes of
// other principals, are NOT_FOUND.
func (s *Service) GetSandbox(ctx context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	if err := validate.SandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	sb, err := s.visibleSandbox(ctx, id)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	var usage *runtime.Usage
	if sb.Running || sb.Paused {
		if u, err := s.rt.Usage(ctx, id); err == nil {
			usage = &u
		} else {
			s.log.DebugContext(ctx, "sandbox usage unavailable", slog.String("sandbox_id", id), slog.Any("error", err))
		}
	}
	return &berthv1.GetSandboxResponse{Sandbox: s.Describe(sb, s.agentInfo(ctx, sb), usage)}, nil
}

// agentInfo asks a running sandbox's agent for its identity, briefly; it
// returns nil when the agent does not answer.
func (s *Service) agentInfo(ctx context.Context, sb runtime.Sandbox) *agentv1.InfoResponse {
	if !sb.Running {
		return nil
	}
	info, err := s.agents.Info(ctx, sb)
	if err != nil {
		return nil
	}
	return info
}
