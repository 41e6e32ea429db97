package runtime

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/plugins"
)

// Every sandbox that does not run in the host's user namespace gets ids
// 0-IDRangeSize-1 mapped to a range of host ids of its own:
// Config.IDFirst + k × IDRangeSize for a random slot k no other sandbox
// of the runtime holds. A range per sandbox, not one shared by all: a
// process that escapes one sandbox holds ids that own nothing of another
// sandbox's files and cannot signal or ptrace its processes. The image's
// files are mapped into the range at mount time (RootFSIDMapped, rootfs.go:
// runc 1.1 cannot, so berthd mounts the root itself); where the kernel or
// file system cannot, each range gets a chowned copy (RootFSChowned,
// withRemappedSnapshot), whose cost grows with the image.
const IDRangeSize = 65536

// labelIDBase records the host id a sandbox's root maps to.
const labelIDBase = LabelPrefix + "id-base"

// ErrNoIDRange means every id range is held by a sandbox.
var ErrNoIDRange = errors.New("no free user-namespace id range")

// idMaps returns the uid and gid mappings of a sandbox whose root is host
// id base.
func idMaps(base uint32) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: IDRangeSize}}
}

// allocIDBase reserves a free id range, chosen at random, for sandbox id and returns
// its first host id. Ranges held by containers in containerd are taken, as
// are those reserved by creates still in progress; release gives a
// reservation back once the container records it (or the create failed).
func (r *Runtime) allocIDBase(ctx context.Context, id string) (base uint32, release func(), err error) {
	r.idMu.Lock()
	defer r.idMu.Unlock()
	used := make(map[uint32]bool)
	// One read: the records listed carry their labels.
	records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q", labelIDBase))
	if err != nil {
		return 0, nil, fmt.Errorf("list id ranges: %w", err)
	}
	for _, c := range records {
		if b, err := strconv.ParseUint(c.Labels[labelIDBase], 10, 32); err == nil {
			used[uint32(b)] = true
		}
	}
	for b := range r.idReserved {
		used[b] = true
	}
	// A retry of a create that failed takes its range again, if free:
	// what the failed one remapped into it is reused (remappedImage).
	if b, ok := r.idRetry[id]; ok && !used[b] {
		r.idReserved[b] = id
		return b, r.releaseIDBase(b), nil
	}
	// A random free range, not the lowest: a remapped copy's work
	// snapshot left by a berthd that died midway stays until containerd's
	// garbage collector runs, and the next create of the same range would
	// collide with it.
	first := rand.Uint32N(r.cfg.IDRanges)
	for i := uint32(0); i < r.cfg.IDRanges; i++ {
		b := r.cfg.IDFirst + ((first+i)%r.cfg.IDRanges)*IDRangeSize
		if !used[b] {
			r.idReserved[b] = id
			return b, r.releaseIDBase(b), nil
		}
	}
	return 0, nil, fmt.Errorf("%w: all %d ranges from host id %d are held", ErrNoIDRange, r.cfg.IDRanges, r.cfg.IDFirst)
}

// releaseIDBase returns the release of allocIDBase's reservation of b.
func (r *Runtime) releaseIDBase(b uint32) func() {
	return func() {
		r.idMu.Lock()
		defer r.idMu.Unlock()
		delete(r.idReserved, b)
	}
}

// maxIDRetries bounds how many failed creates' ranges are remembered for
// their retries.
const maxIDRetries = 1024

// rememberIDBase notes that the create of sandbox id with range base
// failed (ok false) or succeeded (ok true): a retry of a failed one takes
// the same range.
func (r *Runtime) rememberIDBase(id string, base uint32, ok bool) {
	r.idMu.Lock()
	defer r.idMu.Unlock()
	if ok {
		delete(r.idRetry, id)
		return
	}
	if len(r.idRetry) >= maxIDRetries {
		for k := range r.idRetry {
			delete(r.idRetry, k)
			break
		}
	}
	r.idRetry[id] = base
}

// withRuntime sets the container's runtime options: for RuntimeGVisor the
// runc shim runs Config.GVisorBinary (a wrapper that runs runsc with
// --network=none --host-uds=all) instead of runc.
func (r *Runtime) withRuntime(spec SandboxSpec) containerd.NewContainerOpts {
	if spec.runtime() != RuntimeGVisor {
		return containerd.WithRuntime(plugins.RuntimeRuncV2, nil)
	}
	return containerd.WithRuntime(plugins.RuntimeRuncV2, &options.Options{BinaryName: r.cfg.GVisorBinary})
}

// GVisorEnabled reports whether gvisor sandboxes can be created: a runsc
// wrapper is configured.
func (r *Runtime) GVisorEnabled() bool { return r.cfg.GVisorBinary != "" }

// forceDeleteGVisor removes a gVisor container that runsc cannot kill: one
// whose start failed stays "created", and the shim's kill then fails
// ("sandbox is not running"), so the task can never be deleted. runsc's
// own `delete -force` (in the runc shim's state root for the namespace)
// removes it, its sandbox and gofer processes with it; the task's delete
// then succeeds. It does nothing for other runtimes.
func (r *Runtime) forceDeleteGVisor(ctx context.Context, container containerd.Container) error {
	labels, err := container.Labels(ctx)
	if err != nil || labels[labelRuntime] != RuntimeGVisor || r.cfg.GVisorBinary == "" {
		return nil
	}
	root := filepath.Join("/run/containerd/runc", r.cfg.Namespace)
	out, err := exec.CommandContext(ctx, r.cfg.GVisorBinary, "--root="+root, "delete", "-force", container.ID()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc delete -force %s: %v: %s", container.ID(), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pingGroups is net.ipv4.ping_group_range for the sandbox: every group.
func pingGroups(spec SandboxSpec) string {
	if spec.userns() {
		return fmt.Sprintf("0 %d", IDRangeSize-1)
	}
	return "0 2147483647"
}

// remappedImage returns the snapshot of image's root filesystem whose
// files are chowned into the range at host id base (container id n is
// host id base+n), committed as <chain id>-<base>-<base> and shared by
// the sandboxes of the range; it makes it when missing. It is long work:
// ctx bounds the chown walk, not the call budget (which bounds the final
// commit alone), and the snapshots live under ctx's lease. Work cut off by ctx stays in its work snapshot (<name>-remap),
// and the next call with the same range goes on from where it stopped;
// a failure of another kind removes it.
//
// It does what containerd's WithUserNSRemappedSnapshot does, except that
// a file with several hard links is chowned once: containerd's walk
// chowns by path, so a second link of an inode it already moved reads the
// host id and fails ("container ID … cannot be mapped to a host ID"),
// which made every image with hard links (Debian's perl, git, python)
// impossible to run in a user namespace.
func (r *Runtime) remappedImage(ctx context.Context, image containerd.Image, base uint32) (string, error) {
	diffIDs, err := image.RootFS(ctx)
	if err != nil {
		return "", fmt.Errorf("remap snapshot: image root filesystem: %w", err)
	}
	parent := identity.ChainID(diffIDs).String()
	remapped := fmt.Sprintf("%s-%d-%d", parent, base, base)
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	if _, err := sn.Stat(ctx, remapped); err == nil {
		return remapped, nil
	} else if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("remap snapshot: %w", err)
	}
	work := remapped + "-remap"
	mounts, err := sn.Prepare(ctx, work, parent)
	if errdefs.IsAlreadyExists(err) {
		mounts, err = sn.Mounts(ctx, work)
	}
	if err != nil {
		return "", fmt.Errorf("remap snapshot: prepare: %w", err)
	}
	err = mount.WithTempMount(ctx, mounts, func(root string) error { return chownInto(ctx, root, base) })
	if err == nil {
		// The walk is done: the commit (which computes the snapshot's
		// usage, a walk of its own) is one request that must not be cut
		// off by ctx's limit — btrfs's, cut off, lost the work snapshot
		// and the next create started the copy over — so the call budget
		// bounds it, under ctx's lease.
		commit, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CallBudget)
		err = sn.Commit(commit, remapped, work)
		cancel()
	}
	if err != nil {
		if ctx.Err() == nil {
			sn.Remove(context.WithoutCancel(ctx), work)
		}
		return "", fmt.Errorf("remap snapshot of image %s into host ids from %d: %w", image.Name(), base, err)
	}
	return remapped, nil
}

// withSnapshotOf prepares the container's snapshot (key id) from the
// committed snapshot parent, for image.
func withSnapshotOf(id string, image containerd.Image, parent string) containerd.NewContainerOpts {
	return func(ctx context.Context, client *containerd.Client, c *containers.Container) error {
		if _, err := client.SnapshotService(c.Snapshotter).Prepare(ctx, id, parent); err != nil {
			return fmt.Errorf("prepare snapshot %s: %w", id, err)
		}
		c.SnapshotKey = id
		c.Image = image.Name()
		return nil
	}
}

// chownInto moves every file under root from container id n to host id
// base+n (lchown(2): a symlink itself, never its target) and keeps the
// setuid, setgid and sticky bits that chown(2) clears. A file in the
// range already stays: a walk cut off by ctx moved it, or it is a hard
// link of a file moved before. Links are never judged by inode number:
// through overlayfs, the copy-up of one name is a new file, and the other
// names keep the lower file's st_ino and owner. An id outside the range
// is an error naming the file.
func chownInto(ctx context.Context, root string, base uint32) error {
	return filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid-base < IDRangeSize && st.Gid-base < IDRangeSize {
			return nil // chowned by a walk that was cut off
		}
		if st.Uid >= IDRangeSize || st.Gid >= IDRangeSize {
			return fmt.Errorf("%w: %s is owned by %d:%d, outside the sandbox's ids 0-%d", ErrImageUnusable, strings.TrimPrefix(path, root), st.Uid, st.Gid, IDRangeSize-1)
		}
		if err := os.Lchown(path, int(base+st.Uid), int(base+st.Gid)); err != nil {
			return err
		}
		if mode := info.Mode(); mode&os.ModeSymlink == 0 && mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
			return os.Chmod(path, mode)
		}
		return nil
	})
}
