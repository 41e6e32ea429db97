// Command btrfsioctl issues one btrfs ioctl(2) from inside a sandbox, for
// the disk quota tests: it prints "ok" and exits 0, or prints the error and
// exits 1.
//
//	btrfsioctl subvol DIR NAME       BTRFS_IOC_SUBVOL_CREATE of DIR/NAME
//	btrfsioctl subvol-high DIR NAME  the same with bit 32 of the request set
//	                                 (the kernel reads only the low 32 bits)
//	btrfsioctl clone SRC DST         FICLONE: DST shares SRC's extents
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	iocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	ficlone         = 0x40049409 // _IOW(0x94, 9, int)
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: btrfsioctl subvol|subvol-high DIR NAME | clone SRC DST")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(op, a, b string) error {
	switch op {
	case "subvol", "subvol-high":
		dir, err := unix.Open(a, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		var args [4096]byte // struct btrfs_ioctl_vol_args: __s64 fd, char name[4088]
		copy(args[8:4095], b)
		req := uintptr(iocSubvolCreate)
		if op == "subvol-high" {
			req |= 1 << 32
		}
		return ioctl(dir, req, uintptr(unsafe.Pointer(&args[0])))
	case "clone":
		src, err := unix.Open(a, unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		dst, err := unix.Open(b, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		return ioctl(dst, ficlone, uintptr(src))
	}
	return fmt.Errorf("unknown op %q", op)
}

func ioctl(fd int, req, arg uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg); errno != 0 {
		return errno
	}
	return nil
}
