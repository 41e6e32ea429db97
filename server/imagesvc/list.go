package imagesvc

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ListImages lists the images in berthd's containerd namespace that the
// caller sees: the shared ones and its own private ones (an admin: all).
func (s *Service) ListImages(ctx context.Context, _ *berthv1.ListImagesRequest) (*berthv1.ListImagesResponse, error) {
	v, err := viewer(ctx)
	if err != nil {
		return nil, err
	}
	imgs, err := s.rt.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	resp := &berthv1.ListImagesResponse{}
	for _, img := range imgs {
		if v.Sees(img.PrivateTo) {
			resp.Images = append(resp.Images, imageProto(img))
		}
	}
	return resp, nil
}

func imageProto(img runtime.Image) *berthv1.Image {
	return &berthv1.Image{Name: img.Name, Digest: img.Digest, SizeBytes: img.SizeBytes, ContentSizeBytes: img.ContentSizeBytes, CreatedAt: timestamppb.New(img.CreatedAt)}
}
