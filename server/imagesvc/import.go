package imagesvc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// ImportImage streams the caller's archive into containerd's importer as it
// arrives; nothing is buffered whole.
func (s *Service) ImportImage(stream berthv1.ImageService_ImportImageServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return apierr.InvalidArgument("header", "the stream ended before the header")
		}
		return err
	}
	header := first.GetHeader()
	if header == nil {
		return apierr.InvalidArgument("header", "the first message must be the header")
	}
	// A name CreateSandbox would refuse is refused here, before anything
	// is stored: an image no sandbox can name is of no use.
	if name := header.GetName(); name != "" {
		if err := validate.ImageRef("header.name", name); err != nil {
			return err
		}
	}
	pr, pw := io.Pipe()
	var protoErr validate.ProtocolError
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
				protoErr.Set(apierr.InvalidArgument("header", "only the first message may be a header"))
				pw.CloseWithError(errors.New("a second header arrived"))
				return
			}
			if _, err := pw.Write(chunk); err != nil {
				return // the importer stopped reading; its error is returned
			}
		}
	}()
	imported, err := s.rt.ImportImage(ctx, pr, header.GetName())
	s.life.ImagesChanged()
	pr.CloseWithError(errors.New("import ended"))
	if perr := protoErr.Get(); perr != nil {
		return perr
	}
	if err != nil {
		return apierr.WithMeta(err, map[string]string{"name": header.GetName()})
	}
	resp := &berthv1.ImportImageResponse{}
	for _, img := range imported {
		resp.Images = append(resp.Images, imageProto(img))
		s.log.InfoContext(ctx, "image imported", slog.String("image", img.Name), slog.String("digest", img.Digest))
	}
	return stream.SendAndClose(resp)
}
