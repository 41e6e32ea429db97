package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	legacytarball "github.com/google/go-containerregistry/pkg/legacy/tarball"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berth-sandbox/berth/internal/rootfsimage"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// baseRootFS returns the base image's root filesystem directory, which
// scripts/base-image.sh leaves next to the archive.
func baseRootFS(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(filepath.Dir(os.Getenv("BERTH_TEST_IMAGE")), "rootfs")
	if _, err := os.Stat(filepath.Join(dir, "bin", "busybox")); err != nil {
		t.Fatalf("the base root filesystem (scripts/base-image.sh): %v", err)
	}
	return dir
}

// importAndRun imports with berth image import ARGS, creates a sandbox of
// ref and runs cmd in it; it returns cmd's stdout.
func importAndRun(t *testing.T, stdin []byte, ref, cmd string, args ...string) string {
	t.Helper()
	out, errOut, code := berthCLI(t, stdin, append([]string{"image", "import"}, args...)...)
	if code != 0 || !strings.HasPrefix(out, ref+" sha256:") || strings.Count(out, "\n") != 1 {
		t.Fatalf("berth image import %q: exit %d, stdout %q, stderr %q; want %s imported, once", args, code, out, errOut, ref)
	}
	t.Cleanup(func() { berthCLI(t, nil, "image", "rm", ref) })
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref})
	r := runSh(t, sb.GetId(), cmd)
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("%q in a sandbox of %s: exit %d: %s", cmd, ref, r.GetResult().GetExitCode(), r.GetStderr())
	}
	return string(r.GetStdout())
}

// TestImageImportKinds imports what users have: docker save archives of
// both formats (written with go-containerregistry), a root filesystem
// directory and a root filesystem tar from standard input; owners and
// modes of the tree come through.
func TestImageImportKinds(t *testing.T) {
	need(t)
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", baseRootFS(t), root).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	os.Chown(filepath.Join(root, "home/berth"), 1000, 1000)
	os.WriteFile(filepath.Join(root, "etc/secret"), []byte("s"), 0o640)
	os.Chown(filepath.Join(root, "etc/secret"), 0, 42)
	os.Chmod(filepath.Join(root, "home/berth"), 0o700)
	// A second hard link of a file (Debian has many: perl, git): in the
	// sandbox's user namespace the image is chowned into its id range, each
	// inode once, and a setgid bit survives the chown.
	if err := os.Link(filepath.Join(root, "etc/secret"), filepath.Join(root, "etc/secret-link")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "bin/setgid"), []byte("#!/bin/sh\n"), 0o755)
	os.Chown(filepath.Join(root, "bin/setgid"), 0, 42)
	os.Chmod(filepath.Join(root, "bin/setgid"), os.ModeSetgid|0o755)
	const show = "stat -c '%u:%g %a %n' /home/berth /etc/secret /etc/secret-link /bin/setgid; [ /etc/secret -ef /etc/secret-link ] && echo one inode"
	const want = "1000:1000 700 /home/berth\n0:42 640 /etc/secret\n0:42 640 /etc/secret-link\n0:42 2755 /bin/setgid\none inode\n"

	// A root filesystem directory, with one command.
	if got := importAndRun(t, nil, "test.berth.dev/rootfs-dir:1", show, "--name", "test.berth.dev/rootfs-dir:1", root); got != want {
		t.Errorf("from a directory: %q, want %q", got, want)
	}
	// A root filesystem tar, gzip-compressed, from standard input.
	tgz, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cz", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := importAndRun(t, tgz, "test.berth.dev/rootfs-tar:1", show, "--name", "test.berth.dev/rootfs-tar:1", "-"); got != want {
		t.Errorf("from a tar: %q, want %q", got, want)
	}
	// docker save's formats, named by the archive.
	img, err := rootfsimage.FromDir(root, rootfsimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	for _, tc := range []struct {
		ref   string
		write func(name.Tag, *bytes.Buffer) error
	}{
		{"test.berth.dev/docker-save:1", func(tag name.Tag, b *bytes.Buffer) error { return tarball.Write(tag, img, b) }},
		{"test.berth.dev/docker-save-legacy:1", func(tag name.Tag, b *bytes.Buffer) error { return legacytarball.Write(tag, img, b) }},
	} {
		tag, err := name.NewTag(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := tc.write(tag, &buf); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "image.tar")
		os.WriteFile(file, buf.Bytes(), 0o644)
		if got := importAndRun(t, nil, tc.ref, show, file); got != want {
			t.Errorf("%s: %q, want %q", tc.ref, got, want)
		}
	}
	// A root filesystem needs a name.
	if _, errOut, code := berthCLI(t, nil, "image", "import", root); code == 0 || !strings.Contains(errOut, "give --name") {
		t.Errorf("import of a root filesystem without --name: exit %d, %q", code, errOut)
	}
}
