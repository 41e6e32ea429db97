package runtime

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// Promise is what a sandbox was promised when it was created: its owner
// and its caps.
type Promise struct {
	// Owner is the principal that holds it (LabelOwner).
	Owner string
	// Pooled is true for an unclaimed warm-pool member of an image.
	Pooled bool
	// MemoryBytes is its memory cap in bytes; zero: none.
	MemoryBytes uint64
	// DiskBytes is its disk quota in bytes; zero: none. For a stored
	// copy (Stored), the bytes it counts (StoredDisk).
	DiskBytes uint64
	// Stored is true for a stored snapshot or a fork's copy (StoredDisk),
	// or a hibernated gVisor sandbox's checkpoint image (Promised), which
	// holds disk and nothing else: no sandbox, no memory.
	Stored bool
	// Hibernated is true for a hibernated sandbox: it holds its disk and
	// no memory (its wake is admitted again).
	Hibernated bool
	// Standby is true for a fork standby member (SandboxSpec.Standby):
	// unlisted and owned by no one, it is made for its parent's next fork
	// and counts for the parent's owner (Owner), whose sandboxes it would
	// join.
	Standby bool
}

// checkpointKeyPrefix prefixes the key (sandbox id) under which Promised
// lists a hibernated sandbox's checkpoint image.
const checkpointKeyPrefix = "checkpoint-of/"

// imageKey returns the key under which Promised lists the
// checkpoint image of sandbox id.
func imageKey(id string) string { return checkpointKeyPrefix + id }

// Promised returns every sandbox in the namespace with what it was
// promised, in one containerd call; a fork standby member is its parent's
// owner's (Promise.Standby). Stopped sandboxes are included: they
// keep their promise of memory and hold their disk. A hibernated sandbox
// holds no memory (Hibernated); the checkpoint image of one hibernated
// with its memory is listed as a stored copy of its owner's
// (imageKey: the image's bytes, labelCheckpointBytes).
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
	owners := make(map[string]string, len(records))
	for _, c := range records {
		owners[c.ID] = c.Labels[LabelOwner]
	}
	for _, c := range records {
		mem, _ := strconv.ParseUint(c.Labels[labelMemory], 10, 64)
		disk, _ := strconv.ParseUint(c.Labels[labelDisk], 10, 64)
		p := Promise{Owner: c.Labels[LabelOwner], Pooled: c.Labels[labelPool] == "true", MemoryBytes: mem, DiskBytes: disk,
			Hibernated: c.Labels[labelHibernated] != ""}
		if parent := c.Labels[labelForkOf]; p.Pooled && parent != "" {
			// A standby member: its parent's owner's (a member whose
			// parent is gone counts for no one until it is removed).
			p.Owner, p.Pooled, p.Standby = owners[parent], false, true
		}
		out[c.ID] = p
		if image, err := strconv.ParseUint(c.Labels[labelCheckpointBytes], 10, 64); err == nil && c.Labels[labelHibernated] == HibernatedMemoryKept {
			out[imageKey(c.ID)] = Promise{Owner: c.Labels[LabelOwner], DiskBytes: image, Stored: true}
		}
	}
	return out, nil
}

// StoredDisk returns every stored snapshot and fork copy (ForkSnapshot)
// in the namespace, keyed by its snapshotter key (never a sandbox id),
// with its owner and the bytes it counts against the owner's disk: the
// exclusive bytes of its sandbox's writable subvolume when it was taken
// (btrfs quota group, what the sandbox's disk quota counted: what the
// sandbox wrote since its image or its last copy), or, for a copy taken
// before berthd recorded them, containerd's usage of it. A copy shares
// those bytes with its sandbox when it is taken and may come to hold them
// alone: counting them at once means that bytes which several copies share
// and no sandbox holds any more are counted once, by the first copy, and
// never by nobody (a copy's own exclusive bytes would miss them). Without
// snapshots or disk quotas it returns nothing.
func (r *Runtime) StoredDisk(ctx context.Context) (_ map[string]Promise, err error) {
	if r.snapshotsSupported() != nil || r.quota == nil {
		return nil, nil
	}
	c := r.begin(ctx, "count the disk of stored snapshots")
	defer c.end(&err)
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	out := map[string]Promise{}
	err = sn.Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
		id := strings.TrimPrefix(info.Name, snapshotKeyPrefix)
		if info.Kind != snapshots.KindCommitted || (!ValidSnapshotID(id) && !forkIDPattern.MatchString(id)) {
			return nil
		}
		var size int64
		if info.Labels[labelSnapshotDisk] == "" {
			if u, err := sn.Usage(ctx, info.Name); err == nil {
				size = u.Size
			}
		}
		out[info.Name] = Promise{Owner: info.Labels[labelSnapshotOwner], DiskBytes: storedBytes(info, size), Stored: true}
		return nil
	}, fmt.Sprintf("labels.%q", labelSnapshotOwner))
	if err != nil {
		return nil, fmt.Errorf("list stored snapshots: %w", err)
	}
	return out, nil
}

// storedBytes returns what stored copy info counts against its owner's
// disk (StoredDisk): its label, else size (containerd's usage of it).
func storedBytes(info snapshots.Info, size int64) uint64 {
	if n, err := strconv.ParseUint(info.Labels[labelSnapshotDisk], 10, 64); err == nil {
		return n
	}
	return uint64(max(size, 0))
}

// SandboxDiskUsed returns the bytes sandbox id's writable snapshot holds
// beyond its image (what its disk quota counts, Usage.DiskBytes), without
// reading its task: what a copy of it taken now would count against its
// owner's disk (StoredDisk). Errors: ErrDiskQuotaUnsupported,
// containerd's, btrfs's.
func (r *Runtime) SandboxDiskUsed(ctx context.Context, id string) (uint64, error) {
	return r.diskUsed(ctx, id)
}
