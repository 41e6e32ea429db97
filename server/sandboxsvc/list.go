package sandboxsvc

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/validate"
)

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// ListSandboxes lists the caller's sandboxes (an admin's: all) ordered by
// id. The page token is the last id of the previous page, base64-encoded.
func (s *Service) ListSandboxes(ctx context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > maxPageSize:
		return nil, apierr.InvalidArgument("page_size", fmt.Sprintf("%d is outside 0 to %d", size, maxPageSize))
	case size == 0:
		size = defaultPageSize
	}
	var after string
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			return nil, apierr.InvalidArgument("page_token", "is not a token from next_page_token")
		}
		after = string(b)
	}
	if err := validate.Labels("label_selector", req.GetLabelSelector()); err != nil {
		return nil, err
	}
	selector := req.GetLabelSelector()
	if !p.Admin {
		// containerd filters by owner: a principal's listing costs what
		// its own sandboxes cost, not what the host holds.
		selector = maps.Clone(selector)
		if selector == nil {
			selector = make(map[string]string, 1)
		}
		selector[runtime.LabelOwner] = p.Name
	}
	all, err := s.rt.List(ctx, selector)
	if err != nil {
		return nil, err
	}
	resp := &berthv1.ListSandboxesResponse{}
	for _, sb := range all {
		if sb.ID <= after || sb.Pooled || !p.Sees(sb.Owner) {
			continue
		}
		if len(resp.Sandboxes) == size {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(resp.Sandboxes[size-1].Id))
			break
		}
		resp.Sandboxes = append(resp.Sandboxes, s.Describe(sb, s.agentInfo(ctx, sb), nil))
	}
	return resp, nil
}
