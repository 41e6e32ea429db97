package rootfsimage_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berth-sandbox/berth/internal/rootfsimage"
)

func archive(t *testing.T, gz bool, names ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var zw *gzip.Writer
	tw := tar.NewWriter(&buf)
	if gz {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	}
	for _, n := range names {
		hdr := &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}
		if strings.HasSuffix(n, "/") {
			hdr.Typeflag, hdr.Size = tar.TypeDir, 0
		}
		tw.WriteHeader(hdr)
		tw.Write([]byte("abc")[:hdr.Size])
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func TestSniff(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tt := range []struct {
		name  string
		names []string
		want  rootfsimage.Kind
	}{
		{"OCI layout", []string{"blobs/", "blobs/sha256/", "blobs/sha256/" + hex, "index.json", "oci-layout"}, rootfsimage.KindImage},
		{"OCI layout, index first", []string{"oci-layout", "index.json"}, rootfsimage.KindImage},
		{"docker save (legacy)", []string{hex + "/", hex + "/VERSION", hex + "/layer.tar", hex + ".json", "manifest.json", "repositories"}, rootfsimage.KindImage},
		{"docker load format", []string{"sha256:" + hex, hex + ".tar.gz", "manifest.json"}, rootfsimage.KindImage},
		{"root filesystem", []string{"./", "./bin/", "./bin/sh", "./etc/", "./etc/passwd"}, rootfsimage.KindRootFS},
		{"root filesystem without ./", []string{"bin/", "etc/os-release", "usr/"}, rootfsimage.KindRootFS},
	} {
		for _, gz := range []bool{false, true} {
			got, err := rootfsimage.Sniff(bufio.NewReader(bytes.NewReader(archive(t, gz, tt.names...))))
			if err != nil || got != tt.want {
				t.Errorf("%s (gzip %v): Sniff = %v, %v; want %v", tt.name, gz, got, err, tt.want)
			}
		}
	}
	if _, err := rootfsimage.Sniff(bufio.NewReader(strings.NewReader(strings.Repeat("not a tar ", 200)))); err == nil {
		t.Errorf("Sniff of garbage succeeded")
	}
}

// TestFromDir makes an image of a small tree: its one layer's digests
// match its content, the layer holds the tree, and the config has PATH
// and the command.
func TestFromDir(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc", "os-release"), []byte("ID=test\n"), 0o644)
	os.Symlink("/usr/bin/python3", filepath.Join(dir, "python"))
	img, err := rootfsimage.FromDir(dir, rootfsimage.Options{Cmd: []string{"/bin/bash"}})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("Layers = %v, %v; want one", layers, err)
	}
	check := func(what string, want v1.Hash, open func() (io.ReadCloser, error)) []byte {
		rc, err := open()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		if got, _, _ := v1.SHA256(bytes.NewReader(b)); got != want {
			t.Errorf("%s digest %v, content has %v", what, want, got)
		}
		return b
	}
	digest, _ := layers[0].Digest()
	diffID, _ := layers[0].DiffID()
	check("compressed", digest, layers[0].Compressed)
	raw := check("uncompressed", diffID, layers[0].Uncompressed)
	var names []string
	tr := tar.NewReader(bytes.NewReader(raw))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name+" "+h.Linkname)
	}
	if want := []string{"etc/ ", "etc/os-release ", "python /usr/bin/python3"}; strings.Join(names, "|") != strings.Join(want, "|") {
		t.Errorf("layer holds %q, want %q", names, want)
	}
	cfg, err := img.ConfigFile()
	if err != nil || cfg.OS != "linux" || strings.Join(cfg.Config.Env, " ") != rootfsimage.DefaultPath || strings.Join(cfg.Config.Cmd, " ") != "/bin/bash" || len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != diffID {
		t.Errorf("config = %+v, %v", cfg, err)
	}
	var buf bytes.Buffer
	if err := rootfsimage.Write(&buf, img); err != nil {
		t.Fatal(err)
	}
	if kind, err := rootfsimage.Sniff(bufio.NewReader(&buf)); err != nil || kind != rootfsimage.KindImage {
		t.Errorf("Sniff of the written archive = %v, %v; want an image", kind, err)
	}
}
