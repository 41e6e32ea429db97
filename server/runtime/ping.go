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
