// Package switchroot is what berthd and berth-agent share of a standby
// sandbox (berthd's fork standby members, docs/state.md#fork): an agent
// started on a placeholder root waits (Wait) until berthd has moved its
// mount namespace onto the real root (Switch, run by berthd as host root
// in that namespace through nsenter(1) and `berth-agent switch-root`,
// before any workload ran there), with the paths and bytes both sides
// use.
package switchroot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// NextDir is the directory of the placeholder root at which berthd's
// mount of the real root appears (it propagates from the host).
const NextDir = "/.berth-next"

// Go is the byte berthd writes on the standby FIFO to let the agent go
// on; anything else, or the FIFO's end without it (berthd gone), stops
// the agent.
const Go = 'g'

// ErrNotReleased means the standby FIFO ended without Go: the berthd that
// made the standby is gone, and the agent must not start on the
// placeholder.
var ErrNotReleased = errors.New("standby ended without berthd's go")

// Wait opens the FIFO at path for reading, which returns once berthd
// opened it for writing (berthd knows then that the agent waits), reads
// one byte and removes the FIFO. It returns nil for Go, ErrNotReleased for
// anything else or for the FIFO's end. It touches nothing of the root
// but path, which is on the run directory's mount.
func Wait(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open standby fifo %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var b [1]byte
	n, err := io.ReadFull(f, b[:])
	if n == 1 && b[0] == Go {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove standby fifo: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w (read %d bytes: %v)", ErrNotReleased, n, err)
}

// MountInfoFD is the descriptor on which Switch's caller gets the mount
// table of the namespace: berthd's open of /proc/<agent pid>/mountinfo on
// the host. The namespace's own /proc is the sandbox's, whose pid
// namespace the caller is not in (no /proc/self there).
const MountInfoFD = 3

// Switch moves the calling process's mount namespace, whose mount table
// (proc_pid_mountinfo(5)) mountinfo reads, onto the mount at NextDir: every mount whose parent is the root mount (runc's /proc,
// /dev, /sys with their submounts and masks, the agent binary, the run
// directory, volumes, /etc/hosts and the like) is moved to the same path
// under NextDir, which must exist there (the fork's parent has them all:
// runc made them when it started), then pivot_root(2) makes NextDir the
// root of every process whose root was the old one, the old root is
// detached, and the whole tree is made private, so that nothing the host
// mounts later reaches it. The caller holds CAP_SYS_ADMIN over the
// namespace (berthd's nsenter as host root); the agent never does.
func Switch(table io.Reader) error {
	mounts, err := mountinfo.GetMountsFromReader(table, nil)
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	rootID, nextID := -1, -1
	for _, m := range mounts {
		switch m.Mountpoint {
		case "/":
			rootID = m.ID // the last one listed is on top
		case NextDir:
			nextID = m.ID
		}
	}
	if rootID < 0 || nextID < 0 {
		return fmt.Errorf("no mount at / or %s: nothing to switch to", NextDir)
	}
	// Every mount point is checked before anything moves.
	var moves []string
	for _, m := range mounts {
		if m.Parent != rootID || m.ID == nextID || m.Mountpoint == "/" || strings.HasPrefix(m.Mountpoint, NextDir+"/") {
			continue
		}
		if err := plainPath(NextDir, m.Mountpoint); err != nil {
			return err
		}
		moves = append(moves, m.Mountpoint)
	}
	for _, m := range moves {
		if err := unix.Mount(m, NextDir+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move mount %s into the new root: %w", m, err)
		}
	}
	old, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the old root: %w", err)
	}
	defer unix.Close(old)
	if err := unix.Chdir(NextDir); err != nil {
		return fmt.Errorf("enter the new root: %w", err)
	}
	// As runc does: the old root ends on top of the new one, and is
	// detached from there.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to the new root: %w", err)
	}
	if err := unix.Fchdir(old); err != nil {
		return fmt.Errorf("enter the old root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("enter the new root: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the new root private: %w", err)
	}
	return nil
}

// plainPath checks that root+path (path absolute) and each of its
// directories under root exist and are no symbolic links: the new root
// holds what the fork's parent's workload wrote, and a mount moved
// through a link would land where that workload chose.
func plainPath(root, path string) error {
	for p := filepath.Clean(path); p != "/" && p != "."; p = filepath.Dir(p) {
		fi, err := os.Lstat(root + p)
		if err != nil {
			return fmt.Errorf("mount point %s in the new root: %w", path, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("mount point %s in the new root: %s is a symbolic link", path, p)
		}
	}
	return nil
}
