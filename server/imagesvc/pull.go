package imagesvc

import (
	"errors"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// pullProgressInterval is how often PullImage reports progress.
const pullProgressInterval = 250 * time.Millisecond

// PullImage pulls an image from its registry, sending progress about every
// 250 ms and the stored image last.
func (s *Service) PullImage(req *berthv1.PullImageRequest, stream berthv1.ImageService_PullImageServer) error {
	ctx := stream.Context()
	ref := req.GetReference()
	if err := validate.ImageRef("reference", ref); err != nil {
		return err
	}
	meta := map[string]string{"reference": ref}
	if _, err := runtime.NormalizeReference(ref); err != nil {
		return apierr.InvalidArgument("reference", err.Error())
	}
	var sendErr error
	opts := runtime.PullOptions{ResolveTimeout: s.cfg.PullResolveTimeout, Interval: pullProgressInterval, Registries: s.cfg.PullRegistries}
	img, err := s.rt.PullImage(ctx, ref, opts, func(layers []runtime.PullProgress) {
		if sendErr == nil {
			sendErr = stream.Send(pullProgressProto(layers))
		}
	})
	switch {
	case errors.Is(err, runtime.ErrRegistryNotAllowed):
		return apierr.New(codes.FailedPrecondition, rpcstatus.ReasonRegistryNotAllowed, err.Error(), meta)
	case errors.Is(err, runtime.ErrRegistryUnreachable):
		return apierr.New(codes.Unavailable, rpcstatus.ReasonRegistry, err.Error(), meta)
	case err != nil:
		return apierr.WithMeta(err, meta)
	case sendErr != nil:
		return apierr.WithMeta(sendErr, meta)
	}
	s.life.ImagesChanged()
	s.log.InfoContext(ctx, "image pulled", slog.String("image", img.Name), slog.String("digest", img.Digest))
	return stream.Send(&berthv1.PullImageResponse{Image: imageProto(img)})
}

func pullProgressProto(layers []runtime.PullProgress) *berthv1.PullImageResponse {
	resp := &berthv1.PullImageResponse{}
	for _, l := range layers {
		resp.Layers = append(resp.Layers, &berthv1.PullLayerProgress{Digest: l.Digest, MediaType: l.MediaType, DownloadedBytes: l.Downloaded, TotalBytes: l.Total, Done: l.Done})
		resp.DownloadedBytes += l.Downloaded
		resp.TotalBytes += l.Total
	}
	return resp
}
