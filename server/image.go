package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ImportImage streams the caller's archive into containerd's importer as it
// arrives; nothing is buffered whole.
func (s *Service) ImportImage(stream berthv1.ImageService_ImportImageServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return rpcstatus.InvalidArgument("header", "the stream ended before the header")
		}
		return s.toStatus(ctx, err, nil)
	}
	header := first.GetHeader()
	if header == nil {
		return rpcstatus.InvalidArgument("header", "the first message must be the header")
	}
	pr, pw := io.Pipe()
	var protoErr protocolError
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					pw.Close()
				} else {
					pw.CloseWithError(fmt.Errorf("receive archive: %w", err))
				}
				return
			}
			chunk := msg.GetChunk()
			if msg.GetHeader() != nil {
				protoErr.set(rpcstatus.InvalidArgument("header", "only the first message may be a header"))
				pw.CloseWithError(errors.New("a second header arrived"))
				return
			}
			if _, err := pw.Write(chunk); err != nil {
				return // the importer stopped reading; its error is returned
			}
		}
	}()
	imported, err := s.rt.ImportImage(ctx, pr, header.GetName())
	s.imagesChanged()
	pr.CloseWithError(errors.New("import ended"))
	if perr := protoErr.get(); perr != nil {
		return perr
	}
	if err != nil {
		return s.toStatus(ctx, err, map[string]string{"name": header.GetName()})
	}
	resp := &berthv1.ImportImageResponse{}
	for _, img := range imported {
		resp.Images = append(resp.Images, imageProto(img))
		s.log.InfoContext(ctx, "image imported", slog.String("image", img.Name), slog.String("digest", img.Digest))
	}
	return stream.SendAndClose(resp)
}

// ListImages lists the images in berthd's containerd namespace.
func (s *Service) ListImages(ctx context.Context, _ *berthv1.ListImagesRequest) (*berthv1.ListImagesResponse, error) {
	imgs, err := s.rt.ListImages(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err, nil)
	}
	resp := &berthv1.ListImagesResponse{}
	for _, img := range imgs {
		resp.Images = append(resp.Images, imageProto(img))
	}
	return resp, nil
}

func imageProto(img runtime.Image) *berthv1.Image {
	return &berthv1.Image{Name: img.Name, Digest: img.Digest, SizeBytes: img.SizeBytes, ContentSizeBytes: img.ContentSizeBytes, CreatedAt: timestamppb.New(img.CreatedAt)}
}
