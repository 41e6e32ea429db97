package launcher

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// native is the amd64 launcher without the Go runtime (c/launcher.c, built by
// `make launcher`: gcc -static -O2 -s): a Launcher runs it instead of the
// agent binary. A Go launcher's runtime monitor (sysmon), woken by the
// first system call of each request and then polling every 20 us for a
// millisecond or more, cost about twice the launcher's own work
// (docs/performance.md, issue 23). The ReapingLauncher (gVisor) runs it
// too, in its reaping mode (argument reap).
//
//go:embed c/berth-launcher
var native []byte

var (
	nativeOnce sync.Once
	nativePath string // /proc/self/fd/N of a sealed memfd holding native; "" when it could not be made
	nativeErr  error
)

// nativeBinary returns the path the native launcher is executed from: a
// memfd (memfd_create(2)) the agent keeps open, close-on-exec, sealed
// against writes, which a process it forks reaches as /proc/self/fd/N
// before its execve(2) closes it. It is made once; "" with the error when
// it cannot be (the caller runs the agent binary instead).
func nativeBinary() (string, error) {
	nativeOnce.Do(func() {
		nativePath, nativeErr = makeNative()
	})
	return nativePath, nativeErr
}

func makeNative() (string, error) {
	// MFD_EXEC (Linux 6.3): the file may be executed whatever
	// vm.memfd_noexec says; older kernels refuse the flag with EINVAL and
	// execute every memfd.
	fd, err := unix.MemfdCreate(Comm, unix.MFD_EXEC|unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(Comm, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return "", fmt.Errorf("memfd for the launcher: %w", err)
	}
	f := os.NewFile(uintptr(fd), Comm)
	if _, err := f.Write(native); err != nil {
		f.Close()
		return "", fmt.Errorf("write the launcher's memfd: %w", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return "", fmt.Errorf("seal the launcher's memfd: %w", err)
	}
	// f stays open (and reachable) for the process's life.
	nativeFile = f
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd()), nil
}

// nativeFile keeps the memfd from being closed by a finalizer.
var nativeFile *os.File
