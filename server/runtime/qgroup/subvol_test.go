package qgroup_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

// TestSnapshotDelete runs Snapshot and Delete against a real btrfs and
// checks them with btrfs-progs: a writable and a read-only snapshot hold
// the source's file as of the call, are subvolumes of their own, and go
// with Delete.
func TestSnapshotDelete(t *testing.T) {
	dir := btrfsDir(t)
	src := filepath.Join(dir, "src")
	btrfs(t, "subvolume", "create", src)
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	rw, ro := filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	if err := qgroup.Snapshot(src, rw, false); err != nil {
		t.Fatalf("Snapshot(writable): %v", err)
	}
	if err := qgroup.Snapshot(src, ro, true); err != nil {
		t.Fatalf("Snapshot(read-only): %v", err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{rw, ro} {
		if got, err := os.ReadFile(filepath.Join(p, "f")); err != nil || string(got) != "before" {
			t.Errorf("%s/f = %q, %v; want %q", p, got, err, "before")
		}
		if id, src := subvolID(t, p), subvolID(t, src); id == src {
			t.Errorf("%s is subvolume %d, the source's", p, id)
		}
	}
	if out := btrfs(t, "property", "get", "-ts", ro, "ro"); !strings.Contains(out, "ro=true") {
		t.Errorf("read-only snapshot: property ro = %q", out)
	}
	if out := btrfs(t, "property", "get", "-ts", rw, "ro"); !strings.Contains(out, "ro=false") {
		t.Errorf("writable snapshot: property ro = %q", out)
	}
	if err := os.WriteFile(filepath.Join(ro, "g"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the read-only snapshot: %v, want EROFS", err)
	}
	if err := qgroup.Snapshot(src, rw, false); !errors.Is(err, unix.EEXIST) {
		t.Errorf("Snapshot onto an existing path: %v, want EEXIST", err)
	}

	for _, p := range []string{rw, ro} {
		if err := qgroup.Delete(p); err != nil {
			t.Fatalf("Delete(%s): %v", p, err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Delete: %v, want not exist", p, err)
		}
	}
	if out := btrfs(t, "subvolume", "list", dir); strings.Contains(out, " rw\n") || strings.Contains(out, " ro\n") {
		t.Errorf("subvolumes after Delete:\n%s", out)
	}
	if err := qgroup.Delete(rw); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Delete of a deleted subvolume: %v, want ENOENT", err)
	}
	if err := qgroup.Delete(filepath.Join(t.TempDir(), "x")); err == nil {
		t.Error("Delete off btrfs succeeded")
	}
}
