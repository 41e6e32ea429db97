package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"
)

// How a sandbox in a user namespace of its own sees its image's files as
// its own (labelRootFS).
const (
	// RootFSIDMapped: the sandbox's own copy-on-write snapshot of the
	// image, mounted by berthd with its ids mapped at mount time
	// (mount_setattr(2) MOUNT_ATTR_IDMAP; on overlayfs the image's lower
	// layers are idmapped, as the kernel's overlayfs documentation allows,
	// and the sandbox's upper layer is a plain directory of the range).
	// Nothing of the image is copied, so creation costs the same for any
	// image. What the workload writes lands on disk on btrfs under the
	// image's own ids (container id n is stored as n), on overlayfs in the
	// upper layer under the range's host ids (n is stored as base+n).
	RootFSIDMapped = "idmapped"
	// RootFSChowned: a copy of the image's snapshot chowned into the
	// range, one per range (withRemappedSnapshot): its cost grows with the
	// image. Used where the kernel or file system cannot idmap
	// (Runtime.IDMapped says why) and by sandboxes of berthds before
	// idmapped roots.
	RootFSChowned = "chowned"
)

// RootIDMappingAuto (Config.RootIDMapping) gives sandboxes RootFSIDMapped
// roots where berthd's probe at start finds that the kernel and the
// snapshotter's file system can idmap, RootFSChowned ones elsewhere.
const RootIDMappingAuto = ""

// ErrNoIDMap means sandboxes get chowned copies of their image rather than
// idmapped roots (Runtime.IDMapped); the error wrapping it says why.
var ErrNoIDMap = errors.New("no idmapped roots")

// labelRootFS records RootFSIDMapped or RootFSChowned on a sandbox with a
// user namespace; absent on sandboxes that run in the host's user
// namespace, and on those made before berthd recorded it (chowned).
const labelRootFS = LabelPrefix + "rootfs"

// labelGCRefSnapshot is containerd's garbage-collection reference from a
// container to a snapshot (containerd's docs/garbage-collection.md): an
// idmapped sandbox's container has no snapshot key (containerd would hand
// the un-mapped snapshot to the shim), so the label keeps its snapshot.
const labelGCRefSnapshot = "containerd.io/gc.ref.snapshot."

// rootDir is where berthd mounts the root file system of a sandbox with
// RootFSIDMapped; the container's spec names it as its root (an absolute
// root path, which runc uses as it is).
func (r *Runtime) rootDir(id string) string { return filepath.Join(r.hostDir(id), "root") }

// idMapOptions are containerd's mount options (core/mount) that map
// container ids 0-IDRangeSize-1 to host ids base onwards.
func idMapOptions(base uint32) []string {
	m := fmt.Sprintf("0:%d:%d", base, IDRangeSize)
	return []string{"uidmap=" + m, "gidmap=" + m}
}

// withIDMappedRoot prepares sandbox id's own snapshot (key id) of image
// (of snapshotter key parent instead when it is not "": a stored snapshot),
// its files replaced by a writable snapshot of subvolume from when that is
// not "" (a fork's copy, fillRoot), and mounts it at rootDir with ids mapped into the range at host id base
// (mountRoot), before the spec is made: the image's /etc/passwd is read
// through it. The container records neither snapshotter nor snapshot key
// (containerd would hand the shim the snapshot without the mapping); its
// spec's root is rootDir. A snapshot of the key left by a create that did
// not finish is made anew.
func (r *Runtime) withIDMappedRoot(id string, image containerd.Image, parent, from string, base uint32) containerd.NewContainerOpts {
	return func(ctx context.Context, client *containerd.Client, c *containers.Container) error {
		c.Snapshotter = ""
		if err := r.prepareRoot(ctx, client, id, image, parent, from); err != nil {
			return err
		}
		c.Image = image.Name()
		// Never a mount of an earlier sandbox of the id whose delete
		// failed midway.
		if err := unmountRoot(r.rootDir(id)); err != nil {
			return err
		}
		return r.mountRoot(ctx, id, base)
	}
}

// withCopiedRoot gives a gVisor sandbox id its own snapshot (key id) of
// snapshotter key parent (a stored snapshot's; of image when "") whose
// files are replaced by a writable snapshot of subvolume from when that is
// not "" (a fork's copy, fillRoot). Unlike withIDMappedRoot the container
// records the snapshotter and key: the shim mounts the snapshot as it is,
// since gVisor's gofer stores the workload's files under their own ids
// (container id n as n), as an idmapped root on btrfs does.
func (r *Runtime) withCopiedRoot(id string, image containerd.Image, parent, from string) containerd.NewContainerOpts {
	return func(ctx context.Context, client *containerd.Client, c *containers.Container) error {
		if err := r.prepareRoot(ctx, client, id, image, parent, from); err != nil {
			return err
		}
		c.Snapshotter, c.SnapshotKey, c.Image = r.cfg.Snapshotter, id, image.Name()
		return nil
	}
}

// prepareRoot prepares snapshot key id of snapshotter key parent (of
// image's unpacked layers when parent is "") and, when from is not "",
// replaces its files by a writable snapshot of subvolume from (fillRoot).
// A snapshot of the key left by a create that did not finish is made anew.
func (r *Runtime) prepareRoot(ctx context.Context, client *containerd.Client, id string, image containerd.Image, parent, from string) error {
	if parent == "" {
		diffIDs, err := image.RootFS(ctx)
		if err != nil {
			return fmt.Errorf("image %s root file system: %w", image.Name(), err)
		}
		parent = identity.ChainID(diffIDs).String()
	}
	sn := client.SnapshotService(r.cfg.Snapshotter)
	if _, err := sn.Prepare(ctx, id, parent); err != nil {
		if !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("prepare snapshot %s of image %s: %w", id, image.Name(), err)
		}
		if _, err := client.ContainerService().Get(ctx, id); err == nil {
			return fmt.Errorf("%w: %s", errdefs.ErrAlreadyExists, id)
		}
		// A create of the id by another berthd on this namespace is
		// under way: its snapshot is younger than a create's call
		// to containerd lasts.
		if info, err := sn.Stat(ctx, id); err == nil && time.Since(info.Created) < r.cfg.CallBudget {
			return fmt.Errorf("%w: %s: another create of the id is under way (its snapshot is %v old)", errdefs.ErrAlreadyExists, id, time.Since(info.Created).Round(time.Millisecond))
		}
		// Left by a create that did not finish, perhaps of another
		// image or id range: a new one costs nothing.
		if err := unmountRoot(r.rootDir(id)); err != nil {
			return err
		}
		if err := sn.Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove stale snapshot %s: %w", id, err)
		}
		if _, err := sn.Prepare(ctx, id, parent); err != nil {
			return fmt.Errorf("prepare snapshot %s of image %s: %w", id, image.Name(), err)
		}
	}
	if from != "" {
		if err := r.fillRoot(ctx, id, from); err != nil {
			return fmt.Errorf("snapshot %s from fork copy %s: %w", id, from, err)
		}
	}
	return nil
}

// mountRoot mounts the snapshot of sandbox id at rootDir with ids mapped
// into the range at host id base, unless it is mounted already (a task's
// restart). On overlayfs the upper layer's root is chowned into the
// range first: the merged root takes its owner from it.
func (r *Runtime) mountRoot(ctx context.Context, id string, base uint32) error {
	target := r.rootDir(id)
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create root mount point: %w", err)
	}
	switch mapped, err := idmappedAt(target); {
	case err != nil:
		return err
	case mapped:
		return nil
	}
	// Nothing, or what a partial unmount left: on btrfs the idmapped
	// mount is a clone stacked on a plain mount of the subvolume, and
	// umount(8) takes off only the clone.
	if err := unmountRoot(target); err != nil {
		return err
	}
	mounts, err := r.client.SnapshotService(r.cfg.Snapshotter).Mounts(ctx, id)
	if err != nil {
		return fmt.Errorf("mounts of snapshot %s: %w", id, err)
	}
	return mountIDMapped(mounts, target, base)
}

// mountIDMapped mounts mounts at target with ids mapped into the range at
// host id base.
func mountIDMapped(mounts []mount.Mount, target string, base uint32) error {
	mapped := make([]mount.Mount, len(mounts))
	for i, m := range mounts {
		if m.Type == "overlay" {
			for _, o := range m.Options {
				if upper, ok := strings.CutPrefix(o, "upperdir="); ok {
					if err := chownRootInto(upper, base); err != nil {
						return err
					}
				}
			}
		}
		m.Options = append(append([]string(nil), m.Options...), idMapOptions(base)...)
		mapped[i] = m
	}
	if err := mount.All(mapped, target); err != nil {
		unmountRoot(target)
		return fmt.Errorf("idmapped mount of the sandbox's root at %s: %w", target, err)
	}
	return nil
}

// chownRootInto moves directory dir (not its contents) from container
// ids to the range at host id base, unless it is in the range already.
func chownRootInto(dir string, base uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("upper layer %s: %w", dir, err)
	}
	if st.Uid >= IDRangeSize || st.Gid >= IDRangeSize {
		return nil
	}
	if err := os.Lchown(dir, int(base+st.Uid), int(base+st.Gid)); err != nil {
		return fmt.Errorf("chown upper layer %s into the sandbox's ids: %w", dir, err)
	}
	return nil
}

// idmappedAt reports whether the mount on top at target is idmapped
// (proc_pid_mountinfo(5) lists "idmapped" among its per-mount options);
// false when nothing is mounted there.
func idmappedAt(target string) (bool, error) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != target, false
	})
	if err != nil {
		return false, fmt.Errorf("mounts at the sandbox's root %s: %w", target, err)
	}
	if len(mounts) == 0 {
		return false, nil
	}
	// Mounts at one point are listed in the order they were made.
	top := mounts[len(mounts)-1]
	return slices.Contains(strings.Split(top.Options, ","), "idmapped"), nil
}

// unmountRoot unmounts everything at a sandbox's root mount point, if
// anything (lazily: a shim that still holds it does not fail a delete).
func unmountRoot(dir string) error {
	if err := mount.UnmountAll(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unmount the sandbox's root %s: %w", dir, err)
	}
	return nil
}

// IDMapped reports whether sandboxes in user namespaces get idmapped
// roots (RootFSIDMapped): nil when they do, otherwise why not — they then
// get chowned copies (RootFSChowned).
func (r *Runtime) IDMapped() error { return r.idmapErr }

// probeIDMap finds out, once at start, whether this kernel and the
// snapshotter's file system can give sandboxes idmapped roots: it
// prepares a one-layer snapshot holding a file owned by id 0, mounts a
// snapshot of it the way mountRoot does, and checks that the file reads
// as owned by the range's first host id. The snapshots live under a lease
// that expires, so a berthd that dies midway leaves nothing for long.
func (r *Runtime) probeIDMap(ctx context.Context) error {
	ctx, done, err := r.withLease(ctx, 10*time.Minute)
	if err != nil {
		return fmt.Errorf("lease for the probe: %w", err)
	}
	defer done(context.WithoutCancel(ctx))
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	key := "berth-idmap-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lower, err := sn.Prepare(ctx, key+"-lower", "")
	if err != nil {
		return fmt.Errorf("prepare a snapshot: %w", err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), key+"-lower")
	if err := mount.WithTempMount(ctx, lower, func(root string) error {
		return os.WriteFile(filepath.Join(root, "probe"), nil, 0o644)
	}); err != nil {
		return fmt.Errorf("write the probe layer: %w", err)
	}
	if err := sn.Commit(ctx, key+"-layer", key+"-lower"); err != nil {
		return fmt.Errorf("commit the probe layer: %w", err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), key+"-layer")
	mounts, err := sn.Prepare(ctx, key, key+"-layer")
	if err != nil {
		return fmt.Errorf("prepare a snapshot: %w", err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), key)
	target, err := os.MkdirTemp(r.cfg.StateDir, "idmap-probe-")
	if err != nil {
		return err
	}
	defer os.Remove(target)
	base := r.cfg.IDFirst
	if err := mountIDMapped(mounts, target, base); err != nil {
		return err
	}
	defer unmountRoot(target)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(target, "probe"), &st); err != nil {
		return fmt.Errorf("idmapped mount: %w", err)
	}
	if st.Uid != base || st.Gid != base {
		return fmt.Errorf("idmapped mount shows a file of id 0 as %d:%d, not %d:%d", st.Uid, st.Gid, base, base)
	}
	return nil
}

// CreateWorkLimit returns Config.CreateWorkLimit with its default.
func (r *Runtime) CreateWorkLimit() time.Duration { return r.cfg.CreateWorkLimit }

// createLeaseExpiry is how long what a create made under its lease (an
// unpacked layer, a chowned copy) outlives a create that was cut off, for
// its retry.
const createLeaseExpiry = time.Hour

// leaseID returns the id of the lease ctx carries.
func leaseID(ctx context.Context) string {
	id, _ := leases.FromContext(ctx)
	return id
}

// userDB are the files of an image's root that containerd's
// oci.WithImageConfig opens to find the user's ids and groups.
var userDB = []string{"etc/passwd", "etc/group"}

// withUserDBCheck fails with ErrImageUnusable when the root's /etc/passwd
// or /etc/group (symbolic links followed within the root) is there but is
// not a regular file: containerd's open(2) of a named pipe would wait for
// a writer forever, and no context ends it. The root is the idmapped
// mount the spec names, or else a read-only mount of the container's
// snapshot.
func withUserDBCheck(image string) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, c *containers.Container, s *oci.Spec) error {
		check := func(dir string) error {
			root, err := os.OpenRoot(dir)
			if err != nil {
				return fmt.Errorf("root of image %s: %w", image, err)
			}
			defer root.Close()
			for _, name := range userDB {
				// Missing or unresolvable: containerd's own lookup says so.
				if st, err := root.Stat(name); err == nil && !st.Mode().IsRegular() {
					return fmt.Errorf("%w: image %s: /%s is a %s, not a regular file", ErrImageUnusable, image, name, fileKind(st.Mode()))
				}
			}
			return nil
		}
		if s.Root != nil && filepath.IsAbs(s.Root.Path) {
			return check(s.Root.Path)
		}
		if c.Snapshotter == "" || c.SnapshotKey == "" {
			return nil
		}
		mounts, err := client.SnapshotService(c.Snapshotter).Mounts(ctx, c.SnapshotKey)
		if err != nil {
			return fmt.Errorf("mounts of snapshot %s: %w", c.SnapshotKey, err)
		}
		return mount.WithReadonlyTempMount(ctx, mounts, check)
	}
}

// fileKind names the type of a file of mode m for an error message.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "special file"
}
