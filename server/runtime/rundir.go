package runtime

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Size of a sandbox's run directory (RunDir): it holds one socket, so a
// few pages and inodes are plenty. Whatever the workload writes there is
// held in memory, charged to the sandbox's memory cgroup, and stops at
// this size with ENOSPC.
const (
	RunDirBytes  = 64 << 10
	runDirInodes = 64
)

// mountRunDir mounts a tmpfs of RunDirBytes at dir, owned by uid:gid (the
// host ids of the sandbox's root) with mode 0700: before, RunDir was the
// host's own file system (the state directory's, /run), and a workload's
// `dd` there filled the host's disk.
func mountRunDir(dir string, uid, gid uint32) error {
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", RunDirBytes, runDirInodes, uid, gid)
	if err := unix.Mount("berth-run", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount the sandbox's run directory %s (tmpfs %s): %w", dir, opts, err)
	}
	return nil
}

// unmountRunDir unmounts the tmpfs at dir, if any (lazily, so a shim that
// still holds it open does not fail the delete).
func unmountRunDir(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, os.ErrNotExist):
		// EINVAL: not a mount point (never mounted, or already gone).
		return nil
	}
	return fmt.Errorf("unmount the sandbox's run directory %s: %w", dir, err)
}
