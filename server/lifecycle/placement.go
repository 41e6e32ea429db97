package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Placements records which node of a fleet holds each sandbox
// (cluster.Member); nil on a berthd outside a  The handlers claim an
// id before they create its sandbox (or hand out a warm-pool member under
// it), and release it once the sandbox is removed.
type Placements interface {
	// Claim records sandbox id, of owner, on this node, or fails with a status: another node holds it
	// (SANDBOX_PLACED_ELSEWHERE), the node takes no new sandboxes
	// (NODE_NOT_ACCEPTING), or the cluster store does not answer.
	Claim(ctx context.Context, id, owner string) error
	// Release removes the record of a removed sandbox.
	Release(ctx context.Context, id string)
	// Kick publishes the node's record soon: its images changed.
	Kick()
}

func (m *Manager) claim(ctx context.Context, id, owner string) error {
	if m.cfg.Placements == nil {
		return nil
	}
	return m.cfg.Placements.Claim(ctx, id, owner)
}

func (m *Manager) release(ctx context.Context, id string) {
	if m.cfg.Placements != nil {
		m.cfg.Placements.Release(ctx, id)
	}
}

// ImagesChanged tells the fleet that the node's images changed, so that
// placement sees them soon.
func (m *Manager) ImagesChanged() {
	if m.cfg.Placements != nil {
		m.cfg.Placements.Kick()
	}
}

// ClusterLocal returns the node's side of its fleet membership
// (cluster.Local): its usage, images and sandboxes.
func (m *Manager) ClusterLocal() cluster.Local { return clusterLocal{m} }

type clusterLocal struct{ m *Manager }

var (
	_ cluster.Local         = clusterLocal{}
	_ cluster.SnapshotLocal = clusterLocal{}
)

// Usage counts the sandboxes (running or stopped, warm-pool members and
// creations in progress included) and the memory promised to them as
// capacity admission does, and the execs running. Fork standby members
// are left out (admit.Capacity.Usage): they give way to a new sandbox.
func (l clusterLocal) Usage(ctx context.Context) (cluster.Usage, error) {
	if err := l.containerdDown(); err != nil {
		return cluster.Usage{}, err
	}
	creating := make(map[string]admit.Held)
	l.m.mu.Lock()
	for id, cr := range l.m.creating {
		creating[id] = held(cr.spec)
	}
	l.m.mu.Unlock()
	u, err := l.m.capacity.Usage(ctx, creating)
	if err != nil {
		return cluster.Usage{}, err
	}
	return cluster.Usage{Sandboxes: u.Sandboxes, MemoryBytes: u.MemoryBytes, Execs: u.Execs,
		MaxSandboxes: u.MaxSandboxes, MemoryBudget: u.MemoryBudget, MaxExecs: u.MaxExecs}, nil
}

// Images returns the names of the shared images in the node's store, for
// its fleet record. A private image (committed by a principal that is not
// an admin: runtime.Image.PrivateTo) is left out: every node and gateway
// names the images on the records to every caller, and a private image's
// name is its principal's alone (a fleet refuses commits, so one is only
// on a node that had it before it joined).
func (l clusterLocal) Images(ctx context.Context) ([]string, error) {
	if err := l.containerdDown(); err != nil {
		return nil, err
	}
	images, err := l.m.rt.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(images))
	for _, im := range images {
		if im.PrivateTo == "" {
			names = append(names, im.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Health returns whether the node can create sandboxes, as its last
// containerd probe and creates found (see health).
func (l clusterLocal) Health() cluster.Health { return l.m.health.get() }

// containerdDown fails at once while the health checks find containerd
// not answering: a publish of the node's health does not wait for a
// containerd call's budget.
func (l clusterLocal) containerdDown() error {
	if h := l.m.health.get(); h.Reason == cluster.HealthContainerd {
		return errors.New(h.Message)
	}
	return nil
}

// Remove deletes sandbox id whoever owns it (cluster.Local.Remove): it was
// deleted through the fleet while the node was lost.
func (l clusterLocal) Remove(ctx context.Context, id string) error {
	if err := l.m.deleteSandbox(ctx, id); err != nil {
		return err
	}
	l.m.log.InfoContext(ctx, "sandbox deleted: it was deleted through the fleet while this node was lost", slog.String("sandbox_id", id))
	return nil
}

// Holds returns the node's sandboxes but unclaimed warm-pool members, and
// the creations in progress, with their owners.
func (l clusterLocal) Holds(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string)
	l.m.mu.Lock()
	for id, c := range l.m.creating {
		out[id] = c.spec.Owner
	}
	l.m.mu.Unlock()
	all, err := l.m.rt.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		if !sb.Pooled {
			out[sb.ID] = sb.Owner
		}
	}
	return out, nil
}

// Snapshots returns the node's stored snapshots with their owners
// (cluster.SnapshotLocal); none when its store keeps no snapshots.
func (l clusterLocal) Snapshots(ctx context.Context) (map[string]string, error) {
	st, err := l.m.snapshotStore()
	if err != nil {
		return nil, nil
	}
	all, err := st.ListSnapshots(ctx, func(string) bool { return true })
	if errors.Is(err, runtime.ErrSnapshotUnsupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(all))
	for _, s := range all {
		out[s.ID] = s.Owner
	}
	return out, nil
}
