package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// TestDiskSnapshotsCounted: a principal's snapshots and fork copies count
// against its disk cap (--max-disk-bytes-per-principal) with the bytes
// their sandbox had written when they were taken (btrfs quota group), so
// snapshots cannot hold unbounded disk: writing, snapshotting, deleting and
// writing again is refused once the cap is reached, for CreateSnapshot,
// ForkSandbox and CommitSnapshot alike, with a create's FLEET_BUSY
// PRINCIPAL_DISK; deleting a snapshot gives its bytes back, and another
// principal is not affected.
func TestDiskSnapshotsCounted(t *testing.T) {
	need(t)
	const quota, capBytes = 50 * mib, 150 * mib
	a := startAuthServerWith(t, server.Config{TaskRestartLimit: -1, MaxDiskBytesPerPrincipal: capBytes})
	alice := dialClient(t, a.unixAddr, client.WithToken(aliceToken))
	bob := dialClient(t, a.unixAddr, client.WithToken(bobToken))
	ctx := fileCtx(t)
	sb := createSandbox(t, alice, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: quota}})
	write := func(name string, n int) {
		t.Helper()
		r, err := alice.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"sh", "-c",
			fmt.Sprintf("rm -f /workspace/*; dd if=/dev/urandom of=/workspace/%s bs=1M count=%d 2>&1 && sync", name, n)}})
		if err != nil || r.GetResult().GetExitCode() != 0 {
			t.Fatalf("write %d MiB: %v %s", n, err, r.GetStdout())
		}
	}
	snapshot := func(c *client.Client, id string) *berthv1.Snapshot {
		t.Helper()
		s, err := c.CreateSnapshot(ctx, id, nil)
		if err != nil {
			t.Fatalf("CreateSnapshot: %v", err)
		}
		t.Cleanup(func() { c.DeleteSnapshot(context.Background(), s.GetId()) })
		return s
	}
	// wantCounted checks that a snapshot counts n MiB written, give or
	// take the metadata of the files (btrfs counts it too).
	wantCounted := func(s *berthv1.Snapshot, n uint64) {
		t.Helper()
		if d := s.GetDiskBytes(); d < n*mib || d > n*mib+4*mib {
			t.Errorf("snapshot %s disk_bytes = %d, want %d MiB and at most 4 MiB of metadata", s.GetId(), d, n)
		}
	}

	write("a", 40)
	s1 := snapshot(alice, sb.GetId())
	wantCounted(s1, 40)
	listed, err := alice.ListSnapshots(ctx)
	if err != nil || len(listed) != 1 || listed[0].GetDiskBytes() != s1.GetDiskBytes() {
		t.Fatalf("ListSnapshots = %v, %v: want s1 with disk_bytes %d", listed, err, s1.GetDiskBytes())
	}
	// The sandbox drops what s1 holds and writes anew: s1 alone holds the
	// first 40 MiB, the sandbox the next, and s2 is counted them.
	write("b", 40)
	s2 := snapshot(alice, sb.GetId())
	wantCounted(s2, 40)
	// 50 promised + 40 + 40 held; 30 more written would pass 150.
	write("c", 30)
	held := quota + s1.GetDiskBytes() + s2.GetDiskBytes()
	wantRefused := func(what string, err error, requested uint64) {
		t.Helper()
		var busy *client.FleetBusyError
		if !errors.As(err, &busy) {
			t.Fatalf("%s past alice's disk cap = %v, want FLEET_BUSY", what, err)
		}
		d := busy.Detail
		if d.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK || d.GetLimit() != capBytes ||
			d.GetInUse() != held || d.GetRequested() < requested || d.GetRequested() > requested+4*mib || d.GetPrincipal() != "alice" {
			t.Errorf("%s = %v (detail %v), want PRINCIPAL_DISK limit %d in use %d requested %d MiB (+metadata) for alice", what, err, d, capBytes, held, requested/mib)
		}
	}
	_, err = alice.CreateSnapshot(ctx, sb.GetId(), nil)
	wantRefused("CreateSnapshot", err, 30*mib)
	_, err = alice.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: sb.GetId(), Count: 1})
	// A fork's children are admitted as creates, before its copy is
	// taken: the child's disk quota is what is asked for.
	wantRefused("ForkSandbox", err, quota)
	_, err = alice.CommitSnapshot(ctx, s1.GetId(), "localhost/alice/disk:1", client.CommitOptions{})
	requested := s1.GetDiskBytes()
	wantRefused("CommitSnapshot", err, requested-requested%mib)
	if n, err := alice.ListSnapshots(ctx); err != nil || len(n) != 2 {
		t.Errorf("alice's snapshots after the refusals: %d, %v; want the 2 she took", len(n), err)
	}

	// Bob, under the same cap, is not affected.
	bsb := createSandbox(t, bob, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: quota}})
	snapshot(bob, bsb.GetId())

	// Deleting s2 gives its bytes back: the snapshot is taken now.
	if err := alice.DeleteSnapshot(ctx, s2.GetId()); err != nil {
		t.Fatal(err)
	}
	wantCounted(snapshot(alice, sb.GetId()), 30)
}
