package server

import (
	"context"
	"slices"

	"github.com/berth-sandbox/berth/server/cluster"
)

// placements records which node of a fleet holds each sandbox
// (cluster.Member); nil on a berthd outside a fleet. The handlers claim an
// id before they create its sandbox (or hand out a warm-pool member under
// it), and release it once the sandbox is removed.
type placements interface {
	// Claim records sandbox id, of owner, on this node, or fails with a status: another node holds it
	// (SANDBOX_PLACED_ELSEWHERE), the node takes no new sandboxes
	// (NODE_NOT_ACCEPTING), or the cluster store does not answer.
	Claim(ctx context.Context, id, owner string) error
	// Release removes the record of a removed sandbox.
	Release(ctx context.Context, id string)
	// Kick publishes the node's record soon: its images changed.
	Kick()
}

func (s *Service) claim(ctx context.Context, id, owner string) error {
	if s.cfg.Placements == nil {
		return nil
	}
	return s.cfg.Placements.Claim(ctx, id, owner)
}

func (s *Service) release(ctx context.Context, id string) {
	if s.cfg.Placements != nil {
		s.cfg.Placements.Release(ctx, id)
	}
}

// imagesChanged tells the fleet that the node's images changed, so that
// placement sees them soon.
func (s *Service) imagesChanged() {
	if s.cfg.Placements != nil {
		s.cfg.Placements.Kick()
	}
}

// ClusterLocal returns the node's side of its fleet membership
// (cluster.Local): its usage, images and sandboxes.
func (s *Service) ClusterLocal() cluster.Local { return clusterLocal{s} }

type clusterLocal struct{ s *Service }

var _ cluster.Local = clusterLocal{}

// Usage counts the sandboxes (running or stopped, warm-pool members and
// creations in progress included) and the memory promised to them as
// capacity admission does, and the execs running.
func (l clusterLocal) Usage(ctx context.Context) (cluster.Usage, error) {
	c := l.s.capacity
	existing, err := c.usage(ctx)
	if err != nil {
		return cluster.Usage{}, err
	}
	u := cluster.Usage{MaxSandboxes: uint64(max(c.maxSandboxes, 0)), MemoryBudget: c.memoryBudget, MaxExecs: uint64(max(c.maxExecs, 0))}
	for _, m := range existing {
		u.Sandboxes++
		u.MemoryBytes = addSaturating(u.MemoryBytes, m)
	}
	counted := func(id string, m uint64) {
		if _, ok := existing[id]; !ok {
			existing[id] = m
			u.Sandboxes++
			u.MemoryBytes = addSaturating(u.MemoryBytes, m)
		}
	}
	c.createMu.Lock()
	for id, m := range c.pending {
		counted(id, m)
	}
	c.createMu.Unlock()
	l.s.mu.Lock()
	for id, cr := range l.s.creating {
		counted(id, cr.spec.MemoryBytes)
	}
	l.s.mu.Unlock()
	_, execs := c.running("")
	u.Execs = uint64(max(execs, 0))
	return u, nil
}

// Images returns the names of the images in the node's store.
func (l clusterLocal) Images(ctx context.Context) ([]string, error) {
	images, err := l.s.rt.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(images))
	for _, im := range images {
		names = append(names, im.Name)
	}
	slices.Sort(names)
	return names, nil
}

// Holds returns the node's sandboxes but unclaimed warm-pool members, and
// the creations in progress, with their owners.
func (l clusterLocal) Holds(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string)
	l.s.mu.Lock()
	for id, c := range l.s.creating {
		out[id] = c.spec.Owner
	}
	l.s.mu.Unlock()
	all, err := l.s.rt.List(ctx, nil)
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

// Remove deletes a sandbox under its lifecycle lock.
func (l clusterLocal) Remove(ctx context.Context, id string) error {
	return l.s.deleteSandbox(ctx, id)
}
