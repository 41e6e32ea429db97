package imagesvc

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/status"
)

// fakeStore records the names ImportImage was asked to store.
type fakeStore struct {
	store
	imported []string
}

func (f *fakeStore) ImportImage(_ context.Context, archive io.Reader, name string) ([]runtime.Image, error) {
	io.Copy(io.Discard, archive) //nolint:errcheck // a fake
	f.imported = append(f.imported, name)
	return []runtime.Image{{Name: name}}, nil
}

type noFleet struct{}

func (noFleet) ImagesChanged() {}

// importStream is an ImportImage stream of msgs.
type importStream struct {
	grpc.ServerStream
	msgs []*berthv1.ImportImageRequest
}

func (s *importStream) Context() context.Context { return context.Background() }

func (s *importStream) Recv() (*berthv1.ImportImageRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *importStream) SendAndClose(*berthv1.ImportImageResponse) error { return nil }

// TestImportImageName: a header name that CreateSandbox would refuse as
// an image ("x y": `berth image import --name 'x y' DIR` stored it, and
// no sandbox could run it) is INVALID_ARGUMENT naming header.name before
// anything is stored; a good one and none (the archive's own) are stored.
func TestImportImageName(t *testing.T) {
	for _, c := range []struct {
		name string
		code codes.Code
	}{
		{"x y", codes.InvalidArgument},
		{"tab\there", codes.InvalidArgument},
		{"berth.dev/ok:v1", codes.OK},
		{"", codes.OK},
	} {
		st := &fakeStore{}
		s := New(Config{}, st, noFleet{}, slog.New(slog.DiscardHandler))
		err := s.ImportImage(&importStream{msgs: []*berthv1.ImportImageRequest{
			{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: c.name}}},
			{Part: &berthv1.ImportImageRequest_Chunk{Chunk: []byte("archive")}},
		}})
		if got := grpcstatus.Code(status.Of(err)); got != c.code {
			t.Errorf("name %q: %v, want %v", c.name, err, c.code)
		}
		if c.code != codes.OK && len(st.imported) != 0 {
			t.Errorf("name %q: refused, yet %q stored", c.name, st.imported)
		}
	}
}
