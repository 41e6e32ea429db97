package runtime

import (
	"context"
	"fmt"
)

// Ping asks containerd for its version: the cheapest call that shows it
// answers. Errors: an *UnavailableError when containerd refused the
// connection or did not answer within Config.CallBudget; ctx's own error
// when ctx ended first.
func (r *Runtime) Ping(ctx context.Context) (err error) {
	c := r.begin(ctx, "ask containerd its version")
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	if _, err := r.client.Version(ctx); err != nil {
		return fmt.Errorf("containerd version: %w", err)
	}
	return nil
}

// PoolSpace is the space of the file system that holds the sandboxes'
// writable layers.
type PoolSpace struct {
	// Pool names it, as PoolFullError does.
	Pool string
	// FreeBytes is what unprivileged writers may still use, SizeBytes the
	// file system's size, in bytes.
	FreeBytes, SizeBytes uint64
}

// PoolSpace reads the space of the pool when berthd knows where it is:
// the btrfs pool of disk quotas (DiskQuota); false without one.
func (r *Runtime) PoolSpace() (PoolSpace, bool, error) {
	if r.quota == nil {
		return PoolSpace{}, false, nil
	}
	free, size, err := r.quota.Space()
	if err != nil {
		return PoolSpace{}, false, err
	}
	return PoolSpace{Pool: r.poolName(), FreeBytes: free, SizeBytes: size}, true, nil
}
