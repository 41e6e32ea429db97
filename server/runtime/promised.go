package runtime

import (
	"context"
	"fmt"
	"strconv"
)

// Promise is what a sandbox was promised when it was created: its owner
// and its caps.
type Promise struct {
	// Owner is the principal that holds it (LabelOwner).
	Owner string
	// Pooled is true for an unclaimed warm-pool member.
	Pooled bool
	// MemoryBytes is its memory cap in bytes; zero: none.
	MemoryBytes uint64
	// DiskBytes is its disk quota in bytes; zero: none.
	DiskBytes uint64
}

// Promised returns every sandbox in the namespace with what it was
// promised, in one containerd call. Stopped sandboxes are included: they
// keep their promise of memory and hold their disk.
func (r *Runtime) Promised(ctx context.Context) (_ map[string]Promise, err error) {
	c := r.begin(ctx, "list sandboxes' owners and caps")
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q==true", labelSandbox))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make(map[string]Promise, len(records))
	for _, c := range records {
		mem, _ := strconv.ParseUint(c.Labels[labelMemory], 10, 64)
		disk, _ := strconv.ParseUint(c.Labels[labelDisk], 10, 64)
		out[c.ID] = Promise{Owner: c.Labels[LabelOwner], Pooled: c.Labels[labelPool] == "true", MemoryBytes: mem, DiskBytes: disk}
	}
	return out, nil
}
