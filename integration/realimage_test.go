package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rootfsimage"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// bigTreeDirs × bigTreeFiles files make the real-image tree's size: with
// the base image's, more than 12,000 inodes, as a Debian image with
// python3 and git has (14,477).
const (
	bigTreeDirs  = 120
	bigTreeFiles = 100
)

// bigImageTree writes, once per test binary, a root file system of the
// size of a real image: the base image's, plus bigTreeDirs directories of
// bigTreeFiles files each where every tenth file is a hard link of the
// one before, every tenth a symlink, and a setuid file, a setgid file, a
// group-readable /etc/shadow, a device node and a home owned by uid 1000,
// as a Debian image has them. It returns the tree's path, under the
// tests' temporary directory.
var bigImageTree = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp(env.dir, "bigimage-")
	if err != nil {
		return "", err
	}
	root := filepath.Join(dir, "root")
	base := filepath.Join(filepath.Dir(archivePath()), "rootfs")
	if out, err := exec.Command("cp", "-a", base, root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cp -a %s: %v: %s", base, err, out)
	}
	for d := range bigTreeDirs {
		sub := filepath.Join(root, "usr/share/big", fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return "", err
		}
		for f := range bigTreeFiles {
			p := filepath.Join(sub, fmt.Sprintf("f%03d", f))
			switch {
			case f%10 == 1:
				err = os.Link(filepath.Join(sub, fmt.Sprintf("f%03d", f-1)), p)
			case f%10 == 2:
				err = os.Symlink(fmt.Sprintf("f%03d", f-2), p)
			default:
				err = os.WriteFile(p, []byte(p), 0o644)
			}
			if err != nil {
				return "", err
			}
		}
	}
	files := []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{
		{"etc/shadow", 0, 42, 0o640},
		{"usr/bin/passwd-like", 0, 0, os.ModeSetuid | 0o755},
		{"usr/bin/chage-like", 0, 42, os.ModeSetgid | 0o755},
	}
	for _, f := range files {
		p := filepath.Join(root, f.path)
		if err := os.WriteFile(p, []byte("x\n"), 0o600); err != nil {
			return "", err
		}
		if err := os.Chown(p, f.uid, f.gid); err != nil {
			return "", err
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return "", err
		}
	}
	// A device node, as images ship /dev entries.
	if err := unix.Mknod(filepath.Join(root, "usr/share/big/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return "", err
	}
	if err := os.Chown(filepath.Join(root, "home/berth"), 1000, 1000); err != nil {
		return "", err
	}
	if err := os.Chmod(filepath.Join(root, "home/berth"), 0o755); err != nil {
		return "", err
	}
	return root, nil
})

// bigImageArchive is bigImageTree as a docker-save archive naming ref.
func bigImageArchive(t *testing.T, ref string) []byte {
	t.Helper()
	root, err := bigImageTree()
	if err != nil {
		t.Fatalf("real-image tree: %v", err)
	}
	img, err := rootfsimage.FromDir(root, rootfsimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestRealImageCreate creates sandboxes, each in a user namespace of its
// own, from an image of the size of a real one (bigImageTree) with the
// btrfs and the overlayfs snapshotter: each create maps ids at mount time
// (ROOT_ID_MAPPING_IDMAPPED) instead of copying the image, so it takes
// about the time of the 2 MiB base image (at most twice, medians of
// several) and less than 1 MiB of new disk; the workload sees the image's
// owners, modes and hard links as the image has them, and the host sees
// what the workload writes under the ids that RootIDMapping documents.
func TestRealImageCreate(t *testing.T) {
	need(t)
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) { testRealImageCreate(t, snapshotter) })
	}
}

func testRealImageCreate(t *testing.T, snapshotter string) {
	e := newInProcessEnvWith(t, "real-"+snapshotter[:2], server.Config{TaskRestartLimit: -1}, func(c *runtime.Config) { c.Snapshotter = snapshotter }, nil)
	const ref = "test.berth.dev/real-image:1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.rt.ImportImage(ctx, bytes.NewReader(bigImageArchive(t, ref)), ""); err != nil {
		t.Fatalf("import the real-image tree: %v", err)
	}

	// create creates a sandbox of image and runs `true` in it; it returns
	// the time from the create to the exec's end.
	create := func(image string) (*berthv1.Sandbox, time.Duration) {
		t.Helper()
		start := time.Now()
		sb := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{Image: image})
		r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
		if err != nil || r.GetResult().GetExitCode() != 0 {
			t.Fatalf("Run(true) in a sandbox of %s: %v, exit %d", image, err, r.GetResult().GetExitCode())
		}
		if got := sb.GetRootIdMapping(); got != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
			t.Errorf("sandbox of %s with %s: root_id_mapping %v, want IDMAPPED", image, snapshotter, got)
		}
		return sb, time.Since(start)
	}
	// The first create of each image unpacks nothing (the import did);
	// one of each first all the same, so that both are equally warm.
	create(baseImage)
	create(ref)
	const rounds = 5
	var base, big []time.Duration
	for range rounds {
		_, d := create(baseImage)
		base = append(base, d)
		_, d = create(ref)
		big = append(big, d)
	}
	slices.Sort(base)
	slices.Sort(big)
	t.Logf("%s: create to first exec, median of %d: base image %v, real-image tree %v", snapshotter, rounds, base[rounds/2], big[rounds/2])
	if big[rounds/2] > 2*base[rounds/2] {
		t.Errorf("%s: create to first exec of the real-image tree takes %v (median), more than twice the base image's %v", snapshotter, big[rounds/2], base[rounds/2])
	}

	// 20 concurrent creates under the default flags all succeed.
	const concurrent = 20
	errs := make(chan error, concurrent)
	for range concurrent {
		go func() {
			resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: ref})
			if err == nil {
				_, err = e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
			}
			errs <- err
		}()
	}
	for range concurrent {
		if err := <-errs; err != nil {
			t.Errorf("%s: one of %d concurrent creates of the real-image tree: %v", snapshotter, concurrent, err)
		}
	}

	// New disk per sandbox, before the workload writes.
	fsRoot := snapshotterRoot(t, snapshotter)
	const n = 3
	before := diskUsed(t, fsRoot)
	var sbs []*berthv1.Sandbox
	for range n {
		sb, _ := create(ref)
		sbs = append(sbs, sb)
	}
	if grown := int64(diskUsed(t, fsRoot)) - int64(before); grown > n<<20 {
		t.Errorf("%s: %d sandboxes of the real-image tree took %d bytes of new disk, more than 1 MiB each", snapshotter, n, grown)
	}

	// What the workload sees: the image's owners, modes and links.
	sb := sbs[0]
	checkImageOwners(t, e.sandboxes, sb.GetId())

	// What the host sees of what the workload wrote: under the image's own
	// ids on btrfs (the snapshot is idmapped), under the range's on
	// overlayfs (the upper layer is not).
	// containerd's garbage collector, run now, keeps the snapshot, which
	// no snapshot key of the container names (a label refers to it).
	collectGarbage(t, e.ns)
	upper := snapshotDir(t, e.ns, snapshotter, sb.GetId())
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "root-file"), &st); err != nil {
		t.Fatalf("%s: the file the workload wrote, on the host: %v", snapshotter, err)
	}
	wantUID := uint32(0)
	if snapshotter == "overlayfs" {
		wantUID += sb.GetHostIdBase()
	}
	if st.Uid != wantUID || st.Gid != wantUID {
		t.Errorf("%s: the host sees the workload's /root-file owned by %d:%d, want %d:%d", snapshotter, st.Uid, st.Gid, wantUID, wantUID)
	}
	// The image is untouched: another sandbox reads the file the first
	// overwrote as the image has it.
	r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sbs[1].GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/usr/share/big/d007/f005"}}})
	if err != nil || !strings.HasSuffix(string(r.GetStdout()), "d007/f005") {
		t.Errorf("%s: another sandbox reads %q (%v), want the image's content", snapshotter, r.GetStdout(), err)
	}
}

// checkImageOwners checks that the workload of sandbox id, made from
// bigImageTree, sees the image's owners, modes, hard links and symlinks,
// and writes /root-file and over /usr/share/big/d007/f005.
func checkImageOwners(t *testing.T, sandboxes berthv1.SandboxServiceClient, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"sh", "-c",
		"stat -c '%u:%g %a %h %n' /etc/shadow /usr/bin/passwd-like /usr/bin/chage-like /usr/share/big/d007/f000 && stat -c '%u:%g %a %n' /home/berth && stat -c '%F %t,%T' /usr/share/big/null && readlink /usr/share/big/d007/f002 && " +
			"[ /usr/share/big/d007/f000 -ef /usr/share/big/d007/f001 ] && echo one inode && " +
			"echo w >/root-file && echo w >/usr/share/big/d007/f005"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "0:42 640 1 /etc/shadow\n0:0 4755 1 /usr/bin/passwd-like\n0:42 2755 1 /usr/bin/chage-like\n0:0 644 2 /usr/share/big/d007/f000\n1000:1000 755 /home/berth\ncharacter special file 1,3\nf000\none inode\n"
	if got := string(r.GetStdout()); got != want || r.GetResult().GetExitCode() != 0 {
		t.Errorf("in sandbox %s: %q (stderr %q, exit %d), want %q", id, got, r.GetStderr(), r.GetResult().GetExitCode(), want)
	}
}

// TestChownedRootFallback: a berthd told to give chowned copies (as it
// does by itself where idmapped mounts fail) says so in the sandbox
// (ROOT_ID_MAPPING_CHOWNED_COPY), and its workload sees the same owners,
// modes and links as through an idmapped root.
func TestChownedRootFallback(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "chowned", server.Config{TaskRestartLimit: -1}, func(c *runtime.Config) { c.RootIDMapping = runtime.RootFSChowned }, nil)
	if err := e.rt.IDMapped(); !errors.Is(err, runtime.ErrNoIDMap) {
		t.Errorf("IDMapped() = %v, want ErrNoIDMap", err)
	}
	const ref = "test.berth.dev/real-image:1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.rt.ImportImage(ctx, bytes.NewReader(bigImageArchive(t, ref)), ""); err != nil {
		t.Fatalf("import the real-image tree: %v", err)
	}
	sb := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{Image: ref})
	if got := sb.GetRootIdMapping(); got != berthv1.RootIDMapping_ROOT_ID_MAPPING_CHOWNED_COPY {
		t.Errorf("root_id_mapping = %v, want CHOWNED_COPY", got)
	}
	checkImageOwners(t, e.sandboxes, sb.GetId())

	// berth sandbox create says so on stderr, and only then.
	for _, tc := range []struct {
		addr, image string
		warns       bool
	}{{"unix://" + e.sock, ref, true}, {env.berthdAddr, env.image, false}} {
		cmd := exec.Command(env.cliBinary, "--addr", tc.addr, "sandbox", "create", "--image", tc.image)
		out, errOut, code := runCLI(t, cmd, cmd.Args)
		if code != 0 {
			t.Fatalf("berth sandbox create at %s: exit %d: %s", tc.addr, code, errOut)
		}
		id := strings.TrimSpace(out)
		if err := dialClient(t, tc.addr).DeleteSandbox(ctx, id); err != nil {
			t.Errorf("DeleteSandbox(%s): %v", id, err)
		}
		if warns := strings.Contains(errOut, "chowned copy"); warns != tc.warns {
			t.Errorf("berth sandbox create at %s: stderr %q, want a chowned-copy warning: %v", tc.addr, errOut, tc.warns)
		}
	}
}

// TestChownedCopyResumes: a chowned copy that takes longer than
// --create-work-limit fails the create UNAVAILABLE (CONTAINERD_UNAVAILABLE,
// naming the limit) and keeps what it did: a retry with the same
// sandbox_id takes the same id range and goes on from there, so that
// retries under a limit that no single create could meet finish.
func TestChownedCopyResumes(t *testing.T) {
	need(t)
	// The copy must outlast one attempt's limit, and how long it takes
	// depends on the machine's load: a quiet machine copies the tree in
	// under 300 ms. A first create that finishes proves nothing, so the
	// test starts over in a fresh namespace with a smaller limit.
	for _, limit := range []time.Duration{300 * time.Millisecond, 100 * time.Millisecond, 40 * time.Millisecond} {
		if chownedCopyResumes(t, limit) {
			return
		}
		t.Logf("the first create finished its chowned copy within %v; again with a smaller limit", limit)
	}
	t.Fatal("the first create finished its chowned copy within 40ms: the test needs a larger image")
}

// chownedCopyResumes creates the real image's sandbox under a create work
// limit until it succeeds and checks the result. It reports false, having
// checked nothing, when the first attempt already finished.
func chownedCopyResumes(t *testing.T, limit time.Duration) bool {
	t.Helper()
	name := fmt.Sprintf("resume%d", limit.Milliseconds())
	e := newInProcessEnvWith(t, name, server.Config{TaskRestartLimit: -1}, func(c *runtime.Config) {
		c.RootIDMapping = runtime.RootFSChowned
		c.CreateWorkLimit = limit
	}, nil)
	const ref = "test.berth.dev/real-image:1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.rt.ImportImage(ctx, bytes.NewReader(bigImageArchive(t, ref)), ""); err != nil {
		t.Fatalf("import the real-image tree: %v", err)
	}
	id := shortID("resume")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id})
	})
	for attempt := 1; ; attempt++ {
		resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: ref})
		if err == nil {
			if attempt == 1 {
				return false
			}
			t.Logf("created after %d attempts of %v each", attempt, limit)
			if got := resp.GetSandbox().GetRootIdMapping(); got != berthv1.RootIDMapping_ROOT_ID_MAPPING_CHOWNED_COPY {
				t.Errorf("root_id_mapping = %v, want CHOWNED_COPY", got)
			}
			checkImageOwners(t, e.sandboxes, id)
			return true
		}
		wantStatus(t, err, codes.Unavailable, rpcstatus.ReasonContainerdUnavailable, "", limit.String())
		if attempt == 60 {
			t.Fatalf("still failing after %d attempts of %v: each retry starts the copy over", attempt, limit)
		}
	}
}

// TestIDMappedRootRemount: an idmapped root that is no longer mounted
// when a sandbox's task restarts (the host rebooted, or someone unmounted
// it) is mounted again, and the sandbox keeps its files.
func TestIDMappedRootRemount(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "remount", server.Config{TaskRestartLimit: -1}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{Image: baseImage})
	id := sb.GetId()
	if got := sb.GetRootIdMapping(); got != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
		t.Fatalf("root_id_mapping = %v, want IDMAPPED", got)
	}
	if r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/kept"}}); err != nil || r.GetResult().GetExitCode() != 0 {
		t.Fatalf("write /kept: %v %v", err, r.GetResult())
	}
	pid := sb.GetRuntime().GetTaskPid()
	if err := e.rt.Kill(ctx, id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		sb, err := e.rt.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !sb.Running {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the killed task still runs")
		case <-time.After(20 * time.Millisecond):
		}
	}
	root := filepath.Join(e.stateDir, "s", id, "root")
	if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
		t.Fatalf("unmount %s: %v", root, err)
	}
	if _, err := e.rt.RestartTask(ctx, id, pid); err != nil {
		t.Fatalf("RestartTask after the root was unmounted: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "kept")); err != nil || string(b) != "kept\n" {
		t.Errorf("the remounted root holds /kept = %q, %v; want the file the workload wrote", b, err)
	}
	if sb, err := e.rt.Get(ctx, id); err != nil || !sb.Running {
		t.Errorf("after RestartTask: running %v, %v", sb.Running, err)
	}
}

// collectGarbage runs containerd's garbage collector in ns and waits for
// it: the delete of a lease with SynchronousDelete does.
func collectGarbage(t testing.TB, ns string) {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	l, err := cc.LeasesService().Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.LeasesService().Delete(ctx, l, leases.SynchronousDelete); err != nil {
		t.Fatalf("delete a lease synchronously (containerd's garbage collection): %v", err)
	}
}

// snapshotterRoot returns the host directory of containerd's snapshotter.
func snapshotterRoot(t testing.TB, snapshotter string) string {
	t.Helper()
	cc, err := containerd.New(env.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := cc.IntrospectionService().Plugins(context.Background(), "type==io.containerd.snapshotter.v1,id=="+snapshotter)
	if err != nil || len(resp.GetPlugins()) == 0 || resp.GetPlugins()[0].GetExports()["root"] == "" {
		t.Fatalf("containerd's %s snapshotter: %v %v", snapshotter, resp, err)
	}
	return resp.GetPlugins()[0].GetExports()["root"]
}

// snapshotDir returns the host directory that holds what sandbox id's
// workload writes: the btrfs subvolume or the overlayfs upper directory of
// its snapshot (containerd's snapshotters keep them under their root as
// snapshots/N/ and snapshots/N/fs).
func snapshotDir(t *testing.T, ns, snapshotter, id string) string {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mounts, err := cc.SnapshotService(snapshotter).Mounts(context.Background(), id)
	if err != nil {
		t.Fatalf("mounts of snapshot %s: %v", id, err)
	}
	for _, m := range mounts {
		for _, o := range m.Options {
			if upper, ok := strings.CutPrefix(o, "upperdir="); ok {
				return upper
			}
			if strings.HasPrefix(o, "subvolid=") {
				// The subvolume's path, from btrfs itself.
				out, err := exec.Command("btrfs", "subvolume", "list", "-o", filepath.Join(snapshotterRoot(t, snapshotter), "active")).Output()
				if err != nil {
					t.Fatalf("btrfs subvolume list: %v", err)
				}
				idWant := strings.TrimPrefix(o, "subvolid=")
				for _, line := range strings.Split(string(out), "\n") {
					f := strings.Fields(line)
					if len(f) >= 9 && f[1] == idWant {
						// "path" is relative to the file system's top.
						return filepath.Join(snapshotterRoot(t, snapshotter), "active", filepath.Base(f[8]))
					}
				}
				t.Fatalf("btrfs subvolume %s of snapshot %s not found in %s", idWant, id, out)
			}
		}
	}
	t.Fatalf("snapshot %s: no upper directory or subvolume in %v", id, mounts)
	return ""
}

// diskUsed returns the bytes the snapshots under a snapshotter's root dir
// take. On btrfs, whose copy-on-write snapshots share extents that du
// cannot see, that is the file system's used bytes after a sync (the
// snapshotter's btrfs holds nothing else) and after btrfs has cleaned up
// the subvolumes deleted before (`btrfs subvolume sync`: the space of a
// deleted subvolume comes back in the background, and coming back while
// a measurement ran it made the "disk per sandbox" note negative, -1514
// KiB in a session-6 run); elsewhere, the blocks of every inode under dir,
// each once, so that other writers to the same file system do not count.
func diskUsed(t testing.TB, dir string) uint64 {
	t.Helper()
	unix.Sync()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.BTRFS_SUPER_MAGIC {
		if out, err := exec.Command("btrfs", "subvolume", "sync", dir).CombinedOutput(); err != nil {
			t.Fatalf("btrfs subvolume sync %s: %v: %s", dir, err, out)
		}
		unix.Sync()
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	type inode struct{ dev, ino uint64 }
	seen := make(map[inode]bool)
	var used uint64
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		var s unix.Stat_t
		if err := unix.Lstat(path, &s); err != nil {
			return nil
		}
		if k := (inode{s.Dev, s.Ino}); !seen[k] {
			seen[k] = true
			used += uint64(s.Blocks) * 512
		}
		return nil
	})
	if err != nil {
		t.Fatalf("disk used under %s: %v", dir, err)
	}
	return used
}
