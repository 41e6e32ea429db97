package integration

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestImageStoreBound: under --max-image-store-bytes, an import or a pull
// that would take containerd's content store past the bound is refused
// RESOURCE_EXHAUSTED NO_SPACE naming the image store, its bound and what it
// holds, and leaves no image behind; under a bound with room both succeed,
// and a pull of blobs the store already holds adds nothing to count.
func TestImageStoreBound(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fi, err := os.Stat(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	archive := uint64(fi.Size())
	host, _ := serveRegistry(t, archivePath(), "berth/bounded", "v1")
	ref := host + "/berth/bounded:v1"
	cfg := server.Config{PullRegistries: []string{host}, TaskRestartLimit: -1}

	t.Run("full", func(t *testing.T) {
		limit := archive / 2
		rt, _, _ := newNamespaceRuntimeWith(t, "store-full", func(c *runtime.Config) { c.MaxImageStoreBytes = limit })
		images := imageClient(t, serveService(t, cfg, rt))
		err := importImageTo(ctx, images, archivePath(), "berth.dev/too-big:v1")
		checkStoreFull(t, "ImportImage", err, limit)
		stream, err := images.PullImage(ctx, &berthv1.PullImageRequest{Reference: ref})
		if err == nil {
			_, err = recvAll(stream.Recv)
		}
		checkStoreFull(t, "PullImage", err, limit)
		list, err := images.ListImages(ctx, &berthv1.ListImagesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.GetImages()) != 0 {
			t.Errorf("ListImages after the refusals = %v; want none", list.GetImages())
		}
	})
	t.Run("room", func(t *testing.T) {
		// Room for one copy of the image's blobs, not two: the pull of
		// the blobs the import stored adds nothing.
		rt, _, _ := newNamespaceRuntimeWith(t, "store-room", func(c *runtime.Config) { c.MaxImageStoreBytes = archive * 3 / 2 })
		images := imageClient(t, serveService(t, cfg, rt))
		if err := importImageTo(ctx, images, archivePath(), "berth.dev/fits:v1"); err != nil {
			t.Fatalf("ImportImage under a bound with room: %v", err)
		}
		stream, err := images.PullImage(ctx, &berthv1.PullImageRequest{Reference: ref})
		if err == nil {
			_, err = recvAll(stream.Recv)
		}
		if err != nil {
			t.Fatalf("PullImage of blobs the store holds: %v", err)
		}
	})
}

func checkStoreFull(t *testing.T, call string, err error, limit uint64) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonNoSpace {
		t.Fatalf("%s past the image store's bound = %v; want RESOURCE_EXHAUSTED %s", call, err, rpcstatus.ReasonNoSpace)
	}
	var meta map[string]string
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			meta = info.GetMetadata()
		}
	}
	if meta["resource"] != "image_store" || meta["limit_bytes"] != strconv.FormatUint(limit, 10) || meta["used_bytes"] == "" {
		t.Errorf("%s refusal's metadata = %v; want resource image_store, limit_bytes %d, used_bytes", call, meta, limit)
	}
}

// imageClient is an ImageService client of the berthd at addr, closed at
// cleanup.
func imageClient(t *testing.T, addr string) berthv1.ImageServiceClient {
	t.Helper()
	return berthv1.NewImageServiceClient(plainConn(t, addr))
}
