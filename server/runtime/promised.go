package runtime

import (
	"context"
	"fmt"
	"strconv"
)

// MemoryPromised returns every sandbox in the namespace with the memory cap, in
// bytes, it was created with (zero: no cap), in one containerd call. Stopped
// sandboxes are included: they keep their promise of memory.
func (r *Runtime) MemoryPromised(ctx context.Context) (_ map[string]uint64, err error) {
	c := r.begin(ctx, "list sandboxes' memory caps")
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q==true", labelSandbox))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make(map[string]uint64, len(records))
	for _, c := range records {
		mem, _ := strconv.ParseUint(c.Labels[labelMemory], 10, 64)
		out[c.ID] = mem
	}
	return out, nil
}
