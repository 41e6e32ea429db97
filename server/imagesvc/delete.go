package imagesvc

import (
	"context"
	"log/slog"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// DeleteImage deletes an image record; sandboxes created from it keep their
// snapshots and run on. An admin deletes any image, another principal
// only its own private ones (CommitSnapshot): a shared image is
// PERMISSION_DENIED NOT_PERMITTED, another principal's private one
// NOT_FOUND IMAGE_NOT_FOUND as a missing one.
func (s *Service) DeleteImage(ctx context.Context, req *berthv1.DeleteImageRequest) (*berthv1.DeleteImageResponse, error) {
	name := req.GetName()
	if err := validate.ImageRef("name", name); err != nil {
		return nil, err
	}
	v, err := viewer(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.rt.DeleteImage(ctx, name, v); err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"name": name})
	}
	s.life.ImagesChanged()
	s.log.InfoContext(ctx, "image deleted", slog.String("image", name))
	return &berthv1.DeleteImageResponse{}, nil
}
