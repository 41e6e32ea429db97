package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/bounds"
)

// ErrImageExists means an image of that name is stored already (a commit
// without replace), whoever's it is.
var ErrImageExists = errors.New("image exists")

// ErrImageShared means a principal that is not an admin asked to delete a
// shared image (only admins delete those).
var ErrImageShared = errors.New("image is shared")

// Labels of an image record made by CommitSnapshot.
const (
	labelImageCommittedBy   = LabelPrefix + "image.committed-by"   // principal
	labelImageCommittedFrom = LabelPrefix + "image.committed-from" // snapshot id
	// labelImagePrivateTo marks a private image (CommitOptions.Private):
	// the principal that alone, beside admins, lists, runs and deletes it.
	labelImagePrivateTo = LabelPrefix + "image.private-to"
)

// CommitOptions say what CommitSnapshot makes.
type CommitOptions struct {
	// Ref names the new image (stored as given; it must parse as a
	// docker reference).
	Ref string
	// Replace lets the commit replace a stored image named Ref.
	Replace bool
	// Owner is the committing principal, kept as a label of the image.
	Owner string
	// Private makes the image Owner's (Image.PrivateTo): the commit of a
	// principal that is not an admin, which must not put files under a
	// name other principals run.
	Private bool
	// Env are "KEY=VALUE" variables set in the config's Env, replacing a
	// variable of the same key.
	Env []string
	// WorkingDir, Entrypoint and Cmd, when not empty, replace the
	// config's.
	WorkingDir string
	Entrypoint []string
	Cmd        []string
}

// Commit is what CommitSnapshot made.
type Commit struct {
	Image Image
	// Layer is the new layer's blob (compressed) in the content store.
	Layer ocispec.Descriptor
}

// CommitSnapshot stores stored snapshot snapID as image opts.Ref: the
// snapshot's image's manifest plus one layer, containerd's diff service's
// comparison of the image's unpacked layers (a read-only view of its chain
// id) with a view of the snapshot, written as a gzip-compressed tar with
// whiteouts into the content store; the image's config with that layer's
// diff id, a history entry and opts' changes; and a new manifest. The
// files need no chown: a snapshot holds them under the image's own ids.
// The image is unpacked into the snapshotter before CommitSnapshot
// returns. Everything is written under one lease, so containerd's garbage
// collector takes nothing before the image record references it.
// Errors: ErrSnapshotNotFound, ErrSnapshotUnsupported, ErrInvalidReference,
// ErrImageExists (unless opts.Replace), ErrImageNotFound when the
// snapshot's image was deleted or replaced since (its layers are not the
// snapshot's parents), an *ImageStoreFull past Config.MaxImageStoreBytes,
// containerd's.
func (r *Runtime) CommitSnapshot(ctx context.Context, snapID string, opts CommitOptions) (_ Commit, err error) {
	c := r.beginLong(ctx, "commit snapshot "+snapID)
	defer c.end(&err)
	if err := r.snapshotsSupported(); err != nil {
		return Commit{}, err
	}
	if _, err := reference.ParseDockerRef(opts.Ref); err != nil {
		return Commit{}, fmt.Errorf("%w: %q: %v", ErrInvalidReference, opts.Ref, err)
	}
	snap, err := r.getSnapshot(ctx, snapID)
	if err != nil {
		return Commit{}, err
	}
	is := r.client.ImageService()
	if !opts.Replace {
		if _, err := is.Get(ctx, opts.Ref); err == nil {
			return Commit{}, fmt.Errorf("%w: %s (commit with replace to replace it)", ErrImageExists, opts.Ref)
		} else if !errdefs.IsNotFound(err) {
			return Commit{}, fmt.Errorf("get image %s: %w", opts.Ref, err)
		}
	}
	base, err := is.Get(ctx, snap.Image)
	if errdefs.IsNotFound(err) {
		return Commit{}, fmt.Errorf("%w: %s, the image of snapshot %s, was deleted", ErrImageNotFound, snap.Image, snapID)
	}
	if err != nil {
		return Commit{}, fmt.Errorf("get image %s: %w", snap.Image, err)
	}
	cs := r.client.ContentStore()
	manifest, config, err := readImage(ctx, cs, base, containerd.NewImage(r.client, base).Platform())
	if err != nil {
		return Commit{}, err
	}
	chain := identity.ChainID(config.RootFS.DiffIDs).String()
	if err := r.snapshotOnChain(ctx, snapID, chain); err != nil {
		return Commit{}, err
	}
	budget, err := r.newImageBudget(ctx)
	if err != nil {
		return Commit{}, err
	}
	c.changes()
	ctx, done, err := r.withLease(ctx, importLeaseExpiry)
	if err != nil {
		return Commit{}, fmt.Errorf("lease for the commit: %w", err)
	}
	defer done(context.WithoutCancel(ctx))

	docker := manifest.Config.MediaType == images.MediaTypeDockerSchema2Config
	layerType, manifestType := ocispec.MediaTypeImageLayerGzip, ocispec.MediaTypeImageManifest
	if docker {
		layerType, manifestType = images.MediaTypeDockerSchema2LayerGzip, images.MediaTypeDockerSchema2Manifest
	}
	layer, diffID, err := r.diffSnapshot(ctx, snapID, chain, layerType, budget)
	if err != nil {
		return Commit{}, err
	}

	now := time.Now().UTC()
	config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, diffID)
	config.Created = &now
	config.History = append(config.History, ocispec.History{
		Created:   &now,
		CreatedBy: "berth snapshot commit " + snapID,
		Comment:   fmt.Sprintf("snapshot %s of sandbox %s, committed by %s", snapID, snap.SandboxID, opts.Owner),
	})
	applyConfigChanges(&config.Config, opts)
	configDesc, err := writeJSONBlob(ctx, cs, "berth-commit-config-"+snapID, manifest.Config.MediaType, config, nil)
	if err != nil {
		return Commit{}, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: manifestType,
		Config:    configDesc,
		Layers:    append(slices.Clone(manifest.Layers), layer),
	}
	// The manifest references its config and layers for containerd's
	// garbage collector, as a pulled one does.
	gcRefs := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range m.Layers {
		gcRefs[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	manifestDesc, err := writeJSONBlob(ctx, cs, "berth-commit-manifest-"+snapID, manifestType, m, gcRefs)
	if err != nil {
		return Commit{}, err
	}
	img := images.Image{
		Name:   opts.Ref,
		Target: manifestDesc,
		Labels: map[string]string{labelImageCommittedBy: opts.Owner, labelImageCommittedFrom: snapID},
	}
	if opts.Private {
		img.Labels[labelImagePrivateTo] = opts.Owner
	}
	created := true
	stored, err := is.Create(ctx, img)
	if errdefs.IsAlreadyExists(err) && opts.Replace {
		created = false
		stored, err = is.Update(ctx, img, "target", "labels")
	}
	switch {
	case errdefs.IsAlreadyExists(err):
		return Commit{}, fmt.Errorf("%w: %s (commit with replace to replace it)", ErrImageExists, opts.Ref)
	case err != nil:
		return Commit{}, fmt.Errorf("store image %s: %w", opts.Ref, err)
	}
	if err := containerd.NewImage(r.client, stored).Unpack(ctx, r.cfg.Snapshotter); err != nil {
		if created {
			_ = is.Delete(context.WithoutCancel(ctx), opts.Ref)
		}
		return Commit{}, fmt.Errorf("unpack image %s: %w", opts.Ref, err)
	}
	return Commit{Image: r.imageOf(ctx, stored), Layer: layer}, nil
}

// readImage returns image img's manifest and config for platform.
func readImage(ctx context.Context, cs content.Store, img images.Image, platform platforms.MatchComparer) (ocispec.Manifest, ocispec.Image, error) {
	manifest, err := images.Manifest(ctx, cs, img.Target, platform)
	if err != nil {
		return ocispec.Manifest{}, ocispec.Image{}, fmt.Errorf("read the manifest of image %s: %w", img.Name, err)
	}
	b, err := content.ReadBlob(ctx, cs, manifest.Config)
	if err != nil {
		return ocispec.Manifest{}, ocispec.Image{}, fmt.Errorf("read the config of image %s: %w", img.Name, err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(b, &config); err != nil {
		return ocispec.Manifest{}, ocispec.Image{}, fmt.Errorf("decode the config of image %s: %w", img.Name, err)
	}
	return manifest, config, nil
}

// snapshotOnChain fails with ErrImageNotFound unless stored snapshot
// snapID's parents (through the snapshots that sandboxes made from
// snapshots were made of) end at chain, its image's unpacked layers: an
// image deleted and stored again under the same name has other layers.
func (r *Runtime) snapshotOnChain(ctx context.Context, snapID, chain string) error {
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	key := snapshotKeyPrefix + snapID
	for {
		info, err := sn.Stat(ctx, key)
		if err != nil {
			return fmt.Errorf("stat snapshot %s: %w", key, err)
		}
		if !strings.HasPrefix(info.Parent, snapshotKeyPrefix) {
			if info.Parent != chain {
				return fmt.Errorf("%w: the image of snapshot %s was replaced since the snapshot was taken (its layers are no longer the snapshot's parents)", ErrImageNotFound, snapID)
			}
			return nil
		}
		key = info.Parent
	}
}

// diffSnapshot writes the difference between chain (an image's unpacked
// layers) and stored snapshot snapID into the content store as a layer of
// mediaType, through containerd's diff service, and returns it with its
// diff id (the digest of the uncompressed tar). ctx must hold a lease.
// Before the diff, budget counts the bytes of the files the snapshot adds
// or changes (changedBytes): the tar holds them in full and the unpack
// writes them in full, whatever disk they take in the snapshot (a sparse
// file takes none, a reflinked copy shares its extents); after it, the
// compressed layer where that is larger.
func (r *Runtime) diffSnapshot(ctx context.Context, snapID, chain, mediaType string, budget *imageBudget) (ocispec.Descriptor, digest.Digest, error) {
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	view := func(key, parent string) ([]mount.Mount, func(), error) {
		mounts, err := sn.View(ctx, key, parent)
		if err != nil {
			return nil, nil, fmt.Errorf("view of %s: %w", parent, err)
		}
		return mounts, func() { _ = sn.Remove(context.WithoutCancel(ctx), key) }, nil
	}
	unique := newStoredID("snap-")
	lower, removeLower, err := view("berth-commit/"+unique+"/lower", chain)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	defer removeLower()
	upper, removeUpper, err := view("berth-commit/"+unique+"/upper", snapshotKeyPrefix+snapID)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	defer removeUpper()
	var changed uint64
	if budget != nil {
		if changed, err = changedBytes(ctx, lower, upper); err != nil {
			return ocispec.Descriptor{}, "", fmt.Errorf("measure snapshot %s against its image: %w", snapID, err)
		}
		if err := budget.add(changed); err != nil {
			return ocispec.Descriptor{}, "", err
		}
	}
	layer, err := r.client.DiffService().Compare(ctx, lower, upper,
		diff.WithMediaType(mediaType), diff.WithReference("berth-commit-layer-"+snapID))
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("diff snapshot %s against its image: %w", snapID, err)
	}
	info, err := r.client.ContentStore().Info(ctx, layer.Digest)
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("read the layer of snapshot %s: %w", snapID, err)
	}
	if size := uint64(max(info.Size, 0)); size > changed {
		if err := budget.add(size - changed); err != nil {
			return ocispec.Descriptor{}, "", err
		}
	}
	diffID, err := digest.Parse(info.Labels[labels.LabelUncompressed])
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("the layer of snapshot %s has no uncompressed digest (label %s): %w", snapID, labels.LabelUncompressed, err)
	}
	return ocispec.Descriptor{MediaType: mediaType, Digest: layer.Digest, Size: info.Size}, diffID, nil
}

// writeJSONBlob stores v as JSON of mediaType in the content store with
// gcRefs as its labels and returns its descriptor.
func writeJSONBlob(ctx context.Context, cs content.Store, ref, mediaType string, v any, gcRefs map[string]string) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode %s: %w", mediaType, err)
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, ref, bytes.NewReader(b), desc, content.WithLabels(gcRefs)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store %s: %w", mediaType, err)
	}
	return desc, nil
}

// applyConfigChanges sets opts' changes in config.
func applyConfigChanges(config *ocispec.ImageConfig, opts CommitOptions) {
	for _, kv := range opts.Env {
		key, _, _ := strings.Cut(kv, "=")
		config.Env = slices.DeleteFunc(config.Env, func(e string) bool {
			k, _, _ := strings.Cut(e, "=")
			return k == key
		})
		config.Env = append(config.Env, kv)
	}
	if opts.WorkingDir != "" {
		config.WorkingDir = opts.WorkingDir
	}
	if len(opts.Entrypoint) > 0 {
		config.Entrypoint = opts.Entrypoint
	}
	if len(opts.Cmd) > 0 {
		config.Cmd = opts.Cmd
	}
}

// changedBytes is the size in bytes (st_size: holes and shared extents
// count in full) of the regular files of the tree mounted by upper that
// the tree mounted by lower does not hold as they are: a file counts
// unless lower has a file of the same inode number (a btrfs snapshot keeps
// its parent's), size and modification time; hard links count once.
func changedBytes(ctx context.Context, lower, upper []mount.Mount) (uint64, error) {
	type file struct {
		size  int64
		mtime unix.Timespec
	}
	base := make(map[uint64]file)
	err := mount.WithReadonlyTempMount(ctx, lower, func(dir string) error {
		return walkRegular(ctx, dir, func(st *unix.Stat_t) {
			base[st.Ino] = file{st.Size, st.Mtim}
		})
	})
	if err != nil {
		return 0, err
	}
	var total uint64
	seen := make(map[uint64]bool)
	err = mount.WithReadonlyTempMount(ctx, upper, func(dir string) error {
		return walkRegular(ctx, dir, func(st *unix.Stat_t) {
			if seen[st.Ino] {
				return
			}
			seen[st.Ino] = true
			if f, ok := base[st.Ino]; ok && f.size == st.Size && f.mtime == st.Mtim {
				return
			}
			var ok bool
			if total, ok = bounds.Add(total, uint64(max(st.Size, 0))); !ok {
				total = math.MaxUint64
			}
		})
	})
	return total, err
}

// walkRegular calls fn with the stat of each regular file under dir (not
// following symbolic links, staying on dir's file system), until ctx ends.
func walkRegular(ctx context.Context, dir string, fn func(*unix.Stat_t)) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		fn(&st)
		return nil
	})
}
