package runtime

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/berth-sandbox/berth/internal/procfs"
)

// labelLeaseHolder records on each containerd lease berthd takes the
// berthd process that holds it, as "<pid>:<start time>" (the start time in
// clock ticks since boot, procfs.ProcessID), so that a berthd starting
// after a crash can tell leases of work cut off (an unpack, an import, a
// chowned copy) from those of a berthd still running on the namespace,
// whatever its binary is called, and a pid reused by another process
// holds nothing.
const labelLeaseHolder = LabelPrefix + "lease-holder"

// importLeaseExpiry bounds the lease of an import or a pull whose berthd
// died: containerd's own default (24 h) kept a large image's layers that
// long.
const importLeaseExpiry = time.Hour

// withLease returns ctx under a new lease that expires after expiry,
// labelled with this process as its holder, and the function that ends it.
func (r *Runtime) withLease(ctx context.Context, expiry time.Duration) (context.Context, func(context.Context) error, error) {
	return r.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(expiry),
		leases.WithLabel(labelLeaseHolder, procfs.ProcessID(os.Getpid())))
}

// dropOrphanLeases deletes the leases of berthd processes that no longer
// run (their pid is gone, or is another process now): what they held for
// work a crash cut off is then collected by containerd's next garbage
// collection instead of when the lease expires. It returns how many it
// deleted.
func (r *Runtime) dropOrphanLeases(ctx context.Context) (int, error) {
	ls, err := r.client.LeasesService().List(ctx, fmt.Sprintf("labels.%q", labelLeaseHolder))
	if err != nil {
		return 0, fmt.Errorf("list leases: %w", err)
	}
	n := 0
	for _, l := range ls {
		if procfs.Running(l.Labels[labelLeaseHolder]) {
			continue // a berthd (this one, or another on the namespace) holds it
		}
		if err := r.client.LeasesService().Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
			return n, fmt.Errorf("delete lease %s: %w", l.ID, err)
		}
		n++
	}
	return n, nil
}

// OrphanLeases returns how many leases of berthds that no longer run New
// deleted.
func (r *Runtime) OrphanLeases() int { return r.orphanLeases }
