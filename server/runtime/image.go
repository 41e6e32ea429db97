package runtime

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// Image is an image in the store.
type Image struct {
	// Name is the image reference.
	Name string
	// Digest is the target's digest, "sha256:<hex>".
	Digest string
	// SizeBytes is the target descriptor's size in bytes.
	SizeBytes uint64
	// ContentSizeBytes is the size of the image's content for the host's
	// platform (index, manifest, config, compressed layers), in bytes; 0
	// when it could not be read.
	ContentSizeBytes uint64
	// CreatedAt is when the record was created.
	CreatedAt time.Time
	// PrivateTo is the principal an image committed by a principal that
	// is not an admin belongs to (CommitOptions.Private); empty for a
	// shared image, which every principal lists and runs.
	PrivateTo string
}

// ImageViewer is the principal an image call acts for: a private image
// (Image.PrivateTo) is seen only by its principal and by admins.
type ImageViewer struct {
	Principal string
	Admin     bool
}

// Sees reports whether v may list, run and delete an image private to
// privateTo (empty: shared).
func (v ImageViewer) Sees(privateTo string) bool {
	return privateTo == "" || v.Admin || privateTo == v.Principal
}

// ErrImageHidden is ErrImageNotFound for an image stored as another
// principal's private image: its text is the same as a missing image's,
// so that a caller learns nothing of it.
var ErrImageHidden error = hiddenImage{}

type hiddenImage struct{}

func (hiddenImage) Error() string { return ErrImageNotFound.Error() }
func (hiddenImage) Unwrap() error { return ErrImageNotFound }

// ImportImage reads an OCI image layout tar stream (or a Docker archive),
// gzip-compressed or not, stores every image it names and unpacks each into
// the snapshotter. name, when not empty, names the archive's index instead
// of the names recorded in it. It fails with ErrImageArchive when the stream
// is not a readable archive or names no image, and with an *ImageStoreFull
// as soon as the archive's bytes (decompressed, counted in full) would take
// the content store past Config.MaxImageStoreBytes.
func (r *Runtime) ImportImage(ctx context.Context, archive io.Reader, name string) (_ []Image, err error) {
	c := r.beginLong(ctx, "import an image archive")
	defer c.end(&err)
	c.changes()
	stream, err := compression.DecompressStream(archive)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrImageArchive, err)
	}
	defer stream.Close()
	budget, err := r.newImageBudget(ctx)
	if err != nil {
		return nil, err
	}
	// One lease over the import and the unpacking: content that no image
	// record references (yet, or any more) is not collected meanwhile.
	ctx, done, err := r.withLease(ctx, importLeaseExpiry)
	if err != nil {
		return nil, fmt.Errorf("lease for the import: %w", err)
	}
	defer done(context.WithoutCancel(ctx))
	// An import replaces a record's labels with none: an admin's import
	// over the name of a principal's private image (CommitSnapshot) is a
	// shared image, not that principal's.
	opts := []containerd.ImportOpt{containerd.WithImageLabels(map[string]string{})}
	if name != "" {
		opts = append(opts, containerd.WithIndexName(name), containerd.WithSkipDigestRef(func(string) bool { return true }))
	}
	imported, err := r.client.Import(ctx, budget.reader(stream), opts...)
	if err != nil {
		if full := budget.exceeded(); full != nil {
			return nil, full
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("import image archive: %w", ctx.Err())
		}
		if errdefs.IsUnavailable(err) {
			return nil, fmt.Errorf("import image archive: %w", err)
		}
		return nil, fmt.Errorf("%w: %v", ErrImageArchive, err)
	}
	if name != "" {
		// The archive's index has the name: Import records it first.
		// Names from the archive's own annotations were not asked for,
		// and one equal to name (docker save's RepoTags) made Import
		// point the record at a manifest instead: point it back.
		img := imported[0]
		stored, err := r.client.ImageService().Get(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("read back image %s: %w", name, err)
		}
		if stored.Target.Digest != img.Target.Digest {
			if img, err = r.client.ImageService().Update(ctx, img, "target"); err != nil {
				return nil, fmt.Errorf("name image %s: %w", name, err)
			}
		}
		imported = []images.Image{img}
	}
	if len(imported) == 0 {
		return nil, fmt.Errorf("%w: the archive names no image; give a name", ErrImageArchive)
	}
	out := make([]Image, 0, len(imported))
	for _, img := range imported {
		if err := containerd.NewImage(r.client, img).Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", img.Name, err)
		}
		out = append(out, r.imageOf(ctx, img))
	}
	return out, nil
}

// ListImages returns every stored image, ordered by name.
func (r *Runtime) ListImages(ctx context.Context) (_ []Image, err error) {
	c := r.begin(ctx, "list images")
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	imgs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]Image, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, r.imageOf(ctx, img))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (r *Runtime) imageOf(ctx context.Context, img images.Image) Image {
	out := Image{
		Name:      img.Name,
		Digest:    img.Target.Digest.String(),
		SizeBytes: uint64(img.Target.Size),
		CreatedAt: img.CreatedAt,
		PrivateTo: img.Labels[labelImagePrivateTo],
	}
	if n, err := containerd.NewImage(r.client, img).Size(ctx); err == nil && n > 0 {
		out.ContentSizeBytes = uint64(n)
	}
	return out
}

// ResolveImage returns the stored name of the image ref names, as v sees
// it: ref itself when it is stored, else its normalized form as docker
// would read it ("busybox" is "docker.io/library/busybox:latest",
// "berth.dev/base" is "berth.dev/base:latest") when that is stored. It
// fails with ErrImageNotFound naming ref otherwise, and with
// ErrImageHidden (an ErrImageNotFound of the same text) when the name it
// finds is another principal's private image.
func (r *Runtime) ResolveImage(ctx context.Context, ref string, v ImageViewer) (_ string, err error) {
	c := r.begin(ctx, "find image "+ref)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	names := []string{ref}
	if named, perr := reference.ParseDockerRef(ref); perr == nil && named.String() != ref {
		names = append(names, named.String())
	}
	for _, name := range names {
		img, err := r.client.ImageService().Get(ctx, name)
		switch {
		case errdefs.IsNotFound(err):
			continue
		case err != nil:
			return "", fmt.Errorf("get image %s: %w", name, err)
		case !v.Sees(img.Labels[labelImagePrivateTo]):
			return "", fmt.Errorf("%w: %s", ErrImageHidden, ref)
		}
		return name, nil
	}
	return "", fmt.Errorf("%w: %s", ErrImageNotFound, ref)
}
