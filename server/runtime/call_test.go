package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestEndPoolFull classifies a full disk by where it is full: the
// sandboxes' pool (containerd's snapshotter or runc reporting ENOSPC or
// EDQUOT, berthd's own call in a sandbox's root or the pool) is a
// *PoolFullError naming the pool, berthd's state directory a *HostError
// (issue 21: a full pool answered INTERNAL).
func TestEndPoolFull(t *testing.T) {
	const state = "/var/lib/berth"
	containerdFull := status.Error(codes.Unknown, "failed to prepare extraction snapshot: write /pool/snapshots/9/x: no space left on device")
	containerdQuota := status.Error(codes.Unknown, "failed to create shim task: OCI runtime create failed: mkdir /run/x: disk quota exceeded")
	// As containerd's client returns it: an errdefs error, no status.
	runcFull := fmt.Errorf("create task sb-1: %w", errgrpc.ToNative(status.Error(codes.Unknown,
		`failed to create shim task: OCI runtime create failed: error mounting "/bin/berth-agent" to rootfs at "/.berth-agent": open /var/lib/berth/s/sb-1/root/.berth-agent: no space left on device: unknown`)))
	inRoot := &fs.PathError{Op: "mkdir", Path: state + "/s/sb-1/root/workspace", Err: syscall.ENOSPC}
	inState := &fs.PathError{Op: "open", Path: state + "/s/sb-1/agent.log", Err: syscall.ENOSPC}
	bare := fmt.Errorf("limit quota group: %w", syscall.ENOSPC)
	for _, tt := range []struct {
		name string
		pool string // Runtime.pool: "" without disk quotas
		err  error
		want string // "pool" naming wantPool, "host", or "" for unchanged
		// wantPool is PoolFullError.Pool
		wantPool string
	}{
		{"containerd ENOSPC", "/pool", containerdFull, "pool", "the btrfs pool /pool"},
		{"runc EDQUOT", "/pool", containerdQuota, "pool", "the btrfs pool /pool"},
		{"runc ENOSPC through containerd's client", "/pool", runcFull, "pool", "the btrfs pool /pool"},
		{"containerd ENOSPC without quotas", "", containerdFull, "pool", "containerd's overlayfs snapshotter"},
		{"berthd in a sandbox's root", "/pool", inRoot, "pool", "the btrfs pool /pool"},
		{"berthd in the pool, no path", "/pool", bare, "pool", "the btrfs pool /pool"},
		{"berthd's state directory", "/pool", inState, "host", ""},
		{"berthd without quotas", "", inRoot, "host", ""},
		{"descriptors", "/pool", &fs.PathError{Op: "open", Path: "/pool/x", Err: syscall.EMFILE}, "host", ""},
		{"another containerd error", "/pool", status.Error(codes.Unknown, "exec format error"), "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			snapshotter := "btrfs"
			if tt.pool == "" {
				snapshotter = "overlayfs"
			}
			r := &Runtime{cfg: Config{StateDir: state, Snapshotter: snapshotter}, pool: tt.pool}
			c := r.beginLong(t.Context(), "create sandbox sb-1")
			err := tt.err
			c.end(&err)
			var (
				full *PoolFullError
				host *HostError
			)
			switch {
			case tt.want == "pool":
				if !errors.As(err, &full) || full.Pool != tt.wantPool || full.Op != "create sandbox sb-1" || !strings.Contains(err.Error(), tt.wantPool) {
					t.Errorf("end(%v) = %v (%#v), want a *PoolFullError naming %s", tt.err, err, full, tt.wantPool)
				}
			case tt.want == "host":
				if !errors.As(err, &host) || errors.As(err, &full) {
					t.Errorf("end(%v) = %v, want a *HostError", tt.err, err)
				}
			default:
				if err != tt.err {
					t.Errorf("end(%v) = %v, want it unchanged", tt.err, err)
				}
			}
		})
	}
}
