package runtime

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/plugins"
)

// Every sandbox that does not run in the host's user namespace gets ids
// 0-IDRangeSize-1 mapped to a range of host ids of its own:
// Config.IDFirst + k × IDRangeSize for a random slot k no other sandbox
// of the runtime holds. A range per sandbox, not one shared by all: a
// process that escapes one sandbox holds ids that own nothing of another
// sandbox's files and cannot signal or ptrace its processes. The cost is a
// remapped copy of the image's snapshot per sandbox (containerd chowns it
// on create; runc 1.1 has no idmapped mounts), measured in BENCHMARKS.md.
const IDRangeSize = 65536

// labelIDBase records the host id a sandbox's root maps to.
const labelIDBase = LabelPrefix + "id-base"

// ErrNoIDRange means every id range is held by a sandbox.
var ErrNoIDRange = errors.New("no free user-namespace id range")

// idMaps returns the uid and gid mappings of a sandbox whose root is host
// id base.
func idMaps(base uint32) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: IDRangeSize}}
}

// allocIDBase reserves a free id range, chosen at random, for sandbox id and returns
// its first host id. Ranges held by containers in containerd are taken, as
// are those reserved by creates still in progress; release gives a
// reservation back once the container records it (or the create failed).
func (r *Runtime) allocIDBase(ctx context.Context, id string) (base uint32, release func(), err error) {
	r.idMu.Lock()
	defer r.idMu.Unlock()
	used := make(map[uint32]bool)
	containers, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q", labelIDBase))
	if err != nil {
		return 0, nil, fmt.Errorf("list id ranges: %w", err)
	}
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil {
			continue // deleted meanwhile
		}
		if b, err := strconv.ParseUint(labels[labelIDBase], 10, 32); err == nil {
			used[uint32(b)] = true
		}
	}
	for b := range r.idReserved {
		used[b] = true
	}
	// A random free range, not the lowest: containerd's remapped-snapshot
	// option leaves its work snapshot behind when a create fails midway
	// (it removes the wrong key) until its garbage collector runs, and the
	// next create of the same range would collide with it.
	first := rand.Uint32N(r.cfg.IDRanges)
	for i := uint32(0); i < r.cfg.IDRanges; i++ {
		b := r.cfg.IDFirst + ((first+i)%r.cfg.IDRanges)*IDRangeSize
		if !used[b] {
			r.idReserved[b] = id
			return b, func() {
				r.idMu.Lock()
				defer r.idMu.Unlock()
				delete(r.idReserved, b)
			}, nil
		}
	}
	return 0, nil, fmt.Errorf("%w: all %d ranges from host id %d are held", ErrNoIDRange, r.cfg.IDRanges, r.cfg.IDFirst)
}

// withRuntime sets the container's runtime options: for RuntimeGVisor the
// runc shim runs Config.GVisorBinary (a wrapper that runs runsc with
// --network=none --host-uds=all) instead of runc.
func (r *Runtime) withRuntime(spec SandboxSpec) containerd.NewContainerOpts {
	if spec.runtime() != RuntimeGVisor {
		return containerd.WithRuntime(plugins.RuntimeRuncV2, nil)
	}
	return containerd.WithRuntime(plugins.RuntimeRuncV2, &options.Options{BinaryName: r.cfg.GVisorBinary})
}

// GVisorEnabled reports whether gvisor sandboxes can be created: a runsc
// wrapper is configured.
func (r *Runtime) GVisorEnabled() bool { return r.cfg.GVisorBinary != "" }

// forceDeleteGVisor removes a gVisor container that runsc cannot kill: one
// whose start failed stays "created", and the shim's kill then fails
// ("sandbox is not running"), so the task can never be deleted. runsc's
// own `delete -force` (in the runc shim's state root for the namespace)
// removes it, its sandbox and gofer processes with it; the task's delete
// then succeeds. It does nothing for other runtimes.
func (r *Runtime) forceDeleteGVisor(ctx context.Context, container containerd.Container) error {
	labels, err := container.Labels(ctx)
	if err != nil || labels[labelRuntime] != RuntimeGVisor || r.cfg.GVisorBinary == "" {
		return nil
	}
	root := filepath.Join("/run/containerd/runc", r.cfg.Namespace)
	out, err := exec.CommandContext(ctx, r.cfg.GVisorBinary, "--root="+root, "delete", "-force", container.ID()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc delete -force %s: %v: %s", container.ID(), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pingGroups is net.ipv4.ping_group_range for the sandbox: every group.
func pingGroups(spec SandboxSpec) string {
	if spec.userns() {
		return fmt.Sprintf("0 %d", IDRangeSize-1)
	}
	return "0 2147483647"
}
