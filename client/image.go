package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// importChunkBytes is the size of the archive chunks ImportImage sends; the
// API allows up to 4 MiB.
const importChunkBytes = 1 << 20

// ImportOption configures ImportImage.
type ImportOption func(*importConfig)

type importConfig struct {
	progress func(sentBytes uint64)
	nodes    func([]*berthv1.ImageNodeResult)
}

// WithImportNodes has ImportImage call fn, in a fleet, with what each node
// made of the import (ImportImageResponse.nodes, ordered by node id): a
// node whose result is not ok does not hold the image.
func WithImportNodes(fn func([]*berthv1.ImageNodeResult)) ImportOption {
	return func(c *importConfig) { c.nodes = fn }
}

// WithProgress has ImportImage call fn after each chunk it sends, with the
// total number of archive bytes sent so far. fn runs on the calling
// goroutine.
func WithProgress(fn func(sentBytes uint64)) ImportOption {
	return func(c *importConfig) { c.progress = fn }
}

// ImportImage streams the OCI image archive read from r (an OCI image layout
// as a tar stream, optionally gzip-compressed) to berthd in chunks of 1 MiB,
// and returns the images berthd stored. name, when not empty, replaces the
// image name recorded in the archive; it is required when the archive names
// none.
//
// When reading r fails, the upload is abandoned (berthd sees a canceled
// stream, not the end of a short archive) and the read error is returned
// wrapped. Errors from berthd: codes.InvalidArgument (ReasonImageArchive)
// when the archive cannot be read or names no image.
func (c *Client) ImportImage(ctx context.Context, r io.Reader, name string, opts ...ImportOption) ([]*berthv1.Image, error) {
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.images.ImportImage(ctx)
	if err != nil {
		return nil, convertError(err)
	}
	send := func(req *berthv1.ImportImageRequest) error {
		err := stream.Send(req)
		if errors.Is(err, io.EOF) {
			// berthd ended the stream; its status says why.
			if _, err = stream.CloseAndRecv(); err == nil {
				err = errors.New("import image: berthd answered before the whole archive was sent")
			}
		}
		return convertError(err)
	}
	header := &berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: name}}}
	if err := send(header); err != nil {
		return nil, err
	}
	buf := make([]byte, importChunkBytes)
	var sent uint64
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			// Send marshals the message before it returns, so buf can be
			// reused.
			if err := send(&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				return nil, err
			}
			sent += uint64(n)
			if cfg.progress != nil {
				cfg.progress(sent)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			cancel()
			return nil, fmt.Errorf("read image archive: %w", rerr)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, convertError(err)
	}
	if cfg.nodes != nil {
		cfg.nodes(resp.GetNodes())
	}
	return resp.GetImages(), nil
}

// ListImages returns every image in berthd's store, ordered by name.
func (c *Client) ListImages(ctx context.Context) ([]*berthv1.Image, error) {
	var resp *berthv1.ListImagesResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.images.ListImages(ctx, &berthv1.ListImagesRequest{})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetImages(), nil
}
