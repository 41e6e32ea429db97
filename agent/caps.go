package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Securebits flags (capabilities(7) "The securebits flags",
// <linux/securebits.h>); golang.org/x/sys/unix does not define them.
const (
	secbitNoRoot                  = 1 << 0
	secbitNoRootLocked            = 1 << 1
	secbitNoCapAmbientRaise       = 1 << 6
	secbitNoCapAmbientRaiseLocked = 1 << 7
)

// LockCapabilities makes sure no process the agent starts ever holds a
// capability, while the agent keeps the ones the sandbox spec gave it (it
// needs CAP_SETUID/CAP_SETGID to switch to the workload user and CAP_CHOWN,
// CAP_DAC_OVERRIDE and friends to act on files for it). It sets the
// securebits SECBIT_NOROOT and SECBIT_NO_CAP_AMBIENT_RAISE, both locked, so
// that execve(2) grants uid 0 no capabilities and nothing can be raised into
// the ambient set, and drops every capability from the bounding set
// (prctl(2) PR_CAPBSET_DROP of each capability the set holds), so that no
// execve can gain one from a file either. Both need CAP_SETPCAP. Children inherit the securebits and the
// bounding set across fork and execve; with empty inheritable and ambient
// sets, every program they execute has CapPrm, CapEff and CapBnd zero, even
// as uid 0 (capabilities(7) "Transformation of capabilities during
// execve()").
//
// It is meant for the agent's start, before any process runs. It fails soft:
// an agent without CAP_SETPCAP (run by a non-root user in tests, or given no
// capabilities) cannot lock anything and has nothing to hand out beyond its
// own; the error says what could not be done and the caller logs it.
func LockCapabilities() error {
	bits := secbitNoRoot | secbitNoRootLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLocked
	var errs []error
	if err := prctlAllThreads(unix.PR_SET_SECUREBITS, uintptr(bits), 0); err != nil {
		errs = append(errs, fmt.Errorf("set securebits %#x: %w", bits, err))
		if errors.Is(err, unix.ENOTSUP) {
			return errors.Join(errs...) // a cgo build: nothing below can work either
		}
	}
	// The ambient set should be empty already; clearing it needs no
	// privilege.
	if err := prctlAllThreads(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("clear ambient capabilities: %w", err))
	}
	last := lastCap()
	for c := 0; c <= last; c++ {
		// Each drop stops the world and signals every thread: skip the
		// capabilities the bounding set lacks already (a sandbox's agent
		// starts with berthd's runtime.AgentCapabilities alone). The
		// set is read on this thread; every thread has the same one, as
		// none has dropped anything before this.
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // beyond the kernel's last capability
		}
		if err == nil && in == 0 {
			continue
		}
		err = prctlAllThreads(unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if errors.Is(err, unix.EINVAL) {
			break // beyond the kernel's last capability
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("drop capability %d from the bounding set: %w", c, err))
			break // EPERM for one means EPERM for all
		}
	}
	return errors.Join(errs...)
}

// prctlAllThreads calls prctl(2) on every thread of the process:
// securebits and the bounding set are per-thread attributes, and a Go
// program forks from whichever thread runs the starting goroutine. It is
// syscall.AllThreadsSyscall, which fails with ENOTSUP in a cgo build (the
// race-enabled test agent).
func prctlAllThreads(option, arg2, arg3 uintptr) error {
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, option, arg2, arg3); errno != 0 {
		return errno
	}
	return nil
}

// lastCap returns the kernel's highest capability number
// (/proc/sys/kernel/cap_last_cap), or 63 when it cannot be read: the drop
// loop stops at the first EINVAL anyway.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 63
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 63
	}
	return n
}

// ownWorkDir gives the working directory to the workload user (lchown(2) of
// the directory itself, not its contents) when it belongs to someone else,
// so that the workload can write where it starts. "/" is never given away.
// It needs CAP_CHOWN unless the agent runs as the workload user already;
// failure is logged, not fatal.
func ownWorkDir(dir string, uid, gid uint32, log *slog.Logger) {
	if dir == "/" {
		return
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		log.Warn("working directory: stat", "workdir", dir, "err", err)
		return
	}
	if st.Uid == uid && st.Gid == gid {
		return
	}
	if err := unix.Lchown(dir, int(uid), int(gid)); err != nil {
		log.Warn("working directory not given to the workload user", "workdir", dir, "uid", uid, "gid", gid, "err", err)
	}
}
