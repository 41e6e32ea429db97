package files

import (
	"context"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// Stat describes a path with lstat(2) semantics.
func (s *Service) Stat(_ context.Context, req *agentv1.StatRequest) (*agentv1.StatResponse, error) {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return nil, err
	}
	resp := &agentv1.StatResponse{}
	err = s.asUser(func() error {
		info, err := lstatInfo(path)
		resp.Info = info
		return err
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return resp, nil
}
