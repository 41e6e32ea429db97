package integration

// Attack tests of idmapped sandbox roots (server/runtime/rootfs.go): what
// a workload can leave on the host through its root, what other sandboxes
// and the image see of it, and what creates, deletes and restarts leave
// behind. Run them alone:
//
//	BERTH_E2E=1 BERTH_TEST_IMAGE=$PWD/build/base.oci.tar go test -count=1 -run 'TestAttack' -v ./integration/

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berth-sandbox/berth/internal/rootfsimage"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// attackEnv is an in-process berthd on its own namespace with the given
// snapshotter and root id mapping ("" for auto).
func attackEnv(t *testing.T, name, snapshotter, mapping string) *berthEnv {
	t.Helper()
	need(t)
	return newInProcessEnvWith(t, name, server.Config{TaskRestartLimit: -1, AllowHostUsers: true}, func(c *runtime.Config) {
		c.Snapshotter = snapshotter
		c.RootIDMapping = mapping
	}, nil)
}

// attackCreate creates a sandbox on e (of the base image unless req
// names one), deleted at cleanup.
func attackCreate(t *testing.T, e *berthEnv, req *berthv1.CreateSandboxRequest) *berthv1.Sandbox {
	t.Helper()
	if req == nil {
		req = &berthv1.CreateSandboxRequest{}
	}
	return createSandboxOn(t, e.sandboxes, req)
}

// attackRun runs a shell command in sandbox id on e.
func attackRun(t *testing.T, e *berthEnv, id, cmd string) (stdout, stderr string, exit int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	if err != nil {
		t.Fatalf("Run(%q) in %s: %v", cmd, id, err)
	}
	return string(r.GetStdout()), string(r.GetStderr()), r.GetResult().GetExitCode()
}

// hostRunAs runs argv on the host as uid:gid with no groups.
func hostRunAs(uid int, argv ...string) (string, error) {
	// Through sh: setpriv's own exec of argv[0] resolves the path before
	// the ids change (it ran a file under a 0700 directory as uid 65534).
	args := append([]string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups", "--", "sh", "-c", `exec "$@"`, "sh"}, argv...)
	out, err := exec.Command("setpriv", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// unreachableFor returns the first ancestor of path (or path itself) that
// host uid cannot pass (no search permission for others), or "".
func unreachableFor(path string) string {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return p + " (" + err.Error() + ")"
		}
		if st.Mode&0o001 == 0 {
			return fmt.Sprintf("%s (mode %o, owner %d)", p, st.Mode&0o7777, st.Uid)
		}
		if p == "/" {
			return ""
		}
	}
}

// TestAttackSetuidRootOnDisk: a workload running as its own root (no
// capabilities, no_new_privs) copies bash and marks it setuid. On btrfs an
// idmapped root stores container id 0 as host id 0 (as every idmapped
// mount of a plain file system does), so the copy is a setuid-root binary
// on the host's disk, under the snapshotter's root; on overlayfs it is
// stored under the range's ids. Expected: no unprivileged host id (nobody,
// or another sandbox's) reaches it, through the snapshotter's directory
// (0700) or the sandbox's idmapped root (its directory is 0710 root:base),
// and none runs it as root or as the sandbox's root.
func TestAttackSetuidRootOnDisk(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "suid-"+snapshotter[:2], snapshotter, "")
			sb := attackCreate(t, e, nil)
			if sb.GetRootIdMapping() != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
				t.Fatalf("root_id_mapping %v", sb.GetRootIdMapping())
			}
			out, errOut, code := attackRun(t, e, sb.GetId(), "cp /bin/bash /tmp/rb && chmod 4755 /tmp/rb && mkdir -p /tmp/d && chmod 755 /tmp/d && cp /tmp/rb /tmp/d/rb && chmod 4755 /tmp/d/rb && ls -ln /tmp/rb")
			if code != 0 {
				t.Fatalf("workload: %q %q exit %d", out, errOut, code)
			}
			t.Logf("inside: %s", strings.TrimSpace(out))
			base := sb.GetHostIdBase()

			// 1. The raw snapshot on the host (containerd's snapshotter root).
			raw := filepath.Join(snapshotDir(t, e.ns, snapshotter, sb.GetId()), "tmp", "rb")
			var st unix.Stat_t
			if err := unix.Lstat(raw, &st); err != nil {
				t.Fatalf("lstat %s: %v", raw, err)
			}
			t.Logf("raw snapshot path %s: uid %d gid %d mode %o; first ancestor host users cannot pass: %q", raw, st.Uid, st.Gid, st.Mode&0o7777, unreachableFor(raw))
			got, err := hostRunAs(65534, raw, "-p", "-c", "echo $EUID")
			t.Logf("host uid 65534 runs %s: %q %v", raw, got, err)
			if st.Mode&unix.S_ISUID != 0 && (st.Uid < base || st.Uid >= base+runtime.IDRangeSize) && unreachableFor(raw) == "" {
				t.Errorf("%s: the workload's setuid file lands on the host's disk as setuid uid %d (the sandbox's range is %d-%d) where every host user reaches it", snapshotter, st.Uid, base, base+runtime.IDRangeSize-1)
			}
			if got == "0" {
				t.Errorf("%s: SEVERE: unprivileged host uid 65534 runs the workload's setuid file at %s as euid 0", snapshotter, raw)
			}

			// 2. The idmapped root under berthd's state directory.
			mnt := filepath.Join(e.stateDir, "s", sb.GetId(), "root", "tmp", "rb")
			if err := unix.Lstat(mnt, &st); err != nil {
				t.Fatalf("lstat %s: %v", mnt, err)
			}
			got, err = hostRunAs(65534, mnt, "-p", "-c", "echo $EUID")
			t.Logf("state-dir root path %s: uid %d mode %o, unreachable at %q; host uid 65534 runs it: %q %v", mnt, st.Uid, st.Mode&0o7777, unreachableFor(mnt), got, err)
			if got == fmt.Sprint(base) {
				t.Errorf("%s: unprivileged host uid 65534 becomes the sandbox's root id %d on the host through the setuid file at %s (the idmapped root is reachable by every host user and not nosuid)", snapshotter, base, mnt)
			}
			if rd, err := hostRunAs(65534, "cat", filepath.Join(e.stateDir, "s", sb.GetId(), "root", "etc", "passwd")); err == nil {
				t.Errorf("%s: host uid 65534 reads the sandbox's /etc/passwd through %s (%d bytes)", snapshotter, e.stateDir, len(rd))
			}
		})
	}
}

// treeDigest describes every file under root: path, type and mode,
// owner, size, rdev, symlink target and the sha256 of a regular file's
// content, one line each, sorted.
func treeDigest(t *testing.T, root string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	err := filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		rel := strings.TrimPrefix(path, root)
		desc := fmt.Sprintf("%o %d:%d size %d rdev %d nlink %d", st.Mode, st.Uid, st.Gid, st.Size, st.Rdev, st.Nlink)
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(path)
			desc += " -> " + l
		case info.Mode().IsRegular():
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			h := sha256.New()
			io.Copy(h, f)
			f.Close()
			desc += " " + hex.EncodeToString(h.Sum(nil))[:16]
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("digest of %s: %v", root, err)
	}
	return out
}

// diffDigests lists what differs between two treeDigests.
func diffDigests(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "gone: "+k)
		} else if v != w {
			d = append(d, fmt.Sprintf("changed: %s: %s => %s", k, v, w))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "new: "+k)
		}
	}
	sort.Strings(d)
	return d
}

// imageLayerDigest digests the committed snapshot that sandbox id's
// snapshot was prepared from, as the host has it: on overlayfs the lower
// directories of its mount, elsewhere a read-only view of it.
func imageLayerDigest(t *testing.T, ns, snapshotter, id string) map[string]string {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The view below is held by nothing else: without a lease containerd's
	// garbage collector (scheduled by any deletion berthd makes meanwhile)
	// removes it while it is being walked.
	ctx, done, err := cc.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(context.WithoutCancel(ctx))
	sn := cc.SnapshotService(snapshotter)
	mounts, err := sn.Mounts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, o := range m.Options {
			if lower, ok := strings.CutPrefix(o, "lowerdir="); ok {
				all := make(map[string]string)
				for i, l := range strings.Split(lower, ":") {
					for k, v := range treeDigest(t, l) {
						all[fmt.Sprintf("L%d%s", i, k)] = v
					}
				}
				return all
			}
		}
	}
	info, err := sn.Stat(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	key := "attack-view-" + shortID("v")
	vm, err := sn.View(ctx, key, info.Parent)
	if err != nil {
		t.Fatalf("view of %s: %v", info.Parent, err)
	}
	defer sn.Remove(context.Background(), key)
	var d map[string]string
	if err := mount.WithTempMount(ctx, vm, func(root string) error {
		d = treeDigest(t, root)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestAttackCrossSandboxImage: a workload vandalizes its root as its own
// root can (append to /etc/passwd, remove /etc/group and /usr, chmod
// /etc, hard-link and write through /bin/busybox, rename /sbin, touch
// times, set user xattrs); another sandbox of the image, made before and
// one made after, see the image as it is, and the image's committed
// snapshot on the host is byte for byte the same.
func TestAttackCrossSandboxImage(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "cross-"+snapshotter[:2], snapshotter, "")
			a := attackCreate(t, e, nil)
			b := attackCreate(t, e, nil)
			before := imageLayerDigest(t, e.ns, snapshotter, a.GetId())
			const probe = "md5sum /etc/passwd /bin/busybox /bin/bash; ls -ld /etc /usr /sbin | cut -c1-10; ls /etc/group /usr/bin | head -3; stat -c '%u:%g %a' / /etc/passwd"
			wantB, _, _ := attackRun(t, e, b.GetId(), probe)
			out, errOut, code := attackRun(t, e, a.GetId(),
				"set -x; echo evil:x:0:0::/:/bin/sh >>/etc/passwd; rm -f /etc/group; rm -rf /usr; "+
					"ln /bin/bash /tmp/bb && printf XXXX | dd of=/tmp/bb bs=1 seek=100 conv=notrunc 2>&1; "+
					"touch -d 2000-01-01 /etc/passwd; setfattr -n user.evil -v 1 /etc/passwd 2>&1; "+
					"chmod 0777 / ; chmod 0700 /etc; mv /sbin /sbin2; mknod /tmp/null c 1 3 2>&1; "+
					"cat /proc/self/mountinfo | head -3; true")
			t.Logf("vandal (exit %d): %s %s", code, out, errOut)
			gotB, _, _ := attackRun(t, e, b.GetId(), probe)
			if gotB != wantB {
				t.Errorf("%s: the other sandbox sees %q after the vandal, %q before", snapshotter, gotB, wantB)
			}
			c := attackCreate(t, e, nil)
			if gotC, _, _ := attackRun(t, e, c.GetId(), probe); gotC != wantB {
				t.Errorf("%s: a new sandbox sees %q, want %q", snapshotter, gotC, wantB)
			}
			after := imageLayerDigest(t, e.ns, snapshotter, c.GetId())
			if d := diffDigests(before, after); len(d) > 0 {
				t.Errorf("%s: the image's committed snapshot changed on the host: %v", snapshotter, d)
			}
			// The vandal's own view: its writes landed in its own root.
			if got, _, _ := attackRun(t, e, a.GetId(), "ls -ld / /etc | cut -c1-10; tail -1 /etc/passwd"); !strings.Contains(got, "evil") {
				t.Errorf("%s: the vandal does not see its own writes: %q", snapshotter, got)
			}
		})
	}
}

// hostState is what a berthd leaves on the host and in containerd.
type hostState struct {
	snapshots  []string // keys in the namespace's snapshotter
	leases     []string
	mounts     []string // mountinfo lines under the state dir or of idmapped overlay lowers
	dirs       []string // sandbox host directories
	tmp        []string // containerd's temporary idmapped lower mounts
	containers []string
}

func captureHostState(t *testing.T, e *berthEnv, snapshotter string) hostState {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s hostState
	if err := cc.SnapshotService(snapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		s.snapshots = append(s.snapshots, i.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ls, err := cc.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		s.leases = append(s.leases, l.ID)
	}
	cs, err := cc.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		s.containers = append(s.containers, c.ID())
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// This berthd's mounts are under its state directory; the
		// idmapped lower layers it mounts while creating an overlayfs
		// root are /tmp/ovl-idmapped*. Another berthd's sandbox roots on
		// the host (whose options name its own lower layer) are not this
		// test's: proc(5)'s fifth field is the mount point.
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) > 4 && (strings.HasPrefix(f[4], e.stateDir+"/") || strings.Contains(f[4], "ovl-idmapped")) {
			s.mounts = append(s.mounts, l)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(e.stateDir, "s"))
	for _, d := range entries {
		s.dirs = append(s.dirs, d.Name())
	}
	tmps, _ := filepath.Glob(filepath.Join(os.TempDir(), "ovl-idmapped*"))
	s.tmp = tmps
	sort.Strings(s.snapshots)
	return s
}

// newIn returns what after has that before has not.
func newIn(before, after []string) []string {
	had := make(map[string]bool)
	for _, b := range before {
		had[b] = true
	}
	var d []string
	for _, a := range after {
		if !had[a] {
			d = append(d, a)
		}
	}
	return d
}

// TestAttackLeaks runs creates and deletes that fail or race — plain
// cycles, unknown images, deletes at many delays into a create of the
// same id, concurrent creates of one id with the same and with another
// spec, creates whose caller gives up at once — and then checks that
// nothing is left: no mount under the state directory, no idmapped
// overlay lower, no snapshot, lease, container or host directory.
func TestAttackLeaks(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "leak-"+snapshotter[:2], snapshotter, "")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			// One create first, so that the image is unpacked in this
			// namespace before the baseline.
			first, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: first.GetSandbox().GetId()}); err != nil {
				t.Fatal(err)
			}
			before := captureHostState(t, e, snapshotter)
			t.Logf("baseline: %d snapshots, %d leases, %d mounts, %d dirs, %d tmp, %d containers", len(before.snapshots), len(before.leases), len(before.mounts), len(before.dirs), len(before.tmp), len(before.containers))

			del := func(id string) {
				if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
					t.Errorf("DeleteSandbox(%s): %v", id, err)
				}
			}
			// a) plain cycles
			for range 8 {
				r, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
				if err != nil {
					t.Fatal(err)
				}
				del(r.GetSandbox().GetId())
			}
			// b) unknown image
			for i := range 3 {
				id := fmt.Sprintf("leak-bad-%d", i)
				if _, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: "berth.dev/nope:1"}); err == nil {
					t.Errorf("create of an unknown image succeeded")
				}
				del(id)
			}
			// c) a delete at a delay into the create of the same id
			var cut []string
			for i, d := range []time.Duration{0, 1, 2, 5, 10, 20, 30, 50, 80, 120, 200, 300} {
				id := fmt.Sprintf("leak-cut-%d", i)
				cut = append(cut, id)
				errc := make(chan error, 1)
				go func() {
					_, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage})
					errc <- err
				}()
				time.Sleep(d * time.Millisecond)
				del(id)
				err := <-errc
				t.Logf("delete %v into the create of %s: create %v", d*time.Millisecond, id, err)
				del(id)
			}
			// d) concurrent creates of one id, same spec, and another spec
			for i := range 3 {
				id := fmt.Sprintf("leak-same-%d", i)
				errc := make(chan error, 4)
				for j := range 4 {
					go func() {
						req := &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage}
						if i == 2 && j%2 == 1 {
							req.Labels = map[string]string{"other": fmt.Sprint(j)}
						}
						_, err := e.sandboxes.CreateSandbox(ctx, req)
						errc <- err
					}()
				}
				for range 4 {
					if err := <-errc; err != nil {
						t.Logf("concurrent create of %s: %v", id, err)
					}
				}
				del(id)
			}
			// e) callers that give up at once; the create goes on
			for i := range 4 {
				id := fmt.Sprintf("leak-gone-%d", i)
				cctx, ccancel := context.WithTimeout(ctx, time.Duration(i*15+1)*time.Millisecond)
				_, err := e.sandboxes.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage})
				ccancel()
				t.Logf("impatient create of %s: %v", id, err)
			}
			time.Sleep(3 * time.Second)
			for i := range 4 {
				del(fmt.Sprintf("leak-gone-%d", i))
			}
			time.Sleep(time.Second)
			after := captureHostState(t, e, snapshotter)
			if d := newIn(before.mounts, after.mounts); len(d) > 0 {
				t.Errorf("%s: mounts left: %q", snapshotter, d)
			}
			if d := newIn(before.tmp, after.tmp); len(d) > 0 {
				t.Errorf("%s: temporary idmapped lower dirs left: %q", snapshotter, d)
			}
			if d := newIn(before.dirs, after.dirs); len(d) > 0 {
				t.Errorf("%s: host directories left: %q", snapshotter, d)
				for _, id := range d {
					out, _ := exec.Command("ls", "-laR", filepath.Join(e.stateDir, "s", id)).CombinedOutput()
					t.Logf("%s: %s", id, out)
				}
			}
			if d := newIn(before.containers, after.containers); len(d) > 0 {
				t.Errorf("%s: containers left: %q", snapshotter, d)
			}
			if d := newIn(before.snapshots, after.snapshots); len(d) > 0 {
				// A create that fails removes its idmapped snapshot.
				t.Errorf("%s: snapshots left after every sandbox was deleted: %q", snapshotter, d)
			}
			if d := newIn(before.leases, after.leases); len(d) > 0 {
				t.Logf("%s: leases left (creates cut off keep theirs for an hour, by design): %d", snapshotter, len(d))
			}
			// After containerd's garbage collection, with the leases:
			collectGarbage(t, e.ns)
			gc := captureHostState(t, e, snapshotter)
			if d := newIn(before.snapshots, gc.snapshots); len(d) > 0 {
				t.Errorf("%s: snapshots still left after a GC: %q", snapshotter, d)
			}
		})
	}
}

// waitStopped waits until sandbox id's task no longer runs.
func waitStopped(t *testing.T, e *berthEnv, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		sb, err := e.rt.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !sb.Running {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the killed task still runs")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// mountsAt returns the mountinfo lines whose mount point is dir.
func mountsAt(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			out = append(out, l)
		}
	}
	return out
}

// TestAttackRootHalfUnmounted: on btrfs containerd's mount code mounts
// the subvolume at the root mount point and then stacks an idmapped
// clone of it on top: two mounts. A plain umount(8) of the root (or
// MNT_DETACH, as TestIDMappedRootRemount does) removes only the top one,
// the un-mapped subvolume stays mounted there, and RestartTask's "is it
// mounted?" check is satisfied by it: the new task runs on a root whose
// files are not mapped into its ids.
// Expected: a restarted sandbox sees its files as its own (0:0), keeps
// what it wrote and can write its root.
func TestAttackRootHalfUnmounted(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "half-"+snapshotter[:2], snapshotter, "")
			sb := attackCreate(t, e, nil)
			id := sb.GetId()
			root := filepath.Join(e.stateDir, "s", id, "root")
			t.Logf("mounts at the root before: %d\n%s", len(mountsAt(t, root)), strings.Join(mountsAt(t, root), "\n"))
			if _, _, code := attackRun(t, e, id, "echo kept >/kept"); code != 0 {
				t.Fatal("write /kept")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.rt.Kill(ctx, id, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, e, id)
			if err := unix.Unmount(root, 0); err != nil {
				t.Fatalf("umount %s: %v", root, err)
			}
			t.Logf("mounts at the root after one umount: %q", mountsAt(t, root))
			// mountRoot finds the top mount not idmapped and mounts anew.
			if _, err := e.rt.RestartTask(ctx, id, sb.GetRuntime().GetTaskPid()); err != nil {
				t.Fatalf("RestartTask on a half-unmounted root: %v", err)
			}
			// Wait for the agent.
			var out, errOut string
			var code int32
			for i := 0; ; i++ {
				r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "stat -c '%u:%g %n' / /etc/passwd /kept; echo new >/new && echo wrote"}})
				if err == nil {
					out, errOut, code = string(r.GetStdout()), string(r.GetStderr()), r.GetResult().GetExitCode()
					break
				}
				if i == 100 {
					t.Fatalf("Run after the restart: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("after the restart: %q %q exit %d", out, errOut, code)
			if !strings.Contains(out, "0:0 /etc/passwd") || !strings.Contains(out, "wrote") {
				t.Errorf("%s: after one umount of its root and a task restart, the sandbox sees %q (%q): its root is not mapped into its ids", snapshotter, out, errOut)
			}
		})
	}
}

// TestAttackHostUnmountRunning: the host unmounts (lazily, all layers)
// the root of a running sandbox. The sandbox keeps its own copy of the
// mount; it goes on working, what it writes lands in its snapshot, and
// the delete leaves nothing.
func TestAttackHostUnmountRunning(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "hum-"+snapshotter[:2], snapshotter, "")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetSandbox().GetId()
			before := captureHostState(t, e, snapshotter)
			root := filepath.Join(e.stateDir, "s", id, "root")
			if err := mount.UnmountAll(root, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			out, errOut, code := attackRun(t, e, id, "ls / | wc -l; echo after >/after && cat /after; stat -c %u /etc/passwd")
			t.Logf("the sandbox after the host unmounted its root: %q %q exit %d", out, errOut, code)
			if code != 0 || !strings.Contains(out, "after") {
				t.Errorf("%s: sandbox broken after the host unmounted its root: %q %q", snapshotter, out, errOut)
			}
			g, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
			t.Logf("GetSandbox: state=%v mapping=%v err=%v", g.GetSandbox().GetState(), g.GetSandbox().GetRootIdMapping(), err)
			if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
				t.Fatalf("DeleteSandbox after the host unmounted the root: %v", err)
			}
			after := captureHostState(t, e, snapshotter)
			if d := newIn(before.snapshots, after.snapshots); len(d) > 0 {
				t.Errorf("snapshots new after the delete: %q", d)
			}
			for _, s := range after.snapshots {
				if s == id {
					t.Errorf("%s: the sandbox's snapshot %s is left after its delete", snapshotter, id)
				}
			}
			if len(after.mounts) > 0 || len(after.dirs) > 0 {
				t.Errorf("%s: left: mounts %q dirs %q", snapshotter, after.mounts, after.dirs)
			}
		})
	}
}

// TestAttackDiskQuotaIDMapped: a sandbox with disk_bytes on btrfs fills
// its disk through its idmapped root, as root and as uid 1000, with one
// file and with many; the quota stops it.
func TestAttackDiskQuotaIDMapped(t *testing.T) {
	e := attackEnv(t, "quota", "btrfs", "")
	const limit = 32 << 20
	for _, user := range []string{"0:0", "1000:1000"} {
		sb := attackCreate(t, e, &berthv1.CreateSandboxRequest{User: user, Resources: &berthv1.Resources{DiskBytes: limit}})
		if sb.GetRootIdMapping() != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
			t.Fatalf("root_id_mapping %v", sb.GetRootIdMapping())
		}
		dir := "/tmp"
		out, errOut, code := attackRun(t, e, sb.GetId(), "dd if=/dev/zero of="+dir+"/fill bs=1M count=96 2>&1; sync; du -sk "+dir+"/fill; "+
			"i=0; while [ $i -lt 200 ]; do dd if=/dev/zero of="+dir+"/f$i bs=1M count=1 2>/dev/null || break; i=$((i+1)); done; sync; echo small=$i; du -sk "+dir)
		t.Logf("user %s: %q %q exit %d", user, out, errOut, code)
		var kb int
		lines := strings.Split(strings.TrimSpace(out), "\n")
		fmt.Sscanf(lines[len(lines)-1], "%d", &kb)
		if kb*1024 > limit+(4<<20) {
			t.Errorf("user %s: the sandbox wrote %d KiB under a %d KiB quota", user, kb, limit>>10)
		}
	}
}

// TestAttackChownedOverlayHardLinks: --root-id-mapping chowned on
// overlayfs with an image whose files have hard links
// (bigImageTree: every f001 is a link of f000). The chowned copy is made
// through an overlay mount: chowning f000 copies it up and breaks the
// link, and chownInto skips f001 as "the same inode" (overlay keeps the
// lower's st_ino), so f001 keeps host uid 0: outside the sandbox's ids.
// Expected: every file of the image owned 0:0 inside, writable by root.
func TestAttackChownedOverlayHardLinks(t *testing.T) {
	for _, snapshotter := range []string{"overlayfs", "btrfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "chl-"+snapshotter[:2], snapshotter, runtime.RootFSChowned)
			const ref = "test.berth.dev/real-image:1"
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := e.rt.ImportImage(ctx, bytes.NewReader(bigImageArchive(t, ref)), ""); err != nil {
				t.Fatal(err)
			}
			sb := attackCreate(t, e, &berthv1.CreateSandboxRequest{Image: ref})
			if sb.GetRootIdMapping() != berthv1.RootIDMapping_ROOT_ID_MAPPING_CHOWNED_COPY {
				t.Fatalf("root_id_mapping %v", sb.GetRootIdMapping())
			}
			out, errOut, code := attackRun(t, e, sb.GetId(), "stat -c '%u:%g %h %i %n' /usr/share/big/d007/f000 /usr/share/big/d007/f001 /usr/share/big/d050/f001; "+
				"[ /usr/share/big/d007/f000 -ef /usr/share/big/d007/f001 ] && echo same-inode; "+
				"echo w >>/usr/share/big/d007/f001 && echo wrote-f001; cat /usr/share/big/d007/f000 | wc -c; "+
				"find /usr/share/big -user 65534 | wc -l")
			t.Logf("%s chowned: %q %q exit %d", snapshotter, out, errOut, code)
			if strings.Contains(out, "65534:65534") || !strings.Contains(out, "wrote-f001") {
				t.Errorf("%s chowned: hard-linked files of the image are not the sandbox's: %q %q", snapshotter, out, errOut)
			}
		})
	}
}

// TestAttackRestartAdoptDelete: berthd (the binary) is SIGKILLed with an
// idmapped sandbox running; the next berthd re-adopts it, runs in it,
// reports ROOT_ID_MAPPING_IDMAPPED, restarts its killed task (the root is
// still mounted), and its delete leaves no mount, snapshot or directory.
func TestAttackRestartAdoptDelete(t *testing.T) {
	need(t)
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := newBinaryEnv(t, "rad-"+snapshotter[:2])
			p1 := startBerthd(t, e, "--snapshotter", snapshotter)
			e.importBase(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			before := captureHostState(t, e, snapshotter)
			r, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "adopt", Image: baseImage})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, code := attackRun(t, e, "adopt", "echo one >/one"); code != 0 {
				t.Fatal("write /one")
			}
			p1.signal(t, syscall.SIGKILL)
			p2 := startBerthd(t, e, "--snapshotter", snapshotter)
			g, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: "adopt"})
			if err != nil || g.GetSandbox().GetRootIdMapping() != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
				t.Errorf("GetSandbox after the restart: %v %v", g.GetSandbox().GetRootIdMapping(), err)
			}
			if out, _, code := attackRun(t, e, "adopt", "cat /one; stat -c %u /etc/passwd"); code != 0 || out != "one\n0\n" {
				t.Errorf("in the re-adopted sandbox: %q exit %d", out, code)
			}
			// The task dies under the re-adopted berthd: it restarts it
			// on the root it did not mount itself.
			if err := e.rt.Kill(ctx, "adopt", syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var out string
			for i := 0; ; i++ {
				time.Sleep(100 * time.Millisecond)
				rr, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: "adopt", Process: &berthv1.ProcessSpec{ShellCommand: "cat /one; stat -c %u /etc/passwd"}})
				if err == nil {
					out = string(rr.GetStdout())
					break
				}
				if i == 100 {
					t.Fatalf("Run after the task's restart: %v", err)
				}
			}
			if out != "one\n0\n" {
				t.Errorf("after the task's restart by the re-adopting berthd: %q", out)
			}
			// The task dies while berthd is down: the next berthd removes
			// the sandbox as an orphan, root mount and snapshot with it.
			p2.signal(t, syscall.SIGTERM)
			if err := e.rt.Kill(ctx, "adopt", syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, e, "adopt")
			p3 := startBerthd(t, e, "--snapshotter", snapshotter)
			if l := p3.logLines("removed sandbox at start-up", "adopt"); len(l) != 1 {
				t.Errorf("orphan removal log lines: %q", l)
			}
			_ = r
			after := captureHostState(t, e, snapshotter)
			if d := newIn(before.snapshots, after.snapshots); len(d) > 0 {
				t.Errorf("snapshots left: %q", d)
			}
			if len(after.mounts) > 0 || len(after.dirs) > 0 || len(after.containers) > 0 {
				t.Errorf("left: mounts %q dirs %q containers %q", after.mounts, after.dirs, after.containers)
			}
		})
	}
}

// TestAttackPrivateMountNamespace: berthd in a mount namespace of its
// own whose mounts do not propagate to containerd's (systemd's
// PrivateTmp, ProtectSystem or PrivateMounts; simulated with `unshare
// --mount --propagation slave`) would mount each sandbox's root and run
// directory where runc cannot see them. Expected: berthd refuses to start
// and says why and what to change, for idmapped and chowned roots alike.
func TestAttackPrivateMountNamespace(t *testing.T) {
	need(t)
	for _, mapping := range []string{"auto", "chowned"} {
		t.Run(mapping, func(t *testing.T) {
			e := newBinaryEnv(t, "pmn-"+mapping[:2])
			cmd := exec.Command("unshare", "--mount", "--propagation", "slave", berthdBinary(t),
				"--containerd-address", env.containerd, "--namespace", e.ns, "--state-dir", e.stateDir,
				"--agent-binary", env.agentBinary, "--snapshotter", env.snapshotter, "--listen", "unix://"+e.sock,
				"--root-id-mapping", mapping)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				<-done
				t.Fatalf("berthd in a private mount namespace still runs after a minute; it must refuse to start:\n%s", out)
			}
			if err == nil || !strings.Contains(string(out), "not visible to containerd") || !strings.Contains(string(out), "rshared") {
				t.Errorf("berthd in a private mount namespace: %v, want a refusal to start that says why:\n%s", err, out)
			}
		})
	}
}

// TestAttackTwoBerthdsSameID: two runtimes on one namespace and state
// directory (two berthds during a hand-over, or a second one started by
// mistake) create the same sandbox id at once. withIDMappedRoot takes a
// snapshot of the id that exists with no container yet for one left by a
// create that did not finish: it unmounts the other's root, removes its
// snapshot and mounts its own, with its own id range.
// Expected: one create wins, the other fails ErrSandboxExists, and the
// winner's root is mapped into the winner's range.
func TestAttackTwoBerthdsSameID(t *testing.T) {
	need(t)
	snapshotter := env.snapshotter
	rtA, ns, stateDir := newNamespaceRuntimeWith(t, "two", nil)
	rtB, _, _ := newNamespaceRuntimeWith(t, "two", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// An image that already has every mount point runc needs in the root,
	// so that runc creates nothing there (creating one through a root
	// mapped into another range fails EOVERFLOW and hides the race).
	tree := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", filepath.Join(filepath.Dir(archivePath()), "rootfs"), tree).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	for _, d := range []string{".berth-run", "sys/fs/cgroup", "dev/shm", "dev/pts", "dev/mqueue"} {
		os.MkdirAll(filepath.Join(tree, d), 0o755)
	}
	os.WriteFile(filepath.Join(tree, ".berth-agent"), nil, 0o755)
	img, err := rootfsimage.FromDir(tree, rootfsimage.Options{TempDir: env.dir})
	if err != nil {
		t.Fatal(err)
	}
	const ref = "test.berth.dev/mountpoints:1"
	tag, _ := name.NewTag(ref)
	var archive bytes.Buffer
	if err := tarball.Write(tag, img, &archive); err != nil {
		t.Fatal(err)
	}
	img.Close()
	if _, err := rtA.ImportImage(ctx, &archive, ""); err != nil {
		t.Fatal(err)
	}
	bad := 0
	const rounds = 12
	for i := range rounds {
		id := fmt.Sprintf("two-%d", i)
		spec := runtime.SandboxSpec{ID: id, Image: ref, PidsLimit: 64}
		errs := make(chan error, 2)
		for _, rt := range []*runtime.Runtime{rtA, rtB} {
			go func() { errs <- rt.Create(ctx, spec) }()
		}
		e1, e2 := <-errs, <-errs
		sb, gerr := rtA.Get(ctx, id)
		var st unix.Stat_t
		serr := unix.Stat(filepath.Join(stateDir, "s", id, "root", "etc", "passwd"), &st)
		// What the running task itself has as its root.
		var inside unix.Stat_t
		ierr := unix.Stat(fmt.Sprintf("/proc/%d/root/etc/passwd", sb.TaskPID), &inside)
		ok := gerr == nil && serr == nil && st.Uid == sb.IDBase && sb.Running
		if !ok {
			bad++
		}
		if ierr == nil && inside.Uid != sb.IDBase {
			t.Errorf("round %d: sandbox %s runs (task %d, range %d) on a root mapped into range %d", i, id, sb.TaskPID, sb.IDBase, inside.Uid)
		}
		t.Logf("round %d: create errors %v | %v; sandbox base %d running %v (%v); host root /etc/passwd owner %d (%v); the task's root: owner %d (%v); consistent %v", i, e1, e2, sb.IDBase, sb.Running, gerr, st.Uid, serr, inside.Uid, ierr, ok)
		if err := rtA.Delete(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	_ = ns
	_ = snapshotter
	if bad > 0 {
		t.Errorf("%d of %d rounds of two concurrent creates of one id left a sandbox whose root is not mapped into its own id range (or no sandbox)", bad, rounds)
	}
}

// twoLayerImage is the base image's tree plus a second layer with a
// whiteout, an opaque directory, files of uid 1000 and of uid 70000
// (outside a user namespace's 65536 ids), a setuid file, hard links and
// device nodes of host devices (/dev/mem 1,1, /dev/kmsg 1,11, loop0 7,0).
func twoLayerImage(t *testing.T, ref string) []byte {
	t.Helper()
	img, err := rootfsimage.FromDir(filepath.Join(filepath.Dir(archivePath()), "rootfs"), rootfsimage.Options{TempDir: env.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Typeflag == tar.TypeDir || h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock || h.Typeflag == tar.TypeLink {
			h.Size = 0
		}
		h.ModTime = time.Unix(1700000000, 0)
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(body))
		}
	}
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "etc/.wh.shells", Typeflag: tar.TypeReg, Mode: 0o644}, "")
	add(&tar.Header{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "usr/local/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "usr/local/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644}, "")
	add(&tar.Header{Name: "usr/local/new", Typeflag: tar.TypeReg, Mode: 0o644}, "new\n")
	add(&tar.Header{Name: "layer2/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "layer2/owned1000", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1000, Gid: 1000}, "u1000\n")
	add(&tar.Header{Name: "layer2/owned70000", Typeflag: tar.TypeReg, Mode: 0o666, Uid: 70000, Gid: 70000}, "u70000\n")
	add(&tar.Header{Name: "layer2/suid", Typeflag: tar.TypeReg, Mode: 0o4755}, "#!/bin/sh\nid\n")
	add(&tar.Header{Name: "layer2/hl1", Typeflag: tar.TypeReg, Mode: 0o644}, "linked\n")
	add(&tar.Header{Name: "layer2/hl2", Typeflag: tar.TypeLink, Linkname: "layer2/hl1", Mode: 0o644}, "")
	add(&tar.Header{Name: "layer2/mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1}, "")
	add(&tar.Header{Name: "layer2/kmsg", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 11}, "")
	add(&tar.Header{Name: "layer2/loop0", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 7, Devminor: 0}, "")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	two, err := mutate.AppendLayers(img, layer)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tarball.Write(tag, two, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestAttackTwoLayerImage: an image of two layers through an idmapped
// root (on overlayfs: two idmapped lower layers): the whiteout and the
// opaque directory hold, owners map (70000, outside the range, shows as
// the overflow id and stays unwritable), hard links are one inode, host
// device nodes of the image cannot be opened, and what the workload
// changes stays out of another sandbox of the image.
func TestAttackTwoLayerImage(t *testing.T) {
	for _, snapshotter := range []string{"btrfs", "overlayfs"} {
		t.Run(snapshotter, func(t *testing.T) {
			e := attackEnv(t, "two-"+snapshotter[:2], snapshotter, "")
			const ref = "test.berth.dev/two-layer:1"
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := e.rt.ImportImage(ctx, bytes.NewReader(twoLayerImage(t, ref)), ""); err != nil {
				t.Fatalf("import: %v", err)
			}
			a := attackCreate(t, e, &berthv1.CreateSandboxRequest{Image: ref})
			b := attackCreate(t, e, &berthv1.CreateSandboxRequest{Image: ref})
			const look = "ls /etc/shells 2>&1; ls /usr/local; stat -c '%u:%g %a %h %n' /layer2/owned1000 /layer2/owned70000 /layer2/suid /layer2/hl1 /layer2/hl2; [ /layer2/hl1 -ef /layer2/hl2 ] && echo one-inode; cat /layer2/hl2"
			out, errOut, _ := attackRun(t, e, a.GetId(), look)
			t.Logf("%s look: %s %s", snapshotter, out, errOut)
			want := []string{"No such file", "new", "1000:1000 644 1 /layer2/owned1000", "0:0 4755 1 /layer2/suid", "0:0 644 2 /layer2/hl1", "one-inode", "linked"}
			for _, w := range want {
				if !strings.Contains(out+errOut, w) {
					t.Errorf("%s: sandbox sees %q, missing %q", snapshotter, out+errOut, w)
				}
			}
			out, errOut, _ = attackRun(t, e, a.GetId(), "for d in mem kmsg loop0; do head -c 16 /layer2/$d >/dev/null 2>&1 && echo OPENED-$d || echo denied-$d; done; "+
				"echo x >>/layer2/owned70000 && echo WROTE-70000; echo y >>/layer2/hl1 && cat /layer2/hl2; "+
				"rm -rf /usr/local/new /etc/passwd && echo removed")
			t.Logf("%s attack: %s %s", snapshotter, out, errOut)
			if strings.Contains(out, "OPENED") {
				t.Errorf("%s: SEVERE: the workload opened a host device node shipped in the image: %q", snapshotter, out)
			}
			if strings.Contains(out, "WROTE-70000") {
				t.Errorf("%s: the workload wrote a file of host id 70000 (outside its range): %q", snapshotter, out)
			}
			if !strings.Contains(out, "linked\ny\n") {
				// overlayfs without index=on breaks a hard link at copy-up
				// (containerd mounts with index=off): not idmap's doing.
				t.Logf("%s: a write through one hard link of the image is not seen through the other: %q", snapshotter, out)
			}
			if out2, _, _ := attackRun(t, e, b.GetId(), look); !strings.Contains(out2, "1000:1000 644 1 /layer2/owned1000") || !strings.Contains(out2, "new") || strings.Contains(out2, "linked\ny") {
				t.Errorf("%s: the other sandbox sees %q", snapshotter, out2)
			}
		})
	}
}

// TestImageFileOutsideIDRange: an image holding a file owned by an id a
// sandbox's user namespace cannot map (70000 >= 65536). A chowned copy
// cannot place it: the create fails FAILED_PRECONDITION IMAGE_UNUSABLE
// naming the image and the file (it was INTERNAL). An idmapped root shows
// it as the overflow id and the create succeeds.
func TestImageFileOutsideIDRange(t *testing.T) {
	for _, mapping := range []string{runtime.RootFSChowned, ""} {
		t.Run("mapping="+mapping, func(t *testing.T) {
			e := attackEnv(t, "bigid-"+fmt.Sprint(len(mapping)), env.snapshotter, mapping)
			const ref = "test.berth.dev/big-uid:1"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			archive := imageWithLayers(t, ref, []*tar.Header{
				{Name: "opt/", Typeflag: tar.TypeDir, Mode: 0o755},
				{Name: "opt/big-uid", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 70000, Gid: 70000},
			})
			if _, err := e.rt.ImportImage(ctx, bytes.NewReader(archive), ""); err != nil {
				t.Fatalf("import: %v", err)
			}
			resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "bigid", Image: ref})
			if mapping == runtime.RootFSChowned {
				wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, "", ref, "/opt/big-uid is owned by 70000:70000")
				return
			}
			if err != nil {
				t.Fatalf("create with an idmapped root: %v", err)
			}
			defer e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: "bigid"})
			if got := resp.GetSandbox().GetRootIdMapping(); got != berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED {
				t.Fatalf("root_id_mapping %v", got)
			}
			if out, _, code := attackRun(t, e, "bigid", "stat -c %u /opt/big-uid"); code != 0 || strings.TrimSpace(out) != "65534" {
				t.Errorf("the unmappable file inside: %q exit %d, want the overflow id 65534", out, code)
			}
		})
	}
}

// fifoGroupImage is the base image with /etc/group replaced by a FIFO.
func fifoGroupImage(t *testing.T, ref string) []byte {
	t.Helper()
	return imageWithLayers(t, ref, []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/.wh.group", Typeflag: tar.TypeReg, Mode: 0o644},
	}, []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/group", Typeflag: tar.TypeFifo, Mode: 0o644},
	})
}

// imageWithLayers is the base image with a layer of each list of (empty)
// entries on top, as an archive named ref.
func imageWithLayers(t *testing.T, ref string, entries ...[]*tar.Header) []byte {
	t.Helper()
	img, err := rootfsimage.FromDir(filepath.Join(filepath.Dir(archivePath()), "rootfs"), rootfsimage.Options{TempDir: env.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	var layers []v1.Layer
	for _, hs := range entries {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			h.ModTime = time.Unix(1700000000, 0)
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	layered, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(ref)
	var out bytes.Buffer
	if err := tarball.Write(tag, layered, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestAttackFifoInImage: an image whose /etc/group is a FIFO.
// containerd's oci.WithImageConfig opens the image's /etc/passwd and
// /etc/group for the agent's groups; open(2) of a FIFO waits for a writer
// and no context ends it. Expected: the create fails at once with
// FAILED_PRECONDITION (IMAGE_UNUSABLE) naming the file, leaves nothing,
// and the host user namespace and chowned paths behave the same.
func TestAttackFifoInImage(t *testing.T) {
	for _, c := range []struct {
		mapping   string
		hostUsers bool
	}{{"", false}, {runtime.RootFSChowned, false}, {"", true}} {
		t.Run(fmt.Sprintf("mapping=%s/host_users=%v", c.mapping, c.hostUsers), func(t *testing.T) {
			e := attackEnv(t, fmt.Sprintf("fifo-%d-%v", len(c.mapping), c.hostUsers), env.snapshotter, c.mapping)
			const ref = "test.berth.dev/fifo-group:1"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := e.rt.ImportImage(ctx, bytes.NewReader(fifoGroupImage(t, ref)), ""); err != nil {
				t.Fatalf("import: %v", err)
			}
			before := captureHostState(t, e, env.snapshotter)
			cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
			defer ccancel()
			_, err := e.sandboxes.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{SandboxId: "fifo", Image: ref, HostUsers: c.hostUsers})
			wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, "", "/etc/group is a named pipe")
			after := captureHostState(t, e, env.snapshotter)
			for _, d := range newIn(before.snapshots, after.snapshots) {
				// A chowned copy of the image stays for its range's retry.
				if !strings.HasPrefix(d, "sha256:") || c.mapping != runtime.RootFSChowned {
					t.Errorf("snapshot left by the refused create: %q", d)
				}
			}
			if len(newIn(before.mounts, after.mounts))+len(newIn(before.dirs, after.dirs))+len(newIn(before.containers, after.containers)) > 0 {
				t.Errorf("left by the refused create: mounts %q dirs %q containers %q", newIn(before.mounts, after.mounts), newIn(before.dirs, after.dirs), newIn(before.containers, after.containers))
			}
		})
	}
}

// TestAttackFifoUserDB: CreateSandbox with a user name reads the image's
// /etc/passwd and /etc/group itself before any container exists; an
// image (a tenant's committed snapshot, say) whose /etc/group is a FIFO
// must not make that open(2) wait for a writer forever, holding a mount
// and a goroutine of berthd per call. Expected: FAILED_PRECONDITION
// IMAGE_UNUSABLE naming the file, at once.
func TestAttackFifoUserDB(t *testing.T) {
	e := attackEnv(t, "fifo-user", env.snapshotter, "")
	const ref = "test.berth.dev/fifo-group-user:1"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.rt.ImportImage(ctx, bytes.NewReader(fifoGroupImage(t, ref)), ""); err != nil {
		t.Fatalf("import: %v", err)
	}
	for _, user := range []string{"root", "root:root", "0:root"} {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := e.sandboxes.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{Image: ref, User: user})
		ccancel()
		wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, "", "/etc/group is a named pipe")
	}
	// An /etc/passwd that leads out of the image's root, or in a loop, is
	// the image's fault too: no host file is read, no INTERNAL error.
	for _, target := range []string{"../../../../../etc/shadow", "/etc/shadow", "passwd"} {
		ref := "test.berth.dev/passwd-link:" + strconv.Itoa(len(target))
		archive := imageWithLayers(t, ref, []*tar.Header{
			{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "etc/.wh.passwd", Typeflag: tar.TypeReg, Mode: 0o644},
		}, []*tar.Header{
			{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "etc/passwd", Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777},
		})
		if _, err := e.rt.ImportImage(ctx, bytes.NewReader(archive), ""); err != nil {
			t.Fatalf("import: %v", err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := e.sandboxes.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{Image: ref, User: "root"})
		ccancel()
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonImageUnusable {
			t.Errorf("CreateSandbox as root of an image whose /etc/passwd links to %s: %v, want FAILED_PRECONDITION IMAGE_UNUSABLE", target, err)
		}
	}
}

// TestAttackContainerdLabels: labels containerd acts on (garbage
// collection roots and references) are refused at create and in
// selectors; look-alikes containerd ignores are kept as plain labels.
func TestAttackContainerdLabels(t *testing.T) {
	e := attackEnv(t, "labels", env.snapshotter, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, k := range []string{"containerd.io/gc.root", "containerd.io/gc.ref.snapshot." + env.snapshotter, "containerd.io/gc.ref.snapshot." + env.snapshotter + "/x", "containerd.io/gc.ref.content.l.0", "containerd.io/restart.status"} {
		_, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Labels: map[string]string{k: "sha256:" + strings.Repeat("0", 64)}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("label %q: %v, want INVALID_ARGUMENT", k, err)
		}
	}
	sb := attackCreate(t, e, &berthv1.CreateSandboxRequest{Labels: map[string]string{"Containerd.io/gc.root": "x", "containerd.iox/gc.root": "y"}})
	got := sb.GetLabels()
	t.Logf("look-alike labels kept: %v", got)
	if _, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{LabelSelector: map[string]string{"containerd.io/gc.ref.snapshot." + env.snapshotter: sb.GetId()}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a selector on containerd's label: %v, want INVALID_ARGUMENT", err)
	}
}

// TestAttackEscapedIDReadsOtherSandbox: a process that escaped sandbox A
// holds A's host ids. Sandbox B's idmapped root is mounted under
// STATE_DIR/s/B/root, and STATE_DIR, STATE_DIR/s and STATE_DIR/s/B are
// 0711: any host id passes. (containerd's bundle directory, where the
// root of a chowned sandbox is mounted, is 0710 with the group of that
// sandbox's root.) A's id reads what B's workload wrote with the default
// umask, and runs B's setuid-root files as B's root host id.
// Expected: another sandbox's host ids reach nothing of B's root.
func TestAttackEscapedIDReadsOtherSandbox(t *testing.T) {
	for _, mapping := range []string{"", runtime.RootFSChowned} {
		t.Run("mapping="+mapping, func(t *testing.T) {
			e := attackEnv(t, "esc-"+fmt.Sprint(len(mapping)), env.snapshotter, mapping)
			a := attackCreate(t, e, nil)
			b := attackCreate(t, e, nil)
			if _, _, code := attackRun(t, e, b.GetId(), "echo api-key-of-b >/tmp/secret && cp /bin/bash /tmp/rb && chmod 4755 /tmp/rb"); code != 0 {
				t.Fatal("B's workload")
			}
			rootB := filepath.Join(e.stateDir, "s", b.GetId(), "root")
			if mapping == runtime.RootFSChowned {
				rootB = filepath.Join(env.containerdDir, "state", "io.containerd.runtime.v2.task", e.ns, b.GetId(), "rootfs")
			}
			uidA := int(a.GetHostIdBase())
			got, err := hostRunAs(uidA, "cat", filepath.Join(rootB, "tmp", "secret"))
			t.Logf("mapping %q: host uid %d (A's root) reads B's /tmp/secret at %s: %q %v", mapping, uidA, rootB, got, err)
			if err == nil && got == "api-key-of-b" {
				t.Errorf("mapping %q: sandbox A's host id reads sandbox B's files through %s", mapping, rootB)
			}
			logB := filepath.Join(e.stateDir, "s", b.GetId(), "agent.log")
			if st, err := os.Stat(logB); err != nil {
				t.Errorf("B's agent log: %v", err)
			} else if st.Mode().Perm() != 0o600 {
				t.Errorf("B's agent log has mode %v, want 0600", st.Mode().Perm())
			}
			if got, err := hostRunAs(uidA, "cat", logB); err == nil {
				t.Errorf("sandbox A's host id reads B's agent log (%d bytes)", len(got))
			}
			got, err = hostRunAs(uidA, filepath.Join(rootB, "tmp", "rb"), "-p", "-c", "echo $EUID")
			t.Logf("mapping %q: host uid %d runs B's setuid file: %q %v", mapping, uidA, got, err)
			if err == nil && got == fmt.Sprint(b.GetHostIdBase()) {
				t.Errorf("mapping %q: sandbox A's host id becomes sandbox B's root id %d through B's setuid file", mapping, b.GetHostIdBase())
			}
		})
	}
}

// TestAttackSnapshotterChangedUnderSandbox: berthd restarted with another
// --snapshotter while sandboxes live. A chowned sandbox's container names
// its snapshotter and snapshot; an idmapped one's names neither (only the
// garbage-collection label's key does), and RestartTask and Delete use
// the running berthd's snapshotter.
// Expected: the sandbox's task restarts on its own snapshot, or a clear
// error; its delete removes its snapshot.
func TestAttackSnapshotterChangedUnderSandbox(t *testing.T) {
	need(t)
	if env.snapshotter != "btrfs" {
		t.Skip("needs the btrfs main snapshotter")
	}
	rt1, _, _ := newNamespaceRuntimeWith(t, "snch", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, _ := os.Open(archivePath())
	if _, err := rt1.ImportImage(ctx, f, ""); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := rt1.Create(ctx, runtime.SandboxSpec{ID: "snch", Image: baseImage, PidsLimit: 64}); err != nil {
		t.Fatal(err)
	}
	sb, err := rt1.Get(ctx, "snch")
	if err != nil {
		t.Fatal(err)
	}
	rt2, ns, _ := newNamespaceRuntimeWith(t, "snch", func(c *runtime.Config) { c.Snapshotter = "overlayfs" })
	if err := rt2.Kill(ctx, "snch", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		s, _ := rt2.Get(ctx, "snch")
		if !s.Running {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	root := filepath.Join(env.dir, "snch", "s", "snch", "root")
	mount.UnmountAll(root, unix.MNT_DETACH) // a reboot
	_, err = rt2.RestartTask(ctx, "snch", sb.TaskPID)
	t.Logf("RestartTask under another snapshotter: %v", err)
	if err := rt2.Delete(ctx, "snch"); err != nil {
		t.Errorf("Delete under another snapshotter: %v", err)
	}
	collectGarbage(t, ns)
	cc, _ := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	defer cc.Close()
	var left []string
	cc.SnapshotService("btrfs").Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Name == "snch" {
			left = append(left, i.Name)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("the sandbox's btrfs snapshot is left after its delete and a GC: %v", left)
	}
}
