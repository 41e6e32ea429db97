package network

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// createNetNS makes a new network namespace and pins it at path (a bind
// mount of the namespace file, as `ip netns add` does), so that it outlives
// every process in it. Only lo exists in it, down.
func createNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		// unshare(2) changes this thread's namespace: the thread is never
		// unlocked, so Go ends it with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			done <- fmt.Errorf("pin network namespace at %s: %w", path, err)
			return
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// removeNetNS unpins and removes the namespace at path; a missing one is
// not an error. The namespace itself ends with its last process.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
