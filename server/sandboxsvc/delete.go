package sandboxsvc

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// DeleteSandbox removes the sandbox; a missing one is not an error, and
// neither is one the caller may not see, which stays untouched: the answer
// is the same as for a missing one. A CreateSandbox of the id in progress
// that fails because of it fails NOT_FOUND SANDBOX_NOT_FOUND ("deleted
// while it was being created").
func (s *Service) DeleteSandbox(ctx context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	id := req.GetSandboxId()
	if err := validate.SandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.life.Delete(ctx, id, p); err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"sandbox_id": id})
	}
	return &berthv1.DeleteSandboxResponse{}, nil
}
