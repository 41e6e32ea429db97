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
	containers, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q", labelIDBase))
	if err != nil {
		return 0, nil, fmt.Errorf("list id ranges: %w", err)
	}
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil {
			continue // deleted meanwhile
		}
		if b, err := strconv.ParseUint(labels[labelIDBase], 10, 32); err == nil {
			used[uint32(b)] = true
		}
	}
	for b := range r.idReserved {
		used[b] = true
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
			return b, func() {
				r.idMu.Lock()
				defer r.idMu.Unlock()
				delete(r.idReserved, b)
			}, nil
		}
	}
	return 0, nil, fmt.Errorf("%w: all %d ranges from host id %d are held", ErrNoIDRange, r.cfg.IDRanges, r.cfg.IDFirst)
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

// withRemappedSnapshot prepares the container's snapshot (key id) from a
// copy of image's root filesystem whose files are chowned into the range
// at host id base: container id n becomes host id base+n. The copy is
// committed as <chain id>-<base>-<base> and shared by containers of the
// same range.
//
// It does what containerd's WithUserNSRemappedSnapshot does, except that
// a file with several hard links is chowned once: containerd's walk
// chowns by path, so a second link of an inode it already moved reads the
// host id and fails ("container ID … cannot be mapped to a host ID"),
// which made every image with hard links (Debian's perl, git, python)
// impossible to run in a user namespace. A failed remap removes its work
// snapshot.
func withRemappedSnapshot(id string, image containerd.Image, base uint32) containerd.NewContainerOpts {
	return func(ctx context.Context, client *containerd.Client, c *containers.Container) error {
		diffIDs, err := image.RootFS(ctx)
		if err != nil {
			return fmt.Errorf("remap snapshot: image root filesystem: %w", err)
		}
		parent := identity.ChainID(diffIDs).String()
		remapped := fmt.Sprintf("%s-%d-%d", parent, base, base)
		sn := client.SnapshotService(c.Snapshotter)
		if _, err := sn.Stat(ctx, remapped); err != nil {
			if !errdefs.IsNotFound(err) {
				return fmt.Errorf("remap snapshot: %w", err)
			}
			work := remapped + "-remap"
			mounts, err := sn.Prepare(ctx, work, parent)
			if err != nil {
				return fmt.Errorf("remap snapshot: prepare: %w", err)
			}
			err = mount.WithTempMount(ctx, mounts, func(root string) error { return chownInto(root, base) })
			if err == nil {
				err = sn.Commit(ctx, remapped, work)
			}
			if err != nil {
				sn.Remove(context.WithoutCancel(ctx), work)
				return fmt.Errorf("remap snapshot of image %s into host ids from %d: %w", image.Name(), base, err)
			}
		}
		if _, err := sn.Prepare(ctx, id, remapped); err != nil {
			return fmt.Errorf("remap snapshot: prepare %s: %w", id, err)
		}
		c.SnapshotKey = id
		c.Image = image.Name()
		return nil
	}
}

// chownInto moves every file under root from container id n to host id
// base+n (lchown(2): a symlink itself, never its target), each inode once,
// and keeps the setuid, setgid and sticky bits that chown(2) clears. An id
// outside the range is an error naming the file.
func chownInto(root string, base uint32) error {
	type inode struct{ dev, ino uint64 }
	done := make(map[inode]bool)
	return filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Nlink > 1 && !info.IsDir() {
			key := inode{uint64(st.Dev), st.Ino}
			if done[key] {
				return nil
			}
			done[key] = true
		}
		if st.Uid >= IDRangeSize || st.Gid >= IDRangeSize {
			return fmt.Errorf("%s is owned by %d:%d, outside the sandbox's ids 0-%d", strings.TrimPrefix(path, root), st.Uid, st.Gid, IDRangeSize-1)
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
