package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"

	"sync"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ErrImageStoreFull means an import or pull would take containerd's content
// store past Config.MaxImageStoreBytes; errors.Is matches *ImageStoreFull.
var ErrImageStoreFull = errors.New("image store full")

// ImageStoreFull is the refusal of an import or pull that would take the
// content store past its bound. Nothing of the image is kept: what was
// stored before the refusal is unreferenced and goes at containerd's next
// garbage collection.
type ImageStoreFull struct {
	// LimitBytes is Config.MaxImageStoreBytes.
	LimitBytes uint64
	// UsedBytes is what the content store held when the import or pull
	// began, in bytes.
	UsedBytes uint64
	// AddingBytes is what the import or pull would have added, in bytes:
	// at least this much (an import's archive is refused as soon as it
	// passes the bound, before it is read whole).
	AddingBytes uint64
}

func (e *ImageStoreFull) Error() string {
	return fmt.Sprintf("the image store holds %d bytes and this image adds at least %d more, past its bound of %d bytes (berthd --max-image-store-bytes): delete images first",
		e.UsedBytes, e.AddingBytes, e.LimitBytes)
}

// Is makes errors.Is(err, ErrImageStoreFull) true.
func (e *ImageStoreFull) Is(target error) bool { return target == ErrImageStoreFull }

// imageStoreBytes is the size of every blob in the content store, in bytes.
func (r *Runtime) imageStoreBytes(ctx context.Context) (uint64, error) {
	var total uint64
	err := r.client.ContentStore().Walk(ctx, func(info content.Info) error {
		total += uint64(max(info.Size, 0))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure the image store: %w", err)
	}
	return total, nil
}

// imageBudget is what an import or pull may still add to the content store
// under Config.MaxImageStoreBytes; a nil *imageBudget has no bound.
type imageBudget struct {
	mu      sync.Mutex
	full    ImageStoreFull
	counted map[digest.Digest]bool // a pull's blobs counted so far
	over    *ImageStoreFull        // set once the bound is passed
}

// newImageBudget measures the content store against the bound; nil when
// there is none.
func (r *Runtime) newImageBudget(ctx context.Context) (*imageBudget, error) {
	if r.cfg.MaxImageStoreBytes == 0 {
		return nil, nil
	}
	used, err := r.imageStoreBytes(ctx)
	if err != nil {
		return nil, err
	}
	return &imageBudget{full: ImageStoreFull{LimitBytes: r.cfg.MaxImageStoreBytes, UsedBytes: used}, counted: make(map[digest.Digest]bool)}, nil
}

// add counts n more bytes; it fails with an *ImageStoreFull once the sum
// passes the bound (a sum that wraps past 2^64 passes it too).
func (b *imageBudget) add(n uint64) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over != nil {
		return b.over
	}
	adding, ok := bounds.Add(b.full.AddingBytes, n)
	total, ok2 := bounds.Add(b.full.UsedBytes, adding)
	b.full.AddingBytes = adding
	if !ok || !ok2 || total > b.full.LimitBytes {
		over := b.full
		b.over = &over
		return b.over
	}
	return nil
}

// exceeded returns the refusal once the bound was passed, whatever error
// containerd made of it on its way out; nil before.
func (b *imageBudget) exceeded() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over == nil {
		return nil
	}
	return b.over
}

// reader counts what r reads against the budget: an archive's bytes count
// in full, blobs the store already holds too.
func (b *imageBudget) reader(r io.Reader) io.Reader {
	if b == nil {
		return r
	}
	return &budgetReader{r: r, b: b}
}

type budgetReader struct {
	r io.Reader
	b *imageBudget
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if aerr := br.b.add(uint64(n)); aerr != nil {
		return n, aerr
	}
	return n, err
}

// blobs counts, once each, the blobs of descs that the content store lacks,
// before a pull fetches them.
func (b *imageBudget) blobs(ctx context.Context, cs content.Store, descs []ocispec.Descriptor) error {
	if b == nil {
		return nil
	}
	for _, d := range descs {
		b.mu.Lock()
		counted := b.counted[d.Digest]
		b.counted[d.Digest] = true
		b.mu.Unlock()
		if counted {
			continue
		}
		if _, err := cs.Info(ctx, d.Digest); err == nil || !errdefs.IsNotFound(err) {
			continue
		}
		if err := b.add(uint64(max(d.Size, 0))); err != nil {
			return err
		}
	}
	return nil
}
