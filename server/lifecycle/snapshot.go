package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// snapshots is what the Manager needs of containerd for stored snapshots
// (*runtime.Runtime).
type snapshots interface {
	CreateSnapshot(ctx context.Context, id, owner string, labels map[string]string, freeze func(context.Context) (func(), error)) (runtime.Snapshot, error)
	GetSnapshot(ctx context.Context, snapID string) (runtime.Snapshot, error)
	ListSnapshots(ctx context.Context, sees func(owner string) bool) ([]runtime.Snapshot, error)
	DeleteSnapshot(ctx context.Context, snapID string) error
	ForkSnapshot(ctx context.Context, id string, freeze func(context.Context) (func(), error), started func(forkID string), ph *runtime.Phases) (string, func() error, error)
	ForkMemory(parent, forkID string) (release func() error, err error)
	ForkMemoryDir(parent, forkID string) string
	SandboxEnv(ctx context.Context, id string) (map[string]string, error)
	SandboxDiskUsed(ctx context.Context, id string) (uint64, error)
}

// snapshotStore returns the Manager's store as a snapshots, or an error
// wrapping runtime.ErrSnapshotUnsupported.
func (m *Manager) snapshotStore() (snapshots, error) {
	s, ok := m.rt.(snapshots)
	if !ok {
		return nil, fmt.Errorf("%w: this store keeps no snapshots", runtime.ErrSnapshotUnsupported)
	}
	return s, nil
}

// CreateSnapshot stores a crash-consistent copy of sandbox id's root file
// system for caller p (runtime.Runtime.CreateSnapshot), under the
// sandbox's lifecycle lock: the sandbox is paused only around the sync
// and the btrfs snapshot, and one that was paused already stays paused.
// A sandbox p may not see is runtime.ErrSandboxNotFound; past
// Config.MaxSnapshotsPerPrincipal, runtime.ErrSnapshotLimit; past the
// server's disk budget or p's disk cap (admitCopy), *apierr.FleetBusy.
func (m *Manager) CreateSnapshot(ctx context.Context, id string, p auth.Principal, labels map[string]string) (runtime.Snapshot, error) {
	st, err := m.snapshotStore()
	if err != nil {
		return runtime.Snapshot{}, err
	}
	unlock, err := m.lockSeen(ctx, id, p)
	if err != nil {
		return runtime.Snapshot{}, err
	}
	defer unlock()
	if limit := m.cfg.MaxSnapshotsPerPrincipal; limit > 0 {
		l := m.snapshotLock(p.Name)
		l.Lock()
		defer l.Unlock()
		held, err := st.ListSnapshots(ctx, func(owner string) bool { return owner == p.Name })
		if err != nil {
			return runtime.Snapshot{}, fmt.Errorf("count the snapshots of %s: %w", p.Name, err)
		}
		if len(held) >= limit {
			return runtime.Snapshot{}, fmt.Errorf("%w: principal %s holds %d snapshots, at most %d (--max-snapshots-per-principal); delete one first", runtime.ErrSnapshotLimit, p.Name, len(held), limit)
		}
	}
	admitted, err := m.admitCopy(ctx, st, id, p)
	if err != nil {
		return runtime.Snapshot{}, err
	}
	defer admitted()
	snap, err := st.CreateSnapshot(ctx, id, p.Name, labels, m.freezer(id, "snapshot"))
	if err != nil {
		return runtime.Snapshot{}, err
	}
	if sp, ok := m.cfg.Placements.(SnapshotPlacements); ok {
		// In a fleet the snapshot is found through its record: one
		// that could not be recorded is not kept.
		if err := sp.RecordSnapshot(ctx, snap.ID, snap.Owner); err != nil {
			if derr := st.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID); derr != nil {
				m.log.Error("delete a snapshot that the fleet could not record; the node records it at its next registration", slog.String("snapshot_id", snap.ID), slog.Any("error", derr))
			}
			return runtime.Snapshot{}, err
		}
	}
	return snap, nil
}

// SnapshotPlacements records which node of a fleet keeps each snapshot
// (cluster.Member); a Placements without it records none.
type SnapshotPlacements interface {
	// RecordSnapshot records snapshot id, of owner, on this node, or
	// fails with a status (the cluster store does not answer).
	RecordSnapshot(ctx context.Context, id, owner string) error
	// ReleaseSnapshot removes the record of a deleted snapshot.
	ReleaseSnapshot(ctx context.Context, id string)
}

// admitCopy admits a copy of sandbox id's root that p takes (a snapshot,
// a fork's copy) within the server's disk budget and p's disk cap
// (admit.Capacity.AdmitStored): it will count the bytes the sandbox holds
// now beyond its image (runtime.Runtime.StoredDisk). A refusal is a
// *apierr.FleetBusy, as a create's. release must be called once the copy
// exists or has failed.
func (m *Manager) admitCopy(ctx context.Context, st snapshots, id string, p auth.Principal) (release func(), err error) {
	used, err := st.SandboxDiskUsed(ctx, id)
	if errors.Is(err, runtime.ErrDiskQuotaUnsupported) {
		used = 0
	} else if err != nil {
		return nil, fmt.Errorf("read the disk use of sandbox %s: %w", id, err)
	}
	return m.AdmitStored(ctx, id, p.Name, used)
}

// AdmitStored is admit.Capacity.AdmitStored with standby members giving
// way (giveWay): a member holds its parent's disk quota against the
// server's disk budget and its owner's disk cap, and a snapshot, a commit,
// a checkpoint image or a volume refused for that room takes it, as a
// sandbox does (volumesvc admits volumes here).
func (m *Manager) AdmitStored(ctx context.Context, id, owner string, bytes uint64) (release func(), err error) {
	return m.giveWay(ctx, func() (func(), error) { return m.capacity.AdmitStored(ctx, id, owner, bytes) })
}

// freezer returns the freeze of sandbox id for a copy of its root
// (runtime.Runtime.CreateSnapshot's freeze): it pauses the sandbox and
// returns the function that resumes it, or, for a sandbox paused already,
// one that leaves it paused. A hibernated sandbox has no process to
// freeze and nothing writes its files: it is copied as it is and stays
// hibernated (no wake). what names the copy in messages ("snapshot",
// "fork"). The caller holds the sandbox's lifecycle lock, which a wake
// takes too.
func (m *Manager) freezer(id, what string) func(context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		if m.reach.Paused(id) || m.reach.Hibernated(id) {
			return func() {}, nil
		}
		if err := m.reach.Pause(ctx, id); err != nil {
			// A pause cut off by the caller's cancel or deadline may have
			// frozen the task all the same: thaw it (a running sandbox
			// stays running), as nobody asked for it paused.
			if ctx.Err() != nil {
				if rerr := m.reach.Resume(context.WithoutCancel(ctx), id); rerr != nil {
					m.log.Error("resume after a cancelled pause for a "+what+" failed; the sandbox may stay frozen (ResumeSandbox thaws it)", slog.String("sandbox_id", id), slog.Any("error", rerr))
				}
			}
			return nil, fmt.Errorf("pause sandbox %s for its %s: %w", id, what, err)
		}
		paused := time.Now()
		return func() {
			m.log.InfoContext(ctx, "sandbox paused for its "+what, slog.String("sandbox_id", id), slog.Duration("frozen", time.Since(paused)))
			if err := m.reach.Resume(context.WithoutCancel(ctx), id); err != nil {
				m.log.Error("resume after a "+what+" failed; the sandbox stays paused (ResumeSandbox or any call resumes it)", slog.String("sandbox_id", id), slog.Any("error", err))
			}
		}, nil
	}
}

// snapshotLock returns the lock of principal's snapshot count.
func (m *Manager) snapshotLock(principal string) *sync.Mutex {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	if m.snapLocks == nil {
		m.snapLocks = map[string]*sync.Mutex{}
	}
	l, ok := m.snapLocks[principal]
	if !ok {
		l = &sync.Mutex{}
		m.snapLocks[principal] = l
	}
	return l
}

// GetSnapshot returns snapshot snapID when p may see it, else
// runtime.ErrSnapshotNotFound.
func (m *Manager) GetSnapshot(ctx context.Context, snapID string, p auth.Principal) (runtime.Snapshot, error) {
	st, err := m.snapshotStore()
	if err != nil {
		return runtime.Snapshot{}, err
	}
	s, err := st.GetSnapshot(ctx, snapID)
	if err != nil {
		return runtime.Snapshot{}, err
	}
	if !p.Sees(s.Owner) {
		return runtime.Snapshot{}, fmt.Errorf("%w: %s", runtime.ErrSnapshotNotFound, snapID)
	}
	return s, nil
}

// ListSnapshots returns the snapshots p may see, oldest first.
func (m *Manager) ListSnapshots(ctx context.Context, p auth.Principal) ([]runtime.Snapshot, error) {
	st, err := m.snapshotStore()
	if err != nil {
		return nil, err
	}
	return st.ListSnapshots(ctx, p.Sees)
}

// DeleteSnapshot removes snapshot snapID for p; another principal's is
// runtime.ErrSnapshotNotFound.
func (m *Manager) DeleteSnapshot(ctx context.Context, snapID string, p auth.Principal) error {
	st, err := m.snapshotStore()
	if err != nil {
		return err
	}
	if _, err := m.GetSnapshot(ctx, snapID, p); err != nil {
		return err
	}
	if err := st.DeleteSnapshot(ctx, snapID); err != nil {
		return err
	}
	if sp, ok := m.cfg.Placements.(SnapshotPlacements); ok {
		sp.ReleaseSnapshot(ctx, snapID)
	}
	m.RoomFreed()
	return nil
}

// RoomFreed says that room within the limits came back without a
// sandbox's delete (a snapshot or a volume deleted, a sandbox hibernated):
// a standby member refused for room, or that gave way, may be made again
// (Pool.Freed, as after a delete).
func (m *Manager) RoomFreed() { m.pool.Freed() }

// committer is what the Manager needs of containerd to make an image of a
// stored snapshot (*runtime.Runtime).
type committer interface {
	CommitSnapshot(ctx context.Context, snapID string, opts runtime.CommitOptions) (runtime.Commit, error)
	ListImages(ctx context.Context) ([]runtime.Image, error)
}

// CommitSnapshot makes image opts.Ref of snapshot snapID for p
// (runtime.Runtime.CommitSnapshot), its owner recorded as p; another
// principal's snapshot is runtime.ErrSnapshotNotFound. A private image
// (opts.Private) past Config.MaxSnapshotsPerPrincipal private images of p
// is runtime.ErrSnapshotLimit. One whose layer (the snapshot's DiskBytes,
// counted once more) would take the server past its disk budget or p
// past its disk cap is refused with a *apierr.FleetBusy (the image itself
// is then counted by the image store's cap, not p's). A fleet learns of
// the new image.
func (m *Manager) CommitSnapshot(ctx context.Context, snapID string, p auth.Principal, opts runtime.CommitOptions) (runtime.Commit, error) {
	st, ok := m.rt.(committer)
	if !ok {
		return runtime.Commit{}, fmt.Errorf("%w: this store keeps no snapshots", runtime.ErrSnapshotUnsupported)
	}
	snap, err := m.GetSnapshot(ctx, snapID, p)
	if err != nil {
		return runtime.Commit{}, err
	}
	// The image's layer holds what the snapshot holds beyond its image:
	// a principal past its disk cap turns no more snapshots into images.
	admitted, err := m.AdmitStored(ctx, snap.SandboxID, p.Name, snap.DiskBytes)
	if err != nil {
		return runtime.Commit{}, err
	}
	defer admitted()
	opts.Owner = p.Name
	if limit := m.cfg.MaxSnapshotsPerPrincipal; limit > 0 && opts.Private {
		// One snapshot commits under any number of names: each private
		// image counts as a snapshot does, so that a principal cannot
		// fill the image list every ListImages walks.
		l := m.snapshotLock(p.Name)
		l.Lock()
		defer l.Unlock()
		imgs, err := st.ListImages(ctx)
		if err != nil {
			return runtime.Commit{}, fmt.Errorf("count the private images of %s: %w", p.Name, err)
		}
		held := 0
		for _, img := range imgs {
			if img.PrivateTo == p.Name {
				held++
			}
		}
		if held >= limit {
			return runtime.Commit{}, fmt.Errorf("%w: principal %s holds %d private images, at most %d (--max-snapshots-per-principal); delete one first", runtime.ErrSnapshotLimit, p.Name, held, limit)
		}
	}
	c, err := st.CommitSnapshot(ctx, snapID, opts)
	if err == nil {
		m.ImagesChanged()
	}
	return c, err
}
