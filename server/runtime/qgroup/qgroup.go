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
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/bounds"
)

// Errors of Open.
var (
	// ErrNotBtrfs means the directory is not on a btrfs file system.
	ErrNotBtrfs = errors.New("not a btrfs file system")
	// ErrQuotaDisabled means the btrfs file system has quotas off
	// (`btrfs quota enable DIR` turns them on).
	ErrQuotaDisabled = errors.New("btrfs quotas are not enabled")
	// ErrInconsistent means the kernel's quota accounting is marked
	// inconsistent and a rescan did not repair it in time. While it is,
	// the kernel accounts nothing (Linux 6.x skips accounting until a
	// rescan), so limits are accepted but not enforced: a subvolume's
	// exclusive bytes stay 0 whatever is written.
	ErrInconsistent = errors.New("btrfs quota accounting is inconsistent: limits are not enforced")
)

// ioctl numbers and flags from linux/btrfs.h.
const (
	// iocQgroupLimit is _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	// (48 bytes).
	iocQgroupLimit = 0x8030942b
	// iocQuotaRescan is _IOW(0x94, 44, struct
	// btrfs_ioctl_quota_rescan_args) (64 bytes).
	iocQuotaRescan = 0x4040942c
	// iocQuotaRescanWait is _IO(0x94, 46).
	iocQuotaRescanWait = 0x942e
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
// maxBytes: writes that would take it further fail with EDQUOT. It returns
// only once the limit is in force: it reads the limit back from sysfs
// (qgroups/0_ID/max_exclusive) and, when the file system's accounting is
// marked inconsistent (after a snapshot whose quota inheritance needs a
// rescan, a subvolume drop above qgroups/drop_subtree_threshold, ...), in
// which state the kernel accepts limits but enforces none, it runs a quota
// rescan and waits for it (see Rescan). It fails with ENOENT when no such
// subvolume exists, and with ErrInconsistent when ctx ends before the
// rescan repaired the accounting.
func (fs *FS) Limit(ctx context.Context, subvolID, maxBytes uint64) error {
	if err := fs.limit(subvolID, maxBytes); err != nil {
		return fmt.Errorf("limit btrfs quota group 0/%d to %d bytes: %w", subvolID, maxBytes, err)
	}
	got, err := fs.readQgroup(subvolID, "max_exclusive")
	if err != nil {
		return fmt.Errorf("read back the limit of btrfs quota group 0/%d: %w", subvolID, err)
	}
	if got != maxBytes {
		return fmt.Errorf("btrfs quota group 0/%d: limit read back is %d bytes, want %d", subvolID, got, maxBytes)
	}
	if err := fs.ensureConsistent(ctx); err != nil {
		return fmt.Errorf("limit btrfs quota group 0/%d to %d bytes: %w", subvolID, maxBytes, err)
	}
	return nil
}

// Inconsistent reports whether the kernel marks the file system's quota
// accounting inconsistent (sysfs qgroups/inconsistent, Linux 6.1+; false
// on kernels without it).
func (fs *FS) Inconsistent() (bool, error) {
	b, err := os.ReadFile(filepath.Join(fs.sysfs, "qgroups", "inconsistent"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) != "0", nil
}

// ensureConsistent rescans when the accounting is inconsistent, and fails
// with ErrInconsistent when it still is afterwards.
func (fs *FS) ensureConsistent(ctx context.Context) error {
	bad, err := fs.Inconsistent()
	if err != nil || !bad {
		return err
	}
	if err := fs.Rescan(ctx); err != nil {
		return fmt.Errorf("%w (rescan: %v)", ErrInconsistent, err)
	}
	if bad, err = fs.Inconsistent(); err != nil {
		return err
	}
	if bad {
		return fmt.Errorf("%w (still marked so after a rescan)", ErrInconsistent)
	}
	return nil
}

// Rescan recounts every quota group from the extents on disk, which clears
// the inconsistent mark (BTRFS_IOC_QUOTA_RESCAN, or joins the rescan that
// runs), and waits until it finishes (BTRFS_IOC_QUOTA_RESCAN_WAIT) or ctx
// ends. Its time grows with the data on the file system. When ctx ends
// first the rescan goes on in the kernel.
func (fs *FS) Rescan(ctx context.Context) error {
	var args [8]uint64 // struct btrfs_ioctl_quota_rescan_args: flags, progress, reserved[6]
	if err := ioctl(fs.dir, iocQuotaRescan, unsafe.Pointer(&args)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return fmt.Errorf("start btrfs quota rescan: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- ioctl(fs.dir, iocQuotaRescanWait, nil) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("wait for btrfs quota rescan: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for btrfs quota rescan: %w", ctx.Err())
	}
}

func (fs *FS) limit(qgroupID, maxExcl uint64) error {
	args := qgroupLimitArgs{qgroupID: qgroupID, flags: limitMaxExcl, maxExcl: maxExcl}
	return ioctl(fs.dir, iocQgroupLimit, unsafe.Pointer(&args))
}

// Size returns the size of the file system in bytes as statfs(2) reports
// it (f_blocks × f_bsize): for btrfs, the bytes of its devices.
func (fs *FS) Size() (uint64, error) {
	_, size, err := fs.Space()
	return size, err
}

// Space returns the bytes of the file system still free for unprivileged
// writers (f_bavail × f_bsize) and its size (f_blocks × f_bsize), as
// statfs(2) reports them now.
func (fs *FS) Space() (free, size uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(fs.dir.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", fs.dir.Name(), err)
	}
	size, ok := bounds.Mul(st.Blocks, uint64(st.Bsize))
	if !ok {
		return 0, 0, fmt.Errorf("statfs %s: %d blocks of %d bytes do not fit in 64 bits", fs.dir.Name(), st.Blocks, st.Bsize)
	}
	free, _ = bounds.Mul(st.Bavail, uint64(st.Bsize)) // at most size
	return free, size, nil
}

// Dir returns the directory FS was opened through.
func (fs *FS) Dir() string { return fs.dir.Name() }

// Exclusive returns the bytes subvolume subvolID holds that no other
// subvolume shares, as the kernel accounts them now.
func (fs *FS) Exclusive(subvolID uint64) (uint64, error) {
	return fs.readQgroup(subvolID, "exclusive")
}

// readQgroup reads the number in file name of subvolume subvolID's quota
// group in sysfs.
func (fs *FS) readQgroup(subvolID uint64, name string) (uint64, error) {
	p := filepath.Join(fs.sysfs, "qgroups", "0_"+strconv.FormatUint(subvolID, 10), name)
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

// iocInoLookup is _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
// (4096 bytes).
const iocInoLookup = 0xd0009412

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type inoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [4080]byte
}

// SubvolIDAt returns the id of the btrfs subvolume that holds path
// (BTRFS_IOC_INO_LOOKUP with tree id 0, as btrfs-progs' `btrfs
// inspect-internal rootid`). It fails with the ioctl's errno (ENOTTY off
// btrfs).
func SubvolIDAt(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	args := inoLookupArgs{objectID: 256} // BTRFS_FIRST_FREE_OBJECTID
	if err := ioctl(f, iocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("btrfs subvolume id of %s: %w", path, err)
	}
	return args.treeID, nil
}
