package launcher

import (
	_ "embed"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// native is the amd64 launcher without the Go runtime (c/launcher.c, built by
// `make launcher`: gcc -static -O2 -s): a Launcher runs it instead of the
// agent binary. A Go launcher's runtime monitor (sysmon), woken by the
// first system call of each request and then polling every 20 us for a
// millisecond or more, cost about twice the launcher's own work
// (docs/performance.md, issue 23). The reaping launcher (gVisor) is still
// the agent binary's.
//
//go:embed c/berth-launcher
var native []byte

var (
	nativeOnce sync.Once
	nativePath string // /proc/self/fd/N of a sealed memfd holding native; "" when it could not be made
	nativeErr  error
)

// memfd_create(2) and fcntl(2) sealing constants (linux/memfd.h,
// linux/fcntl.h), which package syscall lacks. MFD_EXEC (Linux 6.3): the
// file may be executed whatever vm.memfd_noexec says; older kernels refuse
// the flag with EINVAL and execute every memfd.
const (
	mfdCloexec      = 0x1
	mfdAllowSealing = 0x2
	mfdExec         = 0x10
	fAddSeals       = 1033
	fSealSeal       = 0x1
	fSealShrink     = 0x2
	fSealGrow       = 0x4
	fSealWrite      = 0x8
	// sysMemfdCreate is memfd_create's system call number on amd64.
	sysMemfdCreate = 319
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
	name := []byte(Comm + "\x00")
	fd, err := memfdCreate(name, mfdExec|mfdCloexec|mfdAllowSealing)
	if err == syscall.EINVAL {
		fd, err = memfdCreate(name, mfdCloexec|mfdAllowSealing)
	}
	if err != nil {
		return "", fmt.Errorf("memfd for the launcher: %w", err)
	}
	f := os.NewFile(uintptr(fd), Comm)
	if _, err := f.Write(native); err != nil {
		f.Close()
		return "", fmt.Errorf("write the launcher's memfd: %w", err)
	}
	const seals = fSealSeal | fSealShrink | fSealGrow | fSealWrite
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), fAddSeals, seals); e != 0 {
		f.Close()
		return "", fmt.Errorf("seal the launcher's memfd: %w", e)
	}
	// f stays open (and reachable) for the process's life.
	nativeFile = f
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd()), nil
}

// nativeFile keeps the memfd from being closed by a finalizer.
var nativeFile *os.File

func memfdCreate(name []byte, flags uintptr) (int, error) {
	fd, _, e := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(&name[0])), flags, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}
