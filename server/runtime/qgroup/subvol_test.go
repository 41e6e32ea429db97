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

// TestCreate makes a subvolume with Create on a real btrfs: btrfs-progs
// lists it as a subvolume of its own, it takes files, and a second Create
// of the path fails with EEXIST.
func TestCreate(t *testing.T) {
	dir := btrfsDir(t)
	p := filepath.Join(dir, "vol")
	if err := qgroup.Create(p); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if out := btrfs(t, "subvolume", "show", p); !strings.Contains(out, "Subvolume ID:") {
		t.Errorf("btrfs subvolume show %s:\n%s", p, out)
	}
	if id, parent := subvolID(t, p), subvolID(t, dir); id == parent {
		t.Errorf("Create made no subvolume: %s is subvolume %d, its parent's", p, id)
	}
	if err := os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o644); err != nil {
		t.Errorf("write into the new subvolume: %v", err)
	}
	if err := qgroup.Create(p); !errors.Is(err, unix.EEXIST) {
		t.Errorf("Create of an existing path: %v, want EEXIST", err)
	}
	if err := qgroup.Create(filepath.Join(t.TempDir(), "x")); err == nil {
		t.Error("Create off btrfs succeeded")
	}
}
