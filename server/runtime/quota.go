package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

// ErrDiskQuotaUnsupported means sandboxes cannot get a disk quota here: the
// snapshotter is not containerd's btrfs snapshotter on a btrfs with quotas
// enabled.
var ErrDiskQuotaUnsupported = errors.New("disk quotas are not available")

// quotaSnapshotter is the snapshotter whose snapshots berth can cap: each
// is a btrfs subvolume with its own quota group.
const quotaSnapshotter = "btrfs"

// openDiskQuota finds the btrfs snapshotter's root through containerd's
// introspection service and opens its file system for quota limits. It
// returns an error wrapping ErrDiskQuotaUnsupported that says why and what
// fixes it when quotas cannot work; other errors are containerd's.
func (r *Runtime) openDiskQuota(ctx context.Context) (*qgroup.FS, error) {
	if r.cfg.Snapshotter != quotaSnapshotter {
		return nil, fmt.Errorf("%w: snapshotter %s has no per-sandbox quota; berth enforces disk_bytes with the btrfs snapshotter (scripts/btrfs-quota.sh, berthd --snapshotter btrfs)", ErrDiskQuotaUnsupported, r.cfg.Snapshotter)
	}
	root, err := r.btrfsRoot(ctx)
	if errors.Is(err, errNoBtrfs) {
		return nil, fmt.Errorf("%w: %w", ErrDiskQuotaUnsupported, err)
	}
	if err != nil {
		return nil, err
	}
	fs, err := qgroup.Open(root)
	if err != nil {
		return nil, fmt.Errorf("%w: btrfs snapshotter root %s: %v", ErrDiskQuotaUnsupported, root, err)
	}
	return fs, nil
}

// errNoBtrfs means containerd's btrfs snapshotter is missing or did not
// start (btrfsRoot).
var errNoBtrfs = errors.New("no btrfs snapshotter")

// btrfsRoot asks containerd's introspection service where its btrfs
// snapshotter keeps its subvolumes (active/ID, snapshots/ID). It fails
// with errNoBtrfs (wrapped, saying why and what fixes it) or containerd's
// error.
func (r *Runtime) btrfsRoot(ctx context.Context) (string, error) {
	resp, err := r.client.IntrospectionService().Plugins(ctx, "type==io.containerd.snapshotter.v1,id=="+quotaSnapshotter)
	if err != nil {
		return "", fmt.Errorf("ask containerd for its btrfs snapshotter: %w", err)
	}
	if len(resp.GetPlugins()) == 0 {
		return "", fmt.Errorf("%w: containerd has no btrfs snapshotter", errNoBtrfs)
	}
	p := resp.GetPlugins()[0]
	if e := p.GetInitErr(); e != nil {
		return "", fmt.Errorf("%w: containerd's btrfs snapshotter did not start: %s (its root_path must be a btrfs: scripts/btrfs-quota.sh)", errNoBtrfs, e.GetMessage())
	}
	root := p.GetExports()["root"]
	if root == "" {
		return "", fmt.Errorf("%w: containerd's btrfs snapshotter does not say where its root is", errNoBtrfs)
	}
	return root, nil
}

// DiskQuota reports whether sandboxes can get a disk quota: nil when they
// can, else an error wrapping ErrDiskQuotaUnsupported that says why.
func (r *Runtime) DiskQuota() error { return r.quotaErr }

// DiskPool returns the btrfs snapshotter's root, whose file system holds
// every sandbox's writable snapshot and so all disk quotas, and that file
// system's size in bytes (statfs(2)). It fails with the error of DiskQuota
// when sandboxes get no disk quotas.
func (r *Runtime) DiskPool() (root string, sizeBytes uint64, err error) {
	if r.quota == nil {
		return "", 0, r.quotaErr
	}
	size, err := r.quota.Size()
	if err != nil {
		return "", 0, err
	}
	return r.quota.Dir(), size, nil
}

// limitDisk caps the exclusive bytes of sandbox id's writable snapshot and
// returns once the cap is in force (qgroup.FS.Limit); an accounting the
// kernel cannot repair in time is ErrDiskQuotaUnsupported.
func (r *Runtime) limitDisk(ctx context.Context, id string, bytes uint64) error {
	if r.quota == nil {
		return r.quotaErr
	}
	subvol, err := r.subvolume(ctx, id)
	if err != nil {
		return err
	}
	if err := r.quota.Limit(ctx, subvol, bytes); err != nil {
		if errors.Is(err, qgroup.ErrInconsistent) {
			return fmt.Errorf("%w: %v", ErrDiskQuotaUnsupported, err)
		}
		return err
	}
	return nil
}

// diskUsed returns the bytes sandbox id's writable snapshot holds beyond
// its image: what its disk quota counts.
func (r *Runtime) diskUsed(ctx context.Context, id string) (uint64, error) {
	if r.quota == nil {
		return 0, r.quotaErr
	}
	subvol, err := r.subvolume(ctx, id)
	if err != nil {
		return 0, err
	}
	return r.quota.Exclusive(subvol)
}

// subvolume returns the btrfs subvolume id of sandbox id's writable
// snapshot, from the snapshotter's mount of it.
func (r *Runtime) subvolume(ctx context.Context, id string) (uint64, error) {
	mounts, err := r.client.SnapshotService(r.cfg.Snapshotter).Mounts(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("mounts of snapshot %s: %w", id, err)
	}
	for _, m := range mounts {
		if subvol, ok := qgroup.SubvolID(m.Options); ok && m.Type == "btrfs" {
			return subvol, nil
		}
	}
	return 0, fmt.Errorf("snapshot %s is not a btrfs subvolume (mounts %v)", id, mounts)
}

// ioctlTypeBtrfs is the type byte of btrfs's ioctl numbers (bits 8-15 of
// the request, BTRFS_IOCTL_MAGIC).
const ioctlTypeBtrfs = 0x94

// btrfsIoctlsAllowed are the numbers (bits 0-7) of the ioctls of btrfs's
// type that sandboxes keep: FICLONE (9), FICLONERANGE (13) and
// FIDEDUPERANGE (54), the generic reflink and dedupe calls that cp(1) uses;
// they share extents and take no space.
var btrfsIoctlsAllowed = []uint64{0x09, 0x0d, 0x36}

// withQuotaSafeIoctls narrows the seccomp profile so that no process in the
// sandbox can step around its disk quota: ioctl(2) is allowed for every
// request except btrfs's own, but for btrfsIoctlsAllowed. Among those
// refused (EPERM, the profile's default action) are subvolume and snapshot
// creation, which any user may do in a directory they can write on btrfs
// (BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SNAP_CREATE and their v2): a new
// subvolume has a quota group of its own that the sandbox's limit does not
// cover.
//
// Rules with an argument cannot subtract from an unconditional allow
// (libseccomp lets the unconditional one win), so ioctl is removed from the
// profile's unconditional allows and allowed again by rules that match the
// request's type byte unless it is 0x94: one rule per bit, each matching the
// requests whose bit differs from 0x94's, so any other type matches at least
// one. The comparisons are masked to the low 32 bits, which is all the
// kernel reads of the request (ioctl's cmd is an unsigned int): high bits
// set by the caller cannot slip a refused request past them. A profile that
// does not allow ioctl unconditionally is left as it is.
func withQuotaSafeIoctls(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return nil
	}
	sc := s.Linux.Seccomp
	found := false
	kept := make([]specs.LinuxSyscall, 0, len(sc.Syscalls)+8+len(btrfsIoctlsAllowed))
	for _, rule := range sc.Syscalls {
		if rule.Action == specs.ActAllow && len(rule.Args) == 0 && slices.Contains(rule.Names, "ioctl") {
			found = true
			rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool { return n == "ioctl" })
			if len(rule.Names) == 0 {
				continue
			}
		}
		kept = append(kept, rule)
	}
	if !found {
		return nil
	}
	sc.Syscalls = kept
	allow := func(mask, value uint64) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: mask, ValueTwo: value, Op: specs.OpMaskedEqual}}}
	}
	for bit := range 8 {
		mask := uint64(1) << (8 + bit)
		differs := mask // the bit set where 0x94 has it clear
		if ioctlTypeBtrfs&(1<<bit) != 0 {
			differs = 0
		}
		sc.Syscalls = append(sc.Syscalls, allow(mask, differs))
	}
	for _, nr := range btrfsIoctlsAllowed {
		sc.Syscalls = append(sc.Syscalls, allow(0xffff, ioctlTypeBtrfs<<8|nr))
	}
	return nil
}

// PoolMetadata reports whether deleting a sandbox frees the pool even
// when the pool is full: nil when the btrfs snapshotter's own record of
// its snapshots (root/metadata.db, a bolt database) lives on another file
// system, else an error saying where it is and what moves it. containerd
// records a snapshot's removal there before it deletes the subvolume; on
// a full pool that write fails (ENOSPC), the subvolume stays, and the pool
// stays full. scripts/btrfs-quota.sh up puts the file off the pool.
func (r *Runtime) PoolMetadata() error {
	if r.quota == nil {
		return r.quotaErr
	}
	return metadataOffPool(r.quota.Dir())
}

// metadataOffPool checks that root/metadata.db, followed through links,
// is on another file system than root.
func metadataOffPool(root string) error {
	db := filepath.Join(root, "metadata.db")
	var pool, meta unix.Stat_t
	if err := unix.Stat(root, &pool); err != nil {
		return fmt.Errorf("stat the pool %s: %w", root, err)
	}
	if err := unix.Stat(db, &meta); err != nil {
		return fmt.Errorf("stat the btrfs snapshotter's metadata %s: %w", db, err)
	}
	if pool.Dev == meta.Dev {
		return fmt.Errorf("the btrfs snapshotter's metadata %s is on the pool it records: once the pool is full, deleting a sandbox cannot be recorded and frees nothing; stop containerd and run scripts/btrfs-quota.sh up %s to move it off the pool", db, root)
	}
	return nil
}

// PoolHeadroomBytes is what berthd keeps free in the pool: a create or a
// copy (snapshot, fork) is refused once less is free (checkHeadroom), so
// that the pool a sandbox filled still takes what starting and deleting
// sandboxes write — a sandbox made on a full pool could not write a byte.
const PoolHeadroomBytes = 64 << 20

// checkHeadroom fails with a *PoolFullError for op when the pool has less
// than PoolHeadroomBytes free (statfs(2) of the pool, f_bavail); nil
// without disk quotas (no pool) or when the pool cannot be read (the
// operation then meets its own errors).
func (r *Runtime) checkHeadroom(op string) error {
	if r.quota == nil {
		return nil
	}
	free, _, err := r.quota.Space()
	if err != nil || free >= PoolHeadroomBytes {
		return nil
	}
	return &PoolFullError{Pool: r.poolName(), Op: op,
		Err: fmt.Errorf("%d bytes free, less than the %d berthd keeps free so that sandboxes can still start and be deleted", free, PoolHeadroomBytes)}
}
