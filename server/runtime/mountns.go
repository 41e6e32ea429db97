package runtime

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ErrMountsNotShared means berthd's mounts under its state directory do
// not reach containerd's mount namespace, so runc could not find a
// sandbox's root or run directory.
var ErrMountsNotShared = errors.New("berthd's mounts are not visible to containerd")

// checkMountsShared fails with ErrMountsNotShared when containerd, found
// as the peer of its socket at address (SO_PEERCRED, unix(7)), runs in
// another mount namespace than berthd and a mount berthd makes under
// stateDir does not propagate there (mount_namespaces(7): the state
// directory must be on a shared mount, as Kubernetes' Bidirectional
// propagation and docker's rshared make it). berthd in its own namespace
// without propagation (systemd's PrivateTmp, ProtectSystem or
// PrivateMounts; `unshare --mount`) would make sandboxes that cannot
// start. Where containerd's pid cannot be seen (another pid namespace)
// nothing is checked.
func checkMountsShared(address, stateDir string) error {
	pid, err := peerPID(strings.TrimPrefix(address, "unix://"))
	if err != nil || pid == 0 {
		return nil // not provable from here; creates would say so
	}
	theirs, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	ours, err2 := os.Readlink("/proc/self/ns/mnt")
	if err1 != nil || err2 != nil || theirs == ours {
		return nil
	}
	probe, err := os.MkdirTemp(stateDir, "mount-probe-")
	if err != nil {
		return fmt.Errorf("mount probe: %w", err)
	}
	defer os.Remove(probe)
	if err := unix.Mount("tmpfs", probe, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k"); err != nil {
		return fmt.Errorf("mount probe at %s: %w", probe, err)
	}
	defer unix.Unmount(probe, unix.MNT_DETACH)
	seen, err := mountedIn(pid, probe)
	if err != nil {
		return fmt.Errorf("mounts of containerd (pid %d): %w", pid, err)
	}
	if !seen {
		return fmt.Errorf("%w: containerd (pid %d) runs in another mount namespace and a mount at %s does not reach it; runc would find no sandbox root or run directory there. Run berthd in containerd's mount namespace (a systemd unit without PrivateTmp, ProtectSystem, ProtectHome or PrivateMounts), or put the state directory on a shared mount that propagates to containerd (docker run -v %s:%s:rshared; Kubernetes mountPropagation: Bidirectional)",
			ErrMountsNotShared, pid, probe, filepath.Dir(probe), filepath.Dir(probe))
	}
	return nil
}

// peerPID returns the pid of the process that listens on the unix socket
// at path, in berthd's pid namespace (0 when it is not visible there).
func peerPID(path string) (int32, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return cred.Pid, nil
}

// mountedIn reports whether dir is a mount point in the mount namespace
// of process pid (proc_pid_mountinfo(5)).
func mountedIn(pid int32, dir string) (bool, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(int(pid)) + "/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir, m.Mountpoint == dir
	})
	return len(mounts) > 0, err
}
