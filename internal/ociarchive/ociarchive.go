// Package ociarchive packs a root filesystem directory into an OCI image
// archive: a tar stream of an OCI image layout (oci-layout, index.json and
// blobs/sha256/...) holding one image with a single gzip layer. It is how
// berth builds its base image offline, without a registry or a container
// engine; containerd imports the result (ctr images import, or the Go
// client's Import).
//
// The output is reproducible: the same directory tree, options and Go version
// give the same bytes and therefore the same digests. Entries are written in
// lexical order, every mtime is Options.ModTime, owners are uid/gid 0 (or
// what Options.Owners says) with no user or group names, and access/change
// times, extended attributes and sparse-file holes are not recorded.
package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// AnnotationImageName is the index annotation containerd reads to name an
// imported image (images.AnnotationImageName in containerd). containerd
// 1.6's Import names nothing without it.
const AnnotationImageName = "io.containerd.image.name"

// DefaultPath is the PATH put into the image config when Options.Env is
// empty. It is the one Docker and containerd use for Linux containers.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options describe the image written around the root filesystem.
type Options struct {
	// Ref is the image reference, "name:tag" (for example
	// "berth.dev/base:latest"). A reference without a tag gets ":latest".
	// Digest references ("name@sha256:...") are refused. Required.
	Ref string

	// Architecture and Variant are the image platform's CPU architecture and
	// variant in GOARCH terms. Architecture defaults to runtime.GOARCH;
	// Variant defaults to empty. The OS is always "linux".
	Architecture string
	Variant      string

	// Env is the image config's environment, "KEY=value" entries. Empty
	// means []string{DefaultPath}.
	Env []string

	// Entrypoint, Cmd and WorkingDir go to the image config unchanged; empty
	// means unset.
	Entrypoint []string
	Cmd        []string
	WorkingDir string

	// ModTime is the mtime of every entry, in the layer and in the outer
	// archive, and the image's "created" time. Zero means the Unix epoch,
	// with "created" left out.
	ModTime time.Time

	// Owners gives the owner of particular entries, keyed by their path
	// relative to the rootfs with forward slashes and no leading or trailing
	// slash ("home/berth"). Every other entry is owned by 0:0, whoever owns
	// it on disk. A key naming no entry is an error.
	Owners map[string]Owner

	// TempDir is where the compressed layer is staged before it is copied
	// into the archive (its size must be known first). Empty means
	// os.TempDir().
	TempDir string
}

// Owner is a numeric file owner in the layer.
type Owner struct {
	UID, GID int
}

// Write packs the directory rootfs into an OCI image archive and writes it
// to w. It returns the manifest's descriptor as recorded in index.json
// (media type, digest, size, platform and both name annotations).
//
// The layer holds every entry under rootfs except rootfs itself, with paths
// relative to it: regular files, directories, symbolic links (targets kept
// verbatim, never followed), hard links (as tar links to the first path in
// lexical order), FIFOs and character/block devices. Permission bits
// including setuid, setgid and sticky are kept; owners become 0:0 unless
// Options.Owners names the entry. A socket under rootfs is an error: tar
// cannot carry it.
//
// The archive's index.json names the manifest with both
// io.containerd.image.name (the full reference) and
// org.opencontainers.image.ref.name (the tag).
func Write(w io.Writer, rootfs string, opts Options) (ocispec.Descriptor, error) {
	name, tag, err := splitRef(opts.Ref)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	fi, err := os.Stat(rootfs)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("rootfs: %w", err)
	}
	if !fi.IsDir() {
		return ocispec.Descriptor{}, fmt.Errorf("rootfs %s: not a directory", rootfs)
	}
	mtime := opts.ModTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	mtime = mtime.UTC().Truncate(time.Second)

	tmp, err := os.CreateTemp(opts.TempDir, "ociarchive-layer-*.tar.gz")
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("stage layer: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()

	layer, diffID, err := writeLayer(tmp, rootfs, mtime, opts.Owners)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("stage layer: %w", err)
	}

	platform := ocispec.Platform{
		Architecture: opts.Architecture,
		OS:           "linux",
		Variant:      opts.Variant,
	}
	if platform.Architecture == "" {
		platform.Architecture = runtime.GOARCH
	}
	env := opts.Env
	if len(env) == 0 {
		env = []string{DefaultPath}
	}
	img := ocispec.Image{
		Platform: platform,
		Config: ocispec.ImageConfig{
			Env:        env,
			Entrypoint: opts.Entrypoint,
			Cmd:        opts.Cmd,
			WorkingDir: opts.WorkingDir,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	if !opts.ModTime.IsZero() {
		img.Created = &mtime
	}
	configJSON, configDesc, err := marshalBlob(ocispec.MediaTypeImageConfig, img)
	if err != nil {
		return ocispec.Descriptor{}, err
	}

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layer},
	}
	manifestJSON, manifestDesc, err := marshalBlob(ocispec.MediaTypeImageManifest, manifest)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	manifestDesc.Platform = &platform
	manifestDesc.Annotations = map[string]string{
		AnnotationImageName:       name + ":" + tag,
		ocispec.AnnotationRefName: tag,
	}

	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode index: %w", err)
	}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode oci-layout: %w", err)
	}

	// Blobs first and index.json last: a reader streaming the archive has
	// seen everything the index points at when it gets to it.
	out := &layoutWriter{tw: tar.NewWriter(w), mtime: mtime}
	out.dir("blobs/")
	out.dir("blobs/sha256/")
	out.file(blobPath(layer.Digest), layer.Size, tmp)
	out.file(blobPath(configDesc.Digest), configDesc.Size, bytes.NewReader(configJSON))
	out.file(blobPath(manifestDesc.Digest), manifestDesc.Size, bytes.NewReader(manifestJSON))
	out.file(ocispec.ImageLayoutFile, int64(len(layoutJSON)), bytes.NewReader(layoutJSON))
	out.file(ocispec.ImageIndexFile, int64(len(indexJSON)), bytes.NewReader(indexJSON))
	if out.err == nil {
		out.err = out.tw.Close()
	}
	if out.err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("write archive: %w", out.err)
	}
	return manifestDesc, nil
}

// namePattern and tagPattern are the repository name and tag grammars of
// the distribution reference format (github.com/distribution/reference),
// without IPv6 registry hosts.
var (
	namePattern = regexp.MustCompile(`^` +
		`(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?/)?` +
		`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)
	tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// splitRef splits "name:tag" into its parts; the tag defaults to "latest".
// A colon before the last slash belongs to a registry host's port.
func splitRef(ref string) (name, tag string, err error) {
	if ref == "" {
		return "", "", errors.New("image reference is empty")
	}
	if strings.Contains(ref, "@") {
		return "", "", fmt.Errorf("image reference %q: digest references cannot name a new image", ref)
	}
	name, tag = ref, "latest"
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		name, tag = ref[:i], ref[i+1:]
	}
	if !namePattern.MatchString(name) {
		return "", "", fmt.Errorf("image reference %q: invalid name %q", ref, name)
	}
	if !tagPattern.MatchString(tag) {
		return "", "", fmt.Errorf("image reference %q: invalid tag %q", ref, tag)
	}
	return name, tag, nil
}

// marshalBlob encodes v as JSON and describes it as a blob of mediaType.
func marshalBlob(mediaType string, v any) ([]byte, ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("encode %s: %w", mediaType, err)
	}
	return b, ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}, nil
}

func blobPath(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}

// layoutWriter writes the outer archive's entries, keeping the first error
// so that the sequence in Write reads straight.
type layoutWriter struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func (l *layoutWriter) dir(name string) {
	if l.err != nil {
		return
	}
	l.err = l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: l.mtime})
}

func (l *layoutWriter) file(name string, size int64, r io.Reader) {
	if l.err != nil {
		return
	}
	if l.err = l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: l.mtime}); l.err != nil {
		return
	}
	n, err := io.Copy(l.tw, r)
	if err == nil && n != size {
		err = fmt.Errorf("%s: copied %d bytes, want %d", name, n, size)
	}
	l.err = err
}

// writeLayer writes the gzip-compressed tar of rootfs to w. It returns the
// layer's descriptor (digest and size of the compressed bytes) and its
// diff ID (digest of the uncompressed tar).
func writeLayer(w io.Writer, rootfs string, mtime time.Time, owners map[string]Owner) (ocispec.Descriptor, digest.Digest, error) {
	compressed := &countingHash{h: sha256.New()}
	// BestCompression costs little on a base image and the result is still
	// reproducible: compress/gzip is deterministic for a given level and Go
	// version, and the gzip header carries no name or mtime here.
	zw, err := gzip.NewWriterLevel(io.MultiWriter(w, compressed), gzip.BestCompression)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	uncompressed := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(zw, uncompressed))
	if err := writeTree(tw, rootfs, mtime, owners); err != nil {
		return ocispec.Descriptor{}, "", err
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("write layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("write layer: %w", err)
	}
	desc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayerGzip,
		Digest:    digest.NewDigest(digest.SHA256, compressed.h),
		Size:      compressed.n,
	}
	return desc, digest.NewDigest(digest.SHA256, uncompressed), nil
}

type countingHash struct {
	h hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

// fileID identifies an inode, to write hard links as links.
type fileID struct{ dev, ino uint64 }

// writeTree writes a tar entry for everything under root, in lexical order
// (filepath.WalkDir sorts each directory), with owners applied.
func writeTree(tw *tar.Writer, root string, mtime time.Time, owners map[string]Owner) error {
	seen := map[fileID]string{}
	owned := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := header(path, name, fi, mtime, seen)
		if err != nil {
			return err
		}
		if o, ok := owners[name]; ok {
			hdr.Uid, hdr.Gid = o.UID, o.GID
			owned++
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write layer entry %s: %w", name, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		return copyFile(tw, path, hdr.Size)
	})
	if err != nil {
		return err
	}
	if owned != len(owners) {
		var unknown []string
		for name := range owners {
			if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(name))); err != nil || !fs.ValidPath(name) || name == "." {
				unknown = append(unknown, name)
			}
		}
		slices.Sort(unknown)
		return fmt.Errorf("owners for %q: no such entries under the rootfs (keys are relative, slash-separated paths)", unknown)
	}
	return nil
}

// header builds the tar header of one entry. seen maps inodes with more than
// one link to the first name written for them.
func header(path, name string, fi fs.FileInfo, mtime time.Time, seen map[fileID]string) (*tar.Header, error) {
	mode := fi.Mode()
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(mode.Perm()),
		ModTime: mtime,
	}
	if mode&fs.ModeSetuid != 0 {
		hdr.Mode |= unix.S_ISUID
	}
	if mode&fs.ModeSetgid != 0 {
		hdr.Mode |= unix.S_ISGID
	}
	if mode&fs.ModeSticky != 0 {
		hdr.Mode |= unix.S_ISVTX
	}
	st, _ := fi.Sys().(*syscall.Stat_t)

	switch {
	case mode.IsRegular():
		if st != nil && st.Nlink > 1 {
			id := fileID{dev: uint64(st.Dev), ino: st.Ino}
			if first, ok := seen[id]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				return hdr, nil
			}
			seen[id] = name
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size()
	case mode.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return nil, err
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
	case mode&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	case mode&fs.ModeDevice != 0:
		if st == nil {
			return nil, fmt.Errorf("layer entry %s: device without stat data", name)
		}
		hdr.Typeflag = tar.TypeBlock
		if mode&fs.ModeCharDevice != 0 {
			hdr.Typeflag = tar.TypeChar
		}
		hdr.Devmajor = int64(unix.Major(uint64(st.Rdev)))
		hdr.Devminor = int64(unix.Minor(uint64(st.Rdev)))
	default:
		return nil, fmt.Errorf("layer entry %s: unsupported file type %s", name, mode.Type())
	}
	return hdr, nil
}

// copyFile copies exactly size bytes of the file at path into tw; a file
// that changed size since it was listed is an error, not a torn entry.
func copyFile(tw *tar.Writer, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("write layer entry %s: %w", path, err)
	}
	if n != size {
		return fmt.Errorf("write layer entry %s: file shrank from %d to %d bytes while packing", path, size, n)
	}
	return nil
}
