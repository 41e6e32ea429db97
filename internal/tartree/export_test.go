package tartree

import "testing"

// CountSyncfs counts the syncfs(2) calls Extract makes until the test ends.
func CountSyncfs(t testing.TB) *int {
	n, old := new(int), syncfs
	syncfs = func(fd int) error { *n++; return old(fd) }
	t.Cleanup(func() { syncfs = old })
	return n
}

// CountFsync counts the fsync(2) calls Extract makes of regular files
// until the test ends.
func CountFsync(t testing.TB) *int {
	n, old := new(int), fsync
	fsync = func(fd int) error { *n++; return old(fd) }
	t.Cleanup(func() { fsync = old })
	return n
}
