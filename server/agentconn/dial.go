package agentconn

import (
	"context"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// ErrNotSocket is wrapped by the dial error when the agent's socket path
// holds something other than a unix socket (a symlink, above all).
var ErrNotSocket = errors.New("not a unix socket")

// CheckSocket reports whether path is a unix socket itself, not a symlink
// to one: nil, ErrNotSocket wrapped with what is there instead, or the
// lstat(2) error (fs.ErrNotExist when nothing is there).
func CheckSocket(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("agent socket %s: %w", path, err)
	}
	return socketMode(path, st.Mode)
}

func socketMode(path string, mode uint32) error {
	if mode&unix.S_IFMT == unix.S_IFSOCK {
		return nil
	}
	what := "a file of another type"
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		what = "a symlink"
	case unix.S_IFREG:
		what = "a regular file"
	case unix.S_IFDIR:
		what = "a directory"
	}
	return fmt.Errorf("agent socket %s is %s: %w", path, what, ErrNotSocket)
}

// dialSocket connects to the unix socket at path without following a
// symlink at path. The directory holding an agent's socket is bind-mounted
// into its sandbox, whose root may put anything there: a symlink to another
// sandbox's socket must not connect berthd to that sandbox's agent. The
// socket is opened with O_PATH|O_NOFOLLOW (a symlink yields the link
// itself), checked with fstat(2), and connected through its descriptor's
// /proc/self/fd entry, so that what is checked is what is connected to.
// The directories above path are berthd's own.
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open agent socket %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat agent socket %s: %w", path, err)
	}
	if err := socketMode(path, st.Mode); err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, fmt.Errorf("connect to agent socket %s: %w", path, err)
	}
	return conn, nil
}
