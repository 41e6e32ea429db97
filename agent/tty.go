package agent

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// eot is the byte a terminal's line discipline turns into end of file for a
// reader in canonical mode (VEOF, ^D by default; termios(3)). ExecCloseStdin
// types it into a tty exec: closing the master would hang the terminal up
// and send SIGHUP instead.
const eot = 0x04

// openPTY opens a pseudo-terminal pair of rows x cols cells (pty(7)). The
// master is returned in non-blocking mode and registered with Go's poller,
// so that read deadlines and Close interrupt a blocked Read or Write; the
// slave is for the child's stdin, stdout and stderr.
func openPTY(rows, cols uint16) (master, slave *os.File, err error) {
	ptmx, slave, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pseudo-terminal: %w", err)
	}
	defer func() {
		if err != nil {
			slave.Close()
		}
	}()
	// pty.Open's ioctls go through (*os.File).Fd, which puts the master in
	// blocking mode for good: a Read on it could then outlive the exec. A
	// non-blocking duplicate is pollable; O_NONBLOCK is a property of the
	// open file description, so setting it on the copy is enough.
	fd, err := unix.Dup(int(ptmx.Fd()))
	ptmx.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("duplicate pseudo-terminal master: %w", err)
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("make pseudo-terminal master non-blocking: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	// The slave is blocking anyway once passed to the child, so creack/pty's
	// Setsize may use it.
	if err := pty.Setsize(slave, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("set terminal size %dx%d: %w", rows, cols, err)
	}
	return master, slave, nil
}

// sessionGroups returns the process groups of the processes of session sid
// (the fields pgrp and session of /proc/<pid>/stat, proc(5)), zombies
// included.
func sessionGroups(sid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{sid} // the leader's group at least
	}
	var groups []int
	for _, ent := range entries {
		if ent.Name()[0] < '0' || ent.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp session ...; comm may hold spaces
		// and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 4 {
			continue
		}
		pgrp, err1 := strconv.Atoi(f[2])
		session, err2 := strconv.Atoi(f[3])
		if err1 == nil && err2 == nil && session == sid && !slices.Contains(groups, pgrp) {
			groups = append(groups, pgrp)
		}
	}
	return groups
}

// resizeTTY sets the size of the terminal whose master is f (TIOCSWINSZ,
// tty_ioctl(4)); the kernel sends SIGWINCH to the terminal's foreground
// process group when the size changes. It goes through the poller's raw
// connection so that f stays non-blocking.
func resizeTTY(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	if ioctlErr != nil {
		return fmt.Errorf("set terminal size %dx%d: %w", rows, cols, ioctlErr)
	}
	return nil
}
