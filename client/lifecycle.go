package client

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// KeepAlive counts as activity in sandbox id now and, when holdFor is
// positive, keeps its idle timeout from stopping it for holdFor (at most
// berthd's maximum idle timeout). It never extends the maximum lifetime.
// It returns when the sandbox would expire now. Errors: codes.NotFound
// (ReasonSandboxNotFound), codes.InvalidArgument for a holdFor beyond the
// server's bound.
func (c *Client) KeepAlive(ctx context.Context, id string, holdFor time.Duration) (*berthv1.KeepAliveResponse, error) {
	req := &berthv1.KeepAliveRequest{SandboxId: id}
	if holdFor != 0 {
		req.HoldFor = durationpb.New(holdFor)
	}
	resp, err := c.sandboxes.KeepAlive(ctx, req)
	if err != nil {
		return nil, convertError(err)
	}
	return resp, nil
}

// PullOption configures PullImage.
type PullOption func(*pullConfig)

type pullConfig struct {
	progress func(*berthv1.PullImageResponse)
	nodes    func([]*berthv1.ImageNodeResult)
}

// WithPullNodes has PullImage call fn, in a fleet, with what each node
// made of the pull (PullImageResponse.nodes, ordered by node id): a node
// whose result is not ok does not hold the image.
func WithPullNodes(fn func([]*berthv1.ImageNodeResult)) PullOption {
	return func(c *pullConfig) { c.nodes = fn }
}

// WithPullProgress has PullImage call fn with every progress message berthd
// sends (about four a second: each blob seen so far with its downloaded
// and total bytes). fn runs on the calling goroutine.
func WithPullProgress(fn func(*berthv1.PullImageResponse)) PullOption {
	return func(c *pullConfig) { c.progress = fn }
}

// PullImage has berthd pull ref from its registry, store and unpack it, and
// returns the stored image. A bare name means docker.io and ":latest".
// Errors: codes.Unavailable (ReasonRegistry) when the registry cannot be
// reached, codes.NotFound (ReasonImageNotFound) when it has no such image,
// codes.InvalidArgument for a malformed reference.
func (c *Client) PullImage(ctx context.Context, ref string, opts ...PullOption) (*berthv1.Image, error) {
	var cfg pullConfig
	for _, o := range opts {
		o(&cfg)
	}
	stream, err := c.images.PullImage(ctx, &berthv1.PullImageRequest{Reference: ref})
	if err != nil {
		return nil, convertError(err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("pull image: berthd ended the stream without the image")
		}
		if err != nil {
			return nil, convertError(err)
		}
		if msg.GetImage() != nil {
			if cfg.nodes != nil {
				cfg.nodes(msg.GetNodes())
			}
			return msg.GetImage(), nil
		}
		if cfg.progress != nil {
			cfg.progress(msg)
		}
	}
}

// DeleteImage removes the image name from berthd's store; sandboxes created
// from it keep running. Errors: codes.NotFound (ReasonImageNotFound).
func (c *Client) DeleteImage(ctx context.Context, name string) error {
	_, err := c.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: name})
	return convertError(err)
}
