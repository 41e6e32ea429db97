package sandboxsvc

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	"google.golang.org/protobuf/types/known/timestamppb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// KeepAlive records activity in the sandbox and, with hold_for, holds off
// its idle timeout; the hold is stored in its labels so that a restarted
// berthd keeps it.
func (s *Service) KeepAlive(ctx context.Context, req *berthv1.KeepAliveRequest) (*berthv1.KeepAliveResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	if err := validate.SandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	var hold time.Duration
	if h := req.GetHoldFor(); h != nil {
		if err := h.CheckValid(); err != nil {
			return nil, apierr.InvalidArgument("hold_for", err.Error())
		}
		hold = h.AsDuration()
		if hold < 0 || hold > s.cfg.MaxIdleTimeout {
			return nil, apierr.InvalidArgument("hold_for", fmt.Sprintf("%v is outside 0 to the server's maximum idle timeout %v", hold, s.cfg.MaxIdleTimeout))
		}
	}
	if _, err := s.visibleSandbox(ctx, id); err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	if hold > 0 {
		if err := s.life.Hold(ctx, id, time.Now().Add(hold)); err != nil {
			return nil, apierr.WithMeta(err, meta)
		}
	} else {
		s.life.Touch(id)
	}
	resp := &berthv1.KeepAliveResponse{}
	if st, ok := s.life.Status(id); ok {
		if !st.IdleDeadline.IsZero() {
			resp.IdleExpiresAt = timestamppb.New(st.IdleDeadline)
		}
		if !st.ExpiresAt.IsZero() {
			resp.ExpiresAt = timestamppb.New(st.ExpiresAt)
		}
	}
	return resp, nil
}
