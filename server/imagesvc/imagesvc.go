// Package imagesvc is berth.v1.ImageService: import an OCI archive, list,
// pull from a registry and delete the images of berthd's containerd
// namespace, one file per RPC. A fleet node tells its fleet when its
// images change (Config.Changed), so that placement sees them.
package imagesvc

import (
	"context"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Config configures the image RPCs; the Config of package server documents each field.
type Config struct {
	PullRegistries     []string
	PullResolveTimeout time.Duration
}

// store is what the image RPCs do in containerd (*runtime.Runtime).
type store interface {
	ImportImage(ctx context.Context, archive io.Reader, name string) ([]runtime.Image, error)
	ListImages(ctx context.Context) ([]runtime.Image, error)
	PullImage(ctx context.Context, ref string, opts runtime.PullOptions, progress func([]runtime.PullProgress)) (runtime.Image, error)
	DeleteImage(ctx context.Context, name string, v runtime.ImageViewer) error
}

// fleet learns that the node's images changed (*lifecycle.Manager).
type fleet interface {
	ImagesChanged()
}

// Service implements berth.v1.ImageService.
type Service struct {
	berthv1.UnimplementedImageServiceServer
	cfg  Config
	rt   store
	life fleet
	log  *slog.Logger
}

var _ berthv1.ImageServiceServer = (*Service)(nil)

// New returns the ImageService over rt.
func New(cfg Config, rt store, life fleet, log *slog.Logger) *Service {
	return &Service{cfg: cfg, rt: rt, life: life, log: log}
}

// viewer is the caller as the runtime's image calls see it: a principal
// that is not an admin sees shared images and its own private ones.
func viewer(ctx context.Context) (runtime.ImageViewer, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return runtime.ImageViewer{}, apierr.New(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "the request carries no authenticated principal", nil)
	}
	return runtime.ImageViewer{Principal: p.Name, Admin: p.Admin}, nil
}
