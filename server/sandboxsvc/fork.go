package sandboxsvc

import (
	"context"

	"github.com/berth-sandbox/berth/internal/bounds"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"github.com/berth-sandbox/berth/server/validate"
)

// ForkSandbox makes count children of the sandbox from its files as of
// one point in time (see the proto and lifecycle.Manager.Fork). Errors:
// INVALID_ARGUMENT (sandbox_id, count outside 1 to
// lifecycle.MaxForkCount, request_id, labels), NOT_FOUND for a missing
// sandbox or another principal's, FAILED_PRECONDITION
// SNAPSHOT_UNSUPPORTED or SANDBOX_NOT_RUNNING, RESOURCE_EXHAUSTED
// FLEET_BUSY when the copy would pass the disk budget or the caller's disk
// cap, ALREADY_EXISTS
// SANDBOX_EXISTS for a request_id of an earlier fork with other
// parameters or with children gone, and CreateSandbox's errors for a
// child.
func (s *Service) ForkSandbox(ctx context.Context, req *berthv1.ForkSandboxRequest) (*berthv1.ForkSandboxResponse, error) {
	id := req.GetSandboxId()
	if err := validate.SandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if err := bounds.Uint("count", uint64(req.GetCount()), 1, lifecycle.MaxForkCount, "sandboxes", "a fork makes at least one sandbox"); err != nil {
		return nil, err
	}
	if err := validateRequestID("request_id", req.GetRequestId()); err != nil {
		return nil, err
	}
	if err := validate.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	p, err := s.callerSeeing(ctx, id)
	if err != nil {
		return nil, err
	}
	children, err := s.life.Fork(ctx, id, p, lifecycle.ForkRequest{Count: int(req.GetCount()), RequestID: req.GetRequestId(), Labels: req.GetLabels(), Memory: req.GetMemory()})
	if err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"sandbox_id": id})
	}
	resp := &berthv1.ForkSandboxResponse{}
	for _, c := range children {
		resp.Sandboxes = append(resp.Sandboxes, s.Describe(c.Sandbox, c.Info, nil))
	}
	return resp, nil
}
