package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// makeRootfs builds a small tree with every kind of entry Write supports.
// Modes are set with chmod so the umask does not matter.
func makeRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	mkdir := func(name string, mode os.FileMode) {
		p := filepath.Join(root, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	file := func(name, content string, mode os.FileMode) {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mkdir("bin", 0o755)
	mkdir("etc", 0o755)
	mkdir("tmp", 0o777|os.ModeSticky)
	mkdir("workspace", 0o755)
	file("bin/busybox", "#!busybox\n", 0o755)
	file("bin/su", "setuid\n", 0o755|os.ModeSetuid)
	file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
	file("etc/shadow", "root:*:1::::::\n", 0o600)
	for name, target := range map[string]string{
		"bin/sh":       "busybox",
		"bin/ls":       "/bin/busybox",
		"etc/dangling": "../nowhere",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "bin/busybox"), filepath.Join(root, "bin/zz-hardlink")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "tmp/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// archive is an unpacked OCI archive: the outer tar's regular files by name.
type archive struct {
	files map[string][]byte
	order []string
}

func readArchive(t *testing.T, b []byte) archive {
	t.Helper()
	a := archive{files: map[string][]byte{}}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		a.order = append(a.order, hdr.Name)
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("archive entry %s owned by %d:%d, want 0:0", hdr.Name, hdr.Uid, hdr.Gid)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read archive entry %s: %v", hdr.Name, err)
		}
		a.files[hdr.Name] = data
	}
	return a
}

// blob returns the blob desc points at after checking its digest and size,
// and decodes it into v when v is not nil.
func (a archive) blob(t *testing.T, desc ocispec.Descriptor, v any) []byte {
	t.Helper()
	if err := desc.Digest.Validate(); err != nil {
		t.Fatalf("descriptor digest %q: %v", desc.Digest, err)
	}
	name := "blobs/sha256/" + desc.Digest.Encoded()
	data, ok := a.files[name]
	if !ok {
		t.Fatalf("blob %s (%s) missing from archive; entries: %v", name, desc.MediaType, a.order)
	}
	if got := digest.FromBytes(data); got != desc.Digest {
		t.Errorf("blob %s has digest %s", desc.Digest, got)
	}
	if got := int64(len(data)); got != desc.Size {
		t.Errorf("blob %s is %d bytes, descriptor says %d", desc.Digest, got, desc.Size)
	}
	if v != nil {
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("decode blob %s: %v", desc.Digest, err)
		}
	}
	return data
}

// layerEntry is what the test checks of each layer tar entry.
type layerEntry struct {
	Name     string
	Type     byte
	Mode     int64
	Linkname string
	Content  string
}

func TestWrite(t *testing.T) {
	root := makeRootfs(t)
	var buf bytes.Buffer
	got, err := Write(&buf, root, Options{Ref: "berth.dev/base:latest", Cmd: []string{"/bin/sh"}})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	a := readArchive(t, buf.Bytes())

	if got, want := string(a.files["oci-layout"]), `{"imageLayoutVersion":"1.0.0"}`; got != want {
		t.Errorf("oci-layout = %s, want %s", got, want)
	}

	var index ocispec.Index
	if err := json.Unmarshal(a.files["index.json"], &index); err != nil {
		t.Fatalf("decode index.json: %v", err)
	}
	if index.SchemaVersion != 2 || index.MediaType != ocispec.MediaTypeImageIndex {
		t.Errorf("index schemaVersion %d mediaType %q, want 2 %q", index.SchemaVersion, index.MediaType, ocispec.MediaTypeImageIndex)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	md := index.Manifests[0]
	if diff := cmp.Diff(md, got); diff != "" {
		t.Errorf("Write returned a descriptor other than index.json's (-index +returned):\n%s", diff)
	}
	wantAnnotations := map[string]string{
		"io.containerd.image.name":          "berth.dev/base:latest",
		"org.opencontainers.image.ref.name": "latest",
	}
	if diff := cmp.Diff(md.Annotations, wantAnnotations); diff != "" {
		t.Errorf("manifest annotations (-got +want):\n%s", diff)
	}
	if md.MediaType != ocispec.MediaTypeImageManifest {
		t.Errorf("manifest descriptor media type %q, want %q", md.MediaType, ocispec.MediaTypeImageManifest)
	}
	if md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != runtime.GOARCH {
		t.Errorf("manifest descriptor platform %+v, want linux/%s", md.Platform, runtime.GOARCH)
	}

	var manifest ocispec.Manifest
	a.blob(t, md, &manifest)
	if manifest.SchemaVersion != 2 || manifest.MediaType != ocispec.MediaTypeImageManifest {
		t.Errorf("manifest schemaVersion %d mediaType %q", manifest.SchemaVersion, manifest.MediaType)
	}
	if manifest.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("config media type %q, want %q", manifest.Config.MediaType, ocispec.MediaTypeImageConfig)
	}
	if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip {
		t.Fatalf("manifest layers %+v, want one %s", manifest.Layers, ocispec.MediaTypeImageLayerGzip)
	}

	var config ocispec.Image
	a.blob(t, manifest.Config, &config)
	if config.OS != "linux" || config.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s, want linux/%s", config.OS, config.Architecture, runtime.GOARCH)
	}
	if diff := cmp.Diff(config.Config.Env, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}); diff != "" {
		t.Errorf("config env (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(config.Config.Cmd, []string{"/bin/sh"}); diff != "" {
		t.Errorf("config cmd (-got +want):\n%s", diff)
	}
	if config.Created != nil {
		t.Errorf("config created = %v, want unset with a zero ModTime", config.Created)
	}
	if config.RootFS.Type != "layers" || len(config.RootFS.DiffIDs) != 1 {
		t.Fatalf("config rootfs %+v, want one layer", config.RootFS)
	}

	gz := a.blob(t, manifest.Layers[0], nil)
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	layerTar, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip layer: %v", err)
	}
	if got, want := digest.FromBytes(layerTar), config.RootFS.DiffIDs[0]; got != want {
		t.Errorf("uncompressed layer digest %s, config diff_id %s", got, want)
	}

	var entries []layerEntry
	tr := tar.NewReader(bytes.NewReader(layerTar))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("layer entry %s owner %d:%d (%q:%q), want 0:0 unnamed", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname)
		}
		if !hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("layer entry %s mtime %v, want the Unix epoch", hdr.Name, hdr.ModTime)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read layer entry %s: %v", hdr.Name, err)
		}
		entries = append(entries, layerEntry{hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Linkname, string(content)})
	}
	want := []layerEntry{
		{"bin/", tar.TypeDir, 0o755, "", ""},
		{"bin/busybox", tar.TypeReg, 0o755, "", "#!busybox\n"},
		{"bin/ls", tar.TypeSymlink, 0o777, "/bin/busybox", ""},
		{"bin/sh", tar.TypeSymlink, 0o777, "busybox", ""},
		{"bin/su", tar.TypeReg, 0o4755, "", "setuid\n"},
		{"bin/zz-hardlink", tar.TypeLink, 0o755, "bin/busybox", ""},
		{"etc/", tar.TypeDir, 0o755, "", ""},
		{"etc/dangling", tar.TypeSymlink, 0o777, "../nowhere", ""},
		{"etc/passwd", tar.TypeReg, 0o644, "", "root:x:0:0:root:/root:/bin/sh\n"},
		{"etc/shadow", tar.TypeReg, 0o600, "", "root:*:1::::::\n"},
		{"tmp/", tar.TypeDir, 0o1777, "", ""},
		{"tmp/fifo", tar.TypeFifo, 0o600, "", ""},
		{"workspace/", tar.TypeDir, 0o755, "", ""},
	}
	if diff := cmp.Diff(entries, want); diff != "" {
		t.Errorf("layer entries (-got +want):\n%s", diff)
	}
}

func TestWriteDeterministic(t *testing.T) {
	root := makeRootfs(t)
	write := func() []byte {
		t.Helper()
		var buf bytes.Buffer
		if _, err := Write(&buf, root, Options{Ref: "berth.dev/base:latest"}); err != nil {
			t.Fatalf("Write: %v", err)
		}
		return buf.Bytes()
	}
	first := write()
	if second := write(); !bytes.Equal(first, second) {
		t.Fatal("two archives of the same rootfs differ")
	}

	// Rebuilding a rootfs gives new mtimes; they must not change the image.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(root, "etc/passwd"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(root, "bin"), later, later); err != nil {
		t.Fatal(err)
	}
	if again := write(); !bytes.Equal(first, again) {
		t.Error("archive changed when only mtimes changed")
	}

	// A content change must change it.
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed := write(); bytes.Equal(first, changed) {
		t.Error("archive unchanged after a file's content changed")
	}
}

func TestWriteOptions(t *testing.T) {
	root := makeRootfs(t)
	created := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var buf bytes.Buffer
	desc, err := Write(&buf, root, Options{
		Ref:          "localhost:5000/team/img",
		Architecture: "arm64",
		Variant:      "v8",
		Env:          []string{"PATH=/bin", "LANG=C.UTF-8"},
		WorkingDir:   "/workspace",
		ModTime:      created,
		Owners:       map[string]Owner{"workspace": {UID: 1000, GID: 1001}, "bin/su": {UID: 0, GID: 42}},
		TempDir:      t.TempDir(),
	})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	wantAnnotations := map[string]string{
		"io.containerd.image.name":          "localhost:5000/team/img:latest",
		"org.opencontainers.image.ref.name": "latest",
	}
	if diff := cmp.Diff(desc.Annotations, wantAnnotations); diff != "" {
		t.Errorf("annotations (-got +want):\n%s", diff)
	}
	a := readArchive(t, buf.Bytes())
	var manifest ocispec.Manifest
	a.blob(t, desc, &manifest)
	var config ocispec.Image
	a.blob(t, manifest.Config, &config)
	if config.Architecture != "arm64" || config.Variant != "v8" {
		t.Errorf("config platform %s/%s, want arm64/v8", config.Architecture, config.Variant)
	}
	if diff := cmp.Diff(config.Config.Env, []string{"PATH=/bin", "LANG=C.UTF-8"}); diff != "" {
		t.Errorf("config env (-got +want):\n%s", diff)
	}
	if config.Config.WorkingDir != "/workspace" {
		t.Errorf("config working dir %q, want /workspace", config.Config.WorkingDir)
	}
	if config.Created == nil || !config.Created.Equal(created) {
		t.Errorf("config created %v, want %v", config.Created, created)
	}

	zr, err := gzip.NewReader(bytes.NewReader(a.blob(t, manifest.Layers[0], nil)))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	owners := map[string][2]int{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		if !hdr.ModTime.Equal(created) {
			t.Errorf("layer entry %s mtime %v, want %v", hdr.Name, hdr.ModTime, created)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			owners[hdr.Name] = [2]int{hdr.Uid, hdr.Gid}
		}
	}
	if diff := cmp.Diff(owners, map[string][2]int{"workspace/": {1000, 1001}, "bin/su": {0, 42}}); diff != "" {
		t.Errorf("entries not owned by 0:0 (-got +want):\n%s", diff)
	}
}

func TestSplitRef(t *testing.T) {
	tests := []struct {
		ref, name, tag string
		wantErr        bool
	}{
		{ref: "berth.dev/base:latest", name: "berth.dev/base", tag: "latest"},
		{ref: "berth.dev/base", name: "berth.dev/base", tag: "latest"},
		{ref: "busybox:1.36", name: "busybox", tag: "1.36"},
		{ref: "localhost:5000/a/b", name: "localhost:5000/a/b", tag: "latest"},
		{ref: "localhost:5000/a/b:v1", name: "localhost:5000/a/b", tag: "v1"},
		{ref: "", wantErr: true},
		{ref: "berth.dev/base@sha256:" + strings.Repeat("0", 64), wantErr: true},
		{ref: "berth.dev/base:", wantErr: true},
		{ref: "berth.dev/base:bad/tag", wantErr: true},
		{ref: ":latest", wantErr: true},
		{ref: "berth dev/base", wantErr: true},
		{ref: "berth.dev/Base:latest", wantErr: true},
		{ref: "berth.dev/base/:latest", wantErr: true},
		{ref: "Berth.dev/base:latest", name: "Berth.dev/base", tag: "latest"},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			name, tag, err := splitRef(tt.ref)
			if tt.wantErr {
				if err == nil {
					t.Errorf("splitRef(%q) = %q, %q, want an error", tt.ref, name, tag)
				}
				return
			}
			if err != nil || name != tt.name || tag != tt.tag {
				t.Errorf("splitRef(%q) = %q, %q, %v, want %q, %q, nil", tt.ref, name, tag, err, tt.name, tt.tag)
			}
		})
	}
}

func TestWriteErrors(t *testing.T) {
	withSocket := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(withSocket, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	rootfs := makeRootfs(t)

	tests := []struct {
		name   string
		rootfs string
		ref    string
		owners map[string]Owner
		is     error
	}{
		{name: "missing rootfs", rootfs: filepath.Join(t.TempDir(), "nope"), ref: "a:b", is: os.ErrNotExist},
		{name: "rootfs is a file", rootfs: notDir, ref: "a:b"},
		{name: "socket in rootfs", rootfs: withSocket, ref: "a:b"},
		{name: "no reference", rootfs: rootfs, ref: ""},
		{name: "owner of a missing entry", rootfs: rootfs, ref: "a:b", owners: map[string]Owner{"home/berth": {}}},
		{name: "owner key with a slash", rootfs: rootfs, ref: "a:b", owners: map[string]Owner{"/workspace": {}}},
		{name: "owner key with a trailing slash", rootfs: rootfs, ref: "a:b", owners: map[string]Owner{"workspace/": {}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, tt.rootfs, Options{Ref: tt.ref, Owners: tt.owners})
			if err == nil {
				t.Fatalf("Write(%s) succeeded, want an error", tt.rootfs)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Write(%s) = %v, want an error wrapping %v", tt.rootfs, err, tt.is)
			}
		})
	}
}

// BenchmarkWrite packs a 4 MiB rootfs (like the base image: two static
// binaries and a few hundred symlinks).
func BenchmarkWrite(b *testing.B) {
	root := b.TempDir()
	bin := filepath.Join(root, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 2<<20)
	for i := range data {
		data[i] = byte(i * 7 / 5) // compressible, not trivially
	}
	for _, name := range []string{"busybox", "bash"} {
		if err := os.WriteFile(filepath.Join(bin, name), data, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 300 {
		if err := os.Symlink("busybox", filepath.Join(bin, "applet"+strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(2 * len(data)))
	for b.Loop() {
		if _, err := Write(io.Discard, root, Options{Ref: "berth.dev/bench:latest"}); err != nil {
			b.Fatal(err)
		}
	}
}
