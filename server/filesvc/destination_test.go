package filesvc

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckDestination: berthd writes only into a regular file of a local
// disk file system open for writing, without O_APPEND or O_PATH.
func TestCheckDestination(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dest")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || !diskFS(st.Type) {
		t.Skipf("the test's temporary directory is on file system type %#x, not a disk's (%v)", st.Type, err)
	}
	open := func(p string, flags int) int {
		t.Helper()
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	for _, tc := range []struct {
		name string
		fd   int
		ok   bool
	}{
		{"write-only", open(path, unix.O_WRONLY), true},
		{"read-write", open(path, unix.O_RDWR), true},
		{"read-only", open(path, unix.O_RDONLY), false},
		{"O_APPEND", open(path, unix.O_WRONLY|unix.O_APPEND), false},
		{"O_PATH", open(path, unix.O_PATH), false},
		{"a directory", open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY), false},
		{"a pipe", pipe[1], false},
		{"/dev/null", open("/dev/null", unix.O_WRONLY), false},
		{"a procfs file", open("/proc/self/comm", unix.O_WRONLY), false},
	} {
		if err := checkDestination(tc.fd); (err == nil) != tc.ok {
			t.Errorf("checkDestination(%s) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
