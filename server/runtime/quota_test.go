package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ioctlAllowed evaluates a seccomp profile's rules for ioctl(fd, cmd) the
// way the kernel filter that libseccomp builds from them decides: allowed
// when an unconditional allow names ioctl, or a conditional one whose
// comparisons all hold (the default action refuses everything else).
func ioctlAllowed(sc *specs.LinuxSeccomp, cmd uint64) bool {
	for _, rule := range sc.Syscalls {
		if rule.Action != specs.ActAllow || !slices.Contains(rule.Names, "ioctl") {
			continue
		}
		match := true
		for _, a := range rule.Args {
			if a.Index != 1 {
				continue
			}
			switch a.Op {
			case specs.OpMaskedEqual:
				match = match && cmd&a.Value == a.ValueTwo
			default:
				panic("comparison not modelled: " + string(a.Op))
			}
		}
		if match {
			return true
		}
	}
	return false
}

func TestQuotaSafeIoctls(t *testing.T) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}, Linux: &specs.Linux{}}
	if err := seccomp.WithDefaultProfile()(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if !ioctlAllowed(s.Linux.Seccomp, 0x5000940e) {
		t.Fatal("containerd's default profile refuses BTRFS_IOC_SUBVOL_CREATE already: this test models it wrongly")
	}
	if err := withQuotaSafeIoctls(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	for _, rule := range s.Linux.Seccomp.Syscalls {
		if len(rule.Names) == 0 {
			t.Errorf("rule %+v names no syscall", rule)
		}
	}
	tests := []struct {
		name string
		cmd  uint64
		want bool
	}{
		{"TCGETS", 0x5401, true},
		{"TIOCGWINSZ", 0x5413, true},
		{"FIONREAD", 0x541b, true},
		{"FS_IOC_GETFLAGS", 0x80086601, true},
		{"FICLONE", 0x40049409, true},
		{"FICLONERANGE", 0x4020940d, true},
		{"FIDEDUPERANGE", 0xc0189436, true},
		{"BTRFS_IOC_SNAP_CREATE", 0x50009401, false},
		{"BTRFS_IOC_SUBVOL_CREATE", 0x5000940e, false},
		{"BTRFS_IOC_SNAP_CREATE_V2", 0x50009417, false},
		{"BTRFS_IOC_SUBVOL_CREATE_V2", 0x50009418, false},
		{"BTRFS_IOC_SUBVOL_CREATE with high bits set", 0xffffffff_5000940e, false},
		{"BTRFS_IOC_QGROUP_LIMIT", 0x8030942b, false},
	}
	for _, tt := range tests {
		if got := ioctlAllowed(s.Linux.Seccomp, tt.cmd); got != tt.want {
			t.Errorf("ioctl %s (%#x) allowed = %v, want %v", tt.name, tt.cmd, got, tt.want)
		}
	}
	// Every type byte but btrfs's, every number.
	for cmd := uint64(0); cmd < 1<<16; cmd++ {
		want := cmd>>8 != ioctlTypeBtrfs || slices.Contains(btrfsIoctlsAllowed, cmd&0xff)
		if got := ioctlAllowed(s.Linux.Seccomp, cmd|0x40080000); got != want {
			t.Fatalf("ioctl %#x allowed = %v, want %v", cmd|0x40080000, got, want)
		}
	}
}

func TestQuotaSafeIoctlsLeavesOtherProfiles(t *testing.T) {
	// A profile that does not allow ioctl stays as it is: the rules only
	// ever narrow.
	s := &specs.Spec{Linux: &specs.Linux{Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno,
		Syscalls: []specs.LinuxSyscall{{Names: []string{"read", "write"}, Action: specs.ActAllow}}}}}
	if err := withQuotaSafeIoctls(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Linux.Seccomp.Syscalls); n != 1 || ioctlAllowed(s.Linux.Seccomp, 0x5401) {
		t.Errorf("profile without ioctl now has %d rules, ioctl allowed %v", n, ioctlAllowed(s.Linux.Seccomp, 0x5401))
	}
	// No seccomp at all: nothing to narrow.
	if err := withQuotaSafeIoctls(context.Background(), nil, nil, &specs.Spec{Linux: &specs.Linux{}}); err != nil {
		t.Fatal(err)
	}
}

func TestAgentArgsDiskQuota(t *testing.T) {
	r := &Runtime{}
	got := r.agentArgs(SandboxSpec{DiskBytes: 100 << 20})
	if want := []string{"--disk-bytes", "104857600"}; !slices.Equal(got[len(got)-2:], want) {
		t.Errorf("agentArgs(DiskBytes 100 MiB) = %q, want it to end with %q", got, want)
	}
	if got := r.agentArgs(SandboxSpec{}); slices.Contains(got, "--disk-bytes") {
		t.Errorf("agentArgs(no disk quota) = %q, want no --disk-bytes", got)
	}
}

// TestMetadataOffPool: the btrfs snapshotter's metadata.db in the pool's
// root is reported, naming it and the fix; a link to a file on another
// file system (/dev/shm, a tmpfs) is not; a missing one is an error.
func TestMetadataOffPool(t *testing.T) {
	pool := t.TempDir()
	db := filepath.Join(pool, "metadata.db")
	if err := metadataOffPool(pool); err == nil {
		t.Error("metadataOffPool of a pool without metadata.db = nil, want an error")
	}
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := metadataOffPool(pool)
	if err == nil || !strings.Contains(err.Error(), db) || !strings.Contains(err.Error(), "btrfs-quota.sh up") {
		t.Errorf("metadataOffPool with metadata.db on the pool = %v, want an error naming %s and the fix", err, db)
	}
	off, err := os.CreateTemp("/dev/shm", "berth-metadata-*.db")
	if err != nil {
		t.Fatal(err)
	}
	off.Close()
	t.Cleanup(func() { os.Remove(off.Name()) })
	var a, b unix.Stat_t
	if unix.Stat(pool, &a) != nil || unix.Stat(off.Name(), &b) != nil || a.Dev == b.Dev {
		t.Fatalf("/dev/shm is not another file system than %s here: the test would prove nothing", pool)
	}
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(off.Name(), db); err != nil {
		t.Fatal(err)
	}
	if err := metadataOffPool(pool); err != nil {
		t.Errorf("metadataOffPool with metadata.db linked off the pool = %v, want nil", err)
	}
}
