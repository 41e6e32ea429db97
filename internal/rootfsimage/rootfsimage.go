// Package rootfsimage makes an image out of a root filesystem — a
// directory, or a tar archive of one, as debootstrap, mkosi, buildroot or
// `docker export` leave them — and tells such an archive from an image
// archive. The image has one layer that holds the tree as it is (numeric
// owners, modes, mtimes, hard links, symlinks, FIFOs, device nodes) and a
// config with the usual PATH; it is built and written with
// go-containerregistry, as a docker-archive ("docker load" format), which
// containerd imports. berth image import uses it.
package rootfsimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berth-sandbox/berth/internal/tartree"
)

// DefaultPath is the PATH of the image's config: the one Docker and
// containerd use for Linux containers.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Kind is what an archive holds.
type Kind int

const (
	// KindRootFS is a tar archive of a root filesystem.
	KindRootFS Kind = iota
	// KindImage is an image archive: an OCI image layout, or what docker
	// save writes (with or without an OCI layout).
	KindImage
)

// sniffBytes is how much of a stream Sniff looks at.
const sniffBytes = 1 << 20

// blobName matches the top-level names of image archives that are not
// fixed: docker save's layer directories and config files ("<hex>/",
// "<hex>.json"), and the blobs of "docker load" archives
// ("sha256:<hex>", "<hex>.tar.gz").
var blobName = regexp.MustCompile(`^(sha256:)?[0-9a-f]{64}(\.json|\.tar|\.tar\.gz)?(/|$)`)

// Sniff tells an image archive from a root filesystem archive by the
// names of the entries in the first MiB of r (gzip-compressed or not),
// without consuming them: an image archive has oci-layout, index.json,
// manifest.json, repositories, blobs/, or names of blobs by their digest
// (docker's layer directories and configs) at its top; anything else is a
// root filesystem. A stream
// that is not a tar archive at all fails.
func Sniff(r *bufio.Reader) (Kind, error) {
	head, err := r.Peek(sniffBytes)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return 0, err
	}
	var in io.Reader = bytes.NewReader(head)
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(in)
		if err != nil {
			return 0, fmt.Errorf("gzip: %w", err)
		}
		in = zr
	}
	tr := tar.NewReader(in)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err != nil {
			if n == 0 && !errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, fmt.Errorf("not a tar archive: %w", err)
			}
			return KindRootFS, nil // the sniffed part ended
		}
		name := strings.TrimPrefix(path.Clean(hdr.Name), "./")
		switch {
		case name == "oci-layout", name == "index.json", name == "manifest.json", name == "repositories",
			name == "blobs", strings.HasPrefix(name, "blobs/"), blobName.MatchString(name):
			return KindImage, nil
		}
	}
}

// IsLayoutDir reports whether dir is an OCI image layout (it holds an
// oci-layout file) rather than a root filesystem.
func IsLayoutDir(dir string) bool {
	fi, err := os.Stat(path.Join(dir, "oci-layout"))
	return err == nil && fi.Mode().IsRegular()
}

// Options describe the image around the root filesystem.
type Options struct {
	// Cmd is the image's default command. Default ["/bin/sh"].
	Cmd []string
	// TempDir is where the compressed layer is staged. Default
	// os.TempDir().
	TempDir string
	// Skip is called for each file of a directory that a layer cannot
	// hold (a unix socket); nil passes them over.
	Skip func(path, why string)
}

// Image is an image made from a root filesystem, its layer staged in a
// temporary file until Close.
type Image struct {
	v1.Image
	layerFile string
}

// Close removes the staged layer.
func (img *Image) Close() error { return os.Remove(img.layerFile) }

// FromDir makes an image of the directory dir: every entry under it, as
// it is on disk, read with internal/tartree (so files the caller may not
// read fail the build: run it as root for a system tree).
func FromDir(dir string, opts Options) (*Image, error) {
	return build(opts, func(w io.Writer) error {
		tw := tartree.NewWriter(w)
		walk := tartree.WalkOptions{}
		if opts.Skip != nil {
			walk.Skip = func(e *tartree.Entry, why string) { opts.Skip(e.Path, why) }
		}
		err := tartree.Walk(dir, walk, func(e *tartree.Entry) error {
			_, err := tw.Add(e)
			return err
		})
		if err != nil {
			return err
		}
		return tw.Close()
	})
}

// FromTar makes an image whose layer is the tar archive r yields
// (gzip-compressed or not), entries as they are.
func FromTar(r io.Reader, opts Options) (*Image, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	return build(opts, func(w io.Writer) error {
		_, err := io.Copy(w, r)
		return err
	})
}

// build stages the layer that write produces, gzip-compressed (fastest
// level: an import is local, time counts more than bytes), hashing it on
// the way, and makes the image around it.
func build(opts Options, write func(io.Writer) error) (*Image, error) {
	f, err := os.CreateTemp(opts.TempDir, "berth-layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	img := &Image{layerFile: f.Name()}
	fail := func(err error) (*Image, error) {
		f.Close()
		img.Close()
		return nil, err
	}
	compressed, uncompressed := sha256.New(), sha256.New()
	counter := &countWriter{w: io.MultiWriter(f, compressed)}
	zw, err := gzip.NewWriterLevel(counter, gzip.BestSpeed)
	if err != nil {
		return fail(err)
	}
	if err := write(io.MultiWriter(zw, uncompressed)); err != nil {
		return fail(err)
	}
	if err := zw.Close(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	layer, err := partial.CompressedToLayer(&stagedLayer{
		path:   img.layerFile,
		size:   counter.n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(compressed.Sum(nil))},
		diffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(uncompressed.Sum(nil))},
	})
	if err != nil {
		return fail(err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	image, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
	if err != nil {
		return fail(err)
	}
	cfg, err := image.ConfigFile()
	if err != nil {
		return fail(err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Created = v1.Time{Time: time.Now().UTC().Truncate(time.Second)}
	cfg.Config.Env = []string{DefaultPath}
	cfg.Config.Cmd = opts.Cmd
	if len(cfg.Config.Cmd) == 0 {
		cfg.Config.Cmd = []string{"/bin/sh"}
	}
	if img.Image, err = mutate.ConfigFile(image, cfg); err != nil {
		return fail(err)
	}
	return img, nil
}

// stagedLayer is a gzip-compressed layer in a file, whose digests were
// computed while it was written (partial.CompressedLayer and
// partial.WithDiffID: go-containerregistry then reads it only to copy it).
type stagedLayer struct {
	path           string
	size           int64
	digest, diffID v1.Hash
}

func (l *stagedLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *stagedLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *stagedLayer) Size() (int64, error)                { return l.size, nil }
func (l *stagedLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *stagedLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Write writes img as a docker-archive ("docker load" format) that names
// no image: the importer names it (ImportImage's name). go-containerregistry
// would otherwise hold the name to docker's rules, stricter than
// containerd's.
func Write(w io.Writer, img v1.Image) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	ref, err := name.NewDigest("berth.dev/rootfs@" + digest.String())
	if err != nil {
		return err
	}
	return tarball.Write(ref, img, w)
}
