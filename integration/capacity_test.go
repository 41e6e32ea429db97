package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// diskPool returns the btrfs pool's root and size in bytes, as statfs(2)
// reads it, and the disk quotas the sandboxes of the tests' namespace
// hold. It fails the test where the pool is missing: these tests are about
// it.
func diskPool(t *testing.T) (root string, size, held uint64) {
	t.Helper()
	root, size, err := env.rt.DiskPool()
	if err != nil {
		t.Fatalf("the tests' btrfs pool (scripts/containerd.sh, BERTH_SNAPSHOTTER=btrfs): %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	if want := st.Blocks * uint64(st.Bsize); size != want {
		t.Fatalf("DiskPool size = %d, want statfs's %d", size, want)
	}
	promised, err := env.rt.Promised(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range promised {
		held += p.DiskBytes
	}
	return root, size, held
}

// wantBusy checks that err is FLEET_BUSY for resource with limit, in use
// and requested, naming principal.
func wantBusy(t *testing.T, what string, err error, resource berthv1.CapacityResource, limit, inUse, requested uint64, principal string) {
	t.Helper()
	var busy *client.FleetBusyError
	if !errors.As(err, &busy) {
		t.Fatalf("%s = %v, want a *client.FleetBusyError", what, err)
	}
	d := busy.Detail
	if d.GetResource() != resource || d.GetLimit() != limit || d.GetInUse() != inUse || d.GetRequested() != requested ||
		d.GetPrincipal() != principal || d.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED {
		t.Errorf("%s = %v (detail %v), want %v limit %d in use %d requested %d principal %q", what, err, d, resource, limit, inUse, requested, principal)
	}
	if principal != "" && (busy.Metadata["principal"] != principal || !strings.Contains(err.Error(), principal)) {
		t.Errorf("%s = %v (metadata %v): want the principal %q named", what, err, busy.Metadata, principal)
	}
	// Waiting frees no disk: no RetryInfo, no retry_delay, no retry.
	disk := resource == berthv1.CapacityResource_CAPACITY_RESOURCE_DISK || resource == berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK
	if disk && (busy.RetryDelay != 0 || d.GetRetryDelay() != nil || client.IsRetryable(err) || strings.Contains(err.Error(), "retry after")) {
		t.Errorf("%s = %v (RetryInfo %v, detail delay %v, retryable %v): a full disk budget must not invite a retry", what, err, busy.RetryDelay, d.GetRetryDelay(), client.IsRetryable(err))
	}
	if !disk && (busy.RetryDelay <= 0 || !client.IsRetryable(err)) {
		t.Errorf("%s = %v (RetryInfo %v, retryable %v): want a RetryInfo delay and retryable", what, err, busy.RetryDelay, client.IsRetryable(err))
	}
}

// TestDiskBudget: the disk quotas of a berthd's sandboxes add up against
// the btrfs pool that holds them (issue 21). On the tests' 20 GiB pool a
// 30 GiB quota is refused, and two quotas that fill what is left leave no
// room for a third, before anything is made.
func TestDiskBudget(t *testing.T) {
	need(t)
	ctx := fileCtx(t)
	_, size, held := diskPool(t)
	c := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1}))
	create := func(disk uint64) (*berthv1.Sandbox, error) {
		return c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{DiskBytes: disk}})
	}
	const gib = 1 << 30
	_, err := create(30 * gib)
	wantBusy(t, "a 30 GiB quota", err, berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, size, held, 30*gib, "")
	if !strings.Contains(err.Error(), "disk budget") {
		t.Errorf("refusal %q does not name the disk budget", err)
	}

	half := (size - held) / 2 / mib * mib
	for range 2 {
		createSandbox(t, c, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: half}})
	}
	_, err = create(size - held - 2*half + mib)
	wantBusy(t, "a quota past the pool's size", err, berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, size, held+2*half, size-held-2*half+mib, "")

	// Overcommitting is explicit: three times the pool admits it beside
	// the two.
	over := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1, DiskOvercommit: 3}))
	createSandbox(t, over, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: 30 * gib}})
}

// TestPrincipalCaps: per-principal caps stop one principal at its cap,
// naming it, while another still creates.
func TestPrincipalCaps(t *testing.T) {
	need(t)
	const disk = 100 * mib
	a := startAuthServerWith(t, server.Config{TaskRestartLimit: -1, MaxSandboxesPerPrincipal: 2, MaxDiskBytesPerPrincipal: 150 * mib})
	alice := dialClient(t, a.unixAddr, client.WithToken(aliceToken))
	bob := dialClient(t, a.unixAddr, client.WithToken(bobToken))
	ctx := fileCtx(t)
	create := func(c *client.Client, disk uint64) error {
		sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{DiskBytes: disk}})
		if err == nil {
			t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.GetId()) })
		}
		return err
	}
	if err := create(alice, disk); err != nil {
		t.Fatalf("alice's first sandbox: %v", err)
	}
	wantBusy(t, "alice's second 100 MiB", create(alice, disk), berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK, 150*mib, disk, disk, "alice")
	if err := create(bob, disk); err != nil {
		t.Fatalf("bob's sandbox while alice is at her disk cap: %v", err)
	}
	if err := create(alice, 10*mib); err != nil {
		t.Fatalf("alice's 10 MiB within her disk cap: %v", err)
	}
	wantBusy(t, "alice's third sandbox", create(alice, mib), berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES, 2, 2, 1, "alice")
	if err := create(bob, 10*mib); err != nil {
		t.Fatalf("bob's second sandbox while alice is at her count cap: %v", err)
	}
}

// TestPoolFull fills the btrfs pool from inside a sandbox of an
// overcommitted berthd (fallocate, as the tenant of issue 21 did): the next
// CreateSandbox is RESOURCE_EXHAUSTED NO_SPACE naming the pool, never
// INTERNAL, and leaves nothing behind.
func TestPoolFull(t *testing.T) {
	need(t)
	ctx := fileCtx(t)
	root, size, _ := diskPool(t)
	c := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1, DiskOvercommit: -1}))
	// Cleanups run last first: this one after the filler's delete.
	t.Cleanup(func() { waitPoolFree(t, root) })
	filler := createSandbox(t, c, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: size}})
	fillPool(t, c, filler.GetId(), root)

	before, err := env.rt.Promised(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := shortID("full")
	_, err = c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, SandboxId: id})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != codes.ResourceExhausted || ce.Reason != rpcstatus.ReasonNoSpace {
		t.Fatalf("CreateSandbox on a full pool = %v, want RESOURCE_EXHAUSTED NO_SPACE", err)
	}
	if !strings.Contains(ce.Message, root) || !strings.Contains(ce.Metadata["pool"], root) || ce.Metadata["resource"] != "sandbox_pool" {
		t.Errorf("NO_SPACE %q (metadata %v) does not name the pool %s", ce.Message, ce.Metadata, root)
	}
	after, err := env.rt.Promised(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := after[id]; ok || len(after) != len(before) {
		t.Errorf("the refused create left sandboxes: %d before, %d after", len(before), len(after))
	}
}

// TestPoolFullDelete: deleting the sandbox that filled the pool frees the
// pool. containerd's btrfs snapshotter records a removal in its own bolt
// database (metadata.db) before it deletes the subvolume; where that file
// is on the pool, the full pool refused the record (ENOSPC), the subvolume
// stayed, and the pool stayed full (4.6 MB free a minute after the delete,
// CI8). The filler is deleted as it is, nothing removed from inside first.
func TestPoolFullDelete(t *testing.T) {
	need(t)
	ctx := fileCtx(t)
	root, size, _ := diskPool(t)
	c := dialClient(t, startServer(t, server.Config{TaskRestartLimit: -1, DiskOvercommit: -1}))
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{DiskBytes: size}})
	if err != nil {
		t.Fatal(err)
	}
	fillPool(t, c, sb.GetId(), root)
	if err := c.DeleteSandbox(ctx, sb.GetId()); err != nil {
		t.Fatalf("DeleteSandbox of the filler on a full pool: %v", err)
	}
	waitPoolFree(t, root)
}

// fillPool fills the pool at root from inside sandbox id: data with
// fallocate, in ever smaller pieces down to one 4 KiB block until nothing
// more fits (btrfs refuses a fallocate larger than what is free as a
// whole), then metadata with files small enough to be stored inline (up
// to max_inline, 2 KiB), where any room is left for them (on a pool whose
// data is full to the last block btrfs refuses them too). The loops end at
// ENOSPC, or at bounds far past a 20 GiB pool.
func fillPool(t *testing.T, c *client.Client, id, root string) {
	t.Helper()
	ctx := fileCtx(t)
	script := `i=0; for n in 1073741824 134217728 16777216 1048576 65536 4096; do while [ $i -lt 100000 ] && fallocate -l $n /workspace/f$i 2>/dev/null; do i=$((i+1)); done; done
mkdir /workspace/m; j=0; while [ $j -lt 3000000 ] && printf '%2000s' x >/workspace/m/$j 2>/dev/null; do j=$((j+1)); done; sync; echo $i $j`
	r, err := c.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("filled the pool with %s files (allocated, small); %d of %d bytes free", strings.TrimSpace(string(r.GetStdout())), st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize))
}

// waitPoolFree waits, at most a minute, for the pool to have a GiB free
// again once the filler is deleted: btrfs frees a deleted subvolume's
// extents in the background, and the next test needs them.
func waitPoolFree(t *testing.T, root string) {
	deadline := time.Now().Add(time.Minute)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil {
			t.Errorf("statfs %s: %v", root, err)
			return
		}
		free := st.Bavail * uint64(st.Bsize)
		if free >= 1<<30 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the pool %s has %d bytes free a minute after the filler's delete, want a GiB back", root, free)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
