package qgroup_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

func TestSubvolID(t *testing.T) {
	tests := []struct {
		options []string
		want    uint64
		ok      bool
	}{
		{[]string{"subvolid=258"}, 258, true},
		{[]string{"ro", "subvolid=5"}, 5, true},
		{[]string{"rw"}, 0, false},
		{[]string{"subvolid=x"}, 0, false},
		{nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := qgroup.SubvolID(tt.options)
		if got != tt.want || ok != tt.ok {
			t.Errorf("SubvolID(%q) = %d, %v; want %d, %v", tt.options, got, ok, tt.want, tt.ok)
		}
	}
}

// TestLimit runs against a real btrfs: a loop-mounted image made by
// scripts/btrfs-quota.sh, as operators make it.
func TestLimit(t *testing.T) {
	dir := btrfsDir(t)

	if other := t.TempDir(); !isBtrfs(other) {
		if _, err := qgroup.Open(other); !errors.Is(err, qgroup.ErrNotBtrfs) {
			t.Errorf("Open(a directory on another file system) = %v, want ErrNotBtrfs", err)
		}
	}
	btrfs(t, "quota", "disable", dir)
	if _, err := qgroup.Open(dir); !errors.Is(err, qgroup.ErrQuotaDisabled) {
		t.Errorf("Open(btrfs without quotas) = %v, want ErrQuotaDisabled", err)
	}
	btrfs(t, "quota", "enable", dir)
	fs, err := qgroup.Open(dir)
	if err != nil {
		t.Fatalf("Open(btrfs with quotas): %v", err)
	}
	defer fs.Close()

	sv := filepath.Join(dir, "sv")
	btrfs(t, "subvolume", "create", sv)
	id, err := strconv.ParseUint(strings.TrimSpace(btrfs(t, "inspect-internal", "rootid", sv)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 4 << 20
	if err := fs.Limit(id, limit); err != nil {
		t.Fatalf("Limit(%d, %d): %v", id, limit, err)
	}
	f, err := os.Create(filepath.Join(sv, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	written := 0
	for ; written < 2*limit; written += len(chunk) {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writing %d bytes under a %d-byte limit: %v, want EDQUOT", written, limit, err)
	}
	if written > limit || written < limit/2 {
		t.Errorf("EDQUOT after %d bytes under a %d-byte limit", written, limit)
	}
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	excl, err := fs.Exclusive(id)
	if err != nil {
		t.Fatalf("Exclusive(%d): %v", id, err)
	}
	if excl < uint64(written) || excl > limit {
		t.Errorf("Exclusive(%d) = %d after writing %d bytes, want from %d to %d", id, excl, written, written, limit)
	}

	if err := fs.Limit(1<<40, limit); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Limit(a subvolume that does not exist) = %v, want ENOENT", err)
	}
}

// btrfsDir returns a fresh btrfs with quotas, unmounted at cleanup. It
// skips without root or btrfs-progs, unless BERTH_E2E=1 asks for every test.
func btrfsDir(t *testing.T) string {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "mounting a btrfs needs root"
	} else if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		why = "btrfs-progs is not installed (scripts/deps.sh)"
	}
	if why != "" {
		e2e.Missing(t, why)
	}
	script, err := filepath.Abs("../../../scripts/btrfs-quota.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "b")
	if out, err := exec.Command(script, "up", dir, "256M").CombinedOutput(); err != nil {
		t.Fatalf("btrfs-quota.sh up: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "down", dir).CombinedOutput(); err != nil {
			t.Errorf("btrfs-quota.sh down: %v\n%s", err, out)
		}
	})
	return dir
}

func btrfs(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("btrfs", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func isBtrfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && uint32(st.Type) == unix.BTRFS_SUPER_MAGIC
}
