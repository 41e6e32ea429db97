package qgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"
)

// Subvolume ioctls from linux/btrfs.h, what `btrfs subvolume snapshot`
// and `btrfs subvolume delete` call, without starting btrfs-progs.
const (
	// iocSnapCreateV2 is _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	// (4096 bytes).
	iocSnapCreateV2 = 0x50009417
	// iocSnapDestroy is _IOW(0x94, 15, struct btrfs_ioctl_vol_args) (4096
	// bytes).
	iocSnapDestroy = 0x5000940f
	// iocSubvolCreate is _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	// (4096 bytes).
	iocSubvolCreate = 0x5000940e
	// subvolReadOnly is BTRFS_SUBVOL_RDONLY.
	subvolReadOnly = 1 << 1
	// subvolNameMax is BTRFS_SUBVOL_NAME_MAX.
	subvolNameMax = 4039
)

// volArgsV2 is struct btrfs_ioctl_vol_args_v2 without qgroup inheritance.
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	_       [4]uint64 // size and qgroup_inherit, unused
	name    [subvolNameMax + 1]byte
}

// volArgs is struct btrfs_ioctl_vol_args.
type volArgs struct {
	fd   int64
	name [4088]byte // BTRFS_PATH_NAME_MAX + 1
}

// Snapshot makes dst a snapshot of btrfs subvolume src (read-only when
// readOnly): dst must not exist, and its directory must be on src's file
// system. The kernel commits a transaction, so dst is on disk when it
// returns. Errors: the ioctl's errno (EEXIST, EXDEV, ENOTTY off btrfs),
// naming src and dst.
func Snapshot(src, dst string, readOnly bool) error {
	name := filepath.Base(dst)
	if len(name) > subvolNameMax {
		return fmt.Errorf("snapshot %s of %s: name longer than %d bytes", dst, src, subvolNameMax)
	}
	from, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", src, err)
	}
	defer from.Close()
	dir, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return fmt.Errorf("snapshot %s into %s: %w", src, dst, err)
	}
	defer dir.Close()
	args := volArgsV2{fd: int64(from.Fd())}
	if readOnly {
		args.flags = subvolReadOnly
	}
	copy(args.name[:], name)
	if err := ioctl(dir, iocSnapCreateV2, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("btrfs snapshot of %s as %s: %w", src, dst, err)
	}
	return nil
}

// Delete removes btrfs subvolume path, read-only or not, with what it
// holds (not subvolumes nested in it: ENOTEMPTY). The kernel frees its
// extents in the background. Errors: the ioctl's errno (ENOENT, ENOTTY
// off btrfs), naming path.
func Delete(path string) error {
	name := filepath.Base(path)
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("delete subvolume %s: %w", path, err)
	}
	defer dir.Close()
	var args volArgs
	if len(name) >= len(args.name) {
		return fmt.Errorf("delete subvolume %s: name longer than %d bytes", path, len(args.name)-1)
	}
	copy(args.name[:], name)
	if err := ioctl(dir, iocSnapDestroy, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("delete btrfs subvolume %s: %w", path, err)
	}
	return nil
}

// Create makes path an empty btrfs subvolume (mode 0755, owned by the
// caller), with a level-0 quota group of its own when quotas are on: path
// must not exist, and its directory must be on btrfs. Errors: the ioctl's
// errno (EEXIST, ENOTTY off btrfs), naming path.
func Create(path string) error {
	name := filepath.Base(path)
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	defer dir.Close()
	var args volArgs
	if len(name) >= len(args.name) {
		return fmt.Errorf("create subvolume %s: name longer than %d bytes", path, len(args.name)-1)
	}
	copy(args.name[:], name)
	if err := ioctl(dir, iocSubvolCreate, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("create btrfs subvolume %s: %w", path, err)
	}
	return nil
}
