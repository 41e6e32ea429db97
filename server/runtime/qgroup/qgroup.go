// Package qgroup limits and reads btrfs quota groups: the kernel's
// accounting of the bytes each subvolume holds (btrfs-qgroup(8)). berthd
// uses it to cap a sandbox's writable snapshot, which containerd's btrfs
// snapshotter makes a subvolume, at the sandbox's disk quota.
//
// Each subvolume has a level-0 quota group 0/ID, created with it, whose
// "exclusive" bytes are the data and metadata no other subvolume shares:
// for a snapshot of an image, what the sandbox wrote beyond the image. A
// write that would take it past its limit fails with EDQUOT.
//
// It talks to the kernel with ioctl(2) (BTRFS_IOC_QGROUP_LIMIT, needing
// CAP_SYS_ADMIN) and reads usage from sysfs
// (/sys/fs/btrfs/FSID/qgroups/0_ID/exclusive, Linux 5.9+).
package qgroup

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors of Open.
var (
	// ErrNotBtrfs means the directory is not on a btrfs file system.
	ErrNotBtrfs = errors.New("not a btrfs file system")
	// ErrQuotaDisabled means the btrfs file system has quotas off
	// (`btrfs quota enable DIR` turns them on).
	ErrQuotaDisabled = errors.New("btrfs quotas are not enabled")
)

// ioctl numbers and flags from linux/btrfs.h.
const (
	// iocQgroupLimit is _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	// (48 bytes).
	iocQgroupLimit = 0x8030942b
	// iocFSInfo is _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args) (1024
	// bytes).
	iocFSInfo = 0x8400941f
	// limitMaxExcl says that qgroupLimit.maxExcl is set
	// (BTRFS_QGROUP_LIMIT_MAX_EXCL).
	limitMaxExcl = 1 << 1
	// levelShift places a qgroup's level above its 48-bit id
	// (BTRFS_QGROUP_LEVEL_SHIFT).
	levelShift = 48
)

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type qgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// fsInfoArgs is struct btrfs_ioctl_fs_info_args; only the fsid is read.
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	_          [1024 - 32]byte
}

// FS is a btrfs file system with quotas enabled, open through a directory
// on it.
type FS struct {
	dir   *os.File
	sysfs string // /sys/fs/btrfs/FSID
}

// Open opens the btrfs file system that dir is on and checks that quotas
// are enabled there and that the caller may set limits. It fails with
// ErrNotBtrfs or ErrQuotaDisabled (wrapped, naming dir), or the errno of
// the check (EPERM without CAP_SYS_ADMIN).
func Open(dir string) (*FS, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if uint32(st.Type) != unix.BTRFS_SUPER_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%s: %w (file system magic %#x)", dir, ErrNotBtrfs, st.Type)
	}
	fs := &FS{dir: f}
	// A limit on a quota group that cannot exist tells the cases apart
	// without changing anything: ENOTCONN when quotas are off, ENOENT
	// when they are on (fs/btrfs/qgroup.c, btrfs_limit_qgroup).
	switch err := fs.limit(1<<levelShift-1, 0); {
	case errors.Is(err, unix.ENOTCONN):
		f.Close()
		return nil, fmt.Errorf("%s: %w (run `btrfs quota enable %s`)", dir, ErrQuotaDisabled, dir)
	case errors.Is(err, unix.ENOENT):
	default:
		f.Close()
		return nil, fmt.Errorf("check btrfs quotas of %s: %w", dir, err)
	}
	var info fsInfoArgs
	if err := ioctl(f, iocFSInfo, unsafe.Pointer(&info)); err != nil {
		f.Close()
		return nil, fmt.Errorf("btrfs file system info of %s: %w", dir, err)
	}
	id := hex.EncodeToString(info.fsid[:])
	fs.sysfs = filepath.Join("/sys/fs/btrfs", id[0:8]+"-"+id[8:12]+"-"+id[12:16]+"-"+id[16:20]+"-"+id[20:])
	return fs, nil
}

// Close closes the directory FS was opened through.
func (fs *FS) Close() error { return fs.dir.Close() }

// Limit caps the exclusive bytes of subvolume subvolID's quota group at
// maxBytes: writes that would take it further fail with EDQUOT. It fails
// with ENOENT when no such subvolume exists.
func (fs *FS) Limit(subvolID, maxBytes uint64) error {
	if err := fs.limit(subvolID, maxBytes); err != nil {
		return fmt.Errorf("limit btrfs quota group 0/%d to %d bytes: %w", subvolID, maxBytes, err)
	}
	return nil
}

func (fs *FS) limit(qgroupID, maxExcl uint64) error {
	args := qgroupLimitArgs{qgroupID: qgroupID, flags: limitMaxExcl, maxExcl: maxExcl}
	return ioctl(fs.dir, iocQgroupLimit, unsafe.Pointer(&args))
}

// Exclusive returns the bytes subvolume subvolID holds that no other
// subvolume shares, as the kernel accounts them now.
func (fs *FS) Exclusive(subvolID uint64) (uint64, error) {
	p := filepath.Join(fs.sysfs, "qgroups", "0_"+strconv.FormatUint(subvolID, 10), "exclusive")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", p, err)
	}
	return n, nil
}

// SubvolID returns the subvolume id in the options of a btrfs mount
// ("subvolid=N", as containerd's btrfs snapshotter mounts a snapshot).
func SubvolID(options []string) (uint64, bool) {
	for _, o := range options {
		if v, ok := strings.CutPrefix(o, "subvolid="); ok {
			id, err := strconv.ParseUint(v, 10, 64)
			return id, err == nil
		}
	}
	return 0, false
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
