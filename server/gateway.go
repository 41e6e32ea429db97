package server

import (
	"context"

	"github.com/berth-sandbox/berth/server/apierr"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// A gateway berthd (NewGatewayServer) registers these in place of a
// Service: its router sends every call naming a sandbox to a node, so
// only a call that names none — an Exec stream closed before its first
// message — reaches them, and images are the nodes': the router sends an
// import or pull to every node and answers ListImages from the nodes'
// records, so only DeleteImage reaches gatewayImages.
type (
	gatewayService struct {
		berthv1.UnimplementedSandboxServiceServer
	}
	gatewayFiles struct {
		berthv1.UnimplementedFileServiceServer
	}
	gatewayImages struct {
		berthv1.UnimplementedImageServiceServer
	}
)

func noImages() error {
	return apierr.New(codes.FailedPrecondition, rpcstatus.ReasonNotANode,
		"this berthd is a gateway and holds no images: delete an image on each node of the fleet that holds it (ListImages names them)", nil)
}

// ImportImage implements berth.v1.ImageService.
func (gatewayImages) ImportImage(berthv1.ImageService_ImportImageServer) error { return noImages() }

// ListImages implements berth.v1.ImageService.
func (gatewayImages) ListImages(context.Context, *berthv1.ListImagesRequest) (*berthv1.ListImagesResponse, error) {
	return nil, noImages()
}

// PullImage implements berth.v1.ImageService.
func (gatewayImages) PullImage(*berthv1.PullImageRequest, berthv1.ImageService_PullImageServer) error {
	return noImages()
}

// DeleteImage implements berth.v1.ImageService.
func (gatewayImages) DeleteImage(context.Context, *berthv1.DeleteImageRequest) (*berthv1.DeleteImageResponse, error) {
	return nil, noImages()
}
