package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
)

// SnapshotRecord is the value of snapshots/<id>: the node that keeps a
// stored snapshot (CreateSnapshot), which the fleet routes DeleteSnapshot,
// CommitSnapshot and CreateSandbox from_snapshot to, and the principal
// that took it (a routing node answers for a lost node's snapshots only to
// those who may see them). Unlike a node's record it has no lease: a
// snapshot outlives its node's absences, as a sandbox's record does.
type SnapshotRecord = SandboxRecord

// SnapshotLocal is the part of Local that lists a node's stored snapshots;
// a Local without it keeps no snapshots (their records are left alone).
type SnapshotLocal interface {
	// Snapshots returns the node's stored snapshots, by id, with their
	// owners.
	Snapshots(ctx context.Context) (map[string]string, error)
}

// RecordSnapshot records snapshot id, taken by owner, on this node, before
// CreateSnapshot answers: a snapshot id is new (random), so a record of it
// on another node is an error, as is etcd not answering within the etcd
// budget (a status: UNAVAILABLE CLUSTER_UNAVAILABLE). A record of id on
// this node is kept.
func (m *Member) RecordSnapshot(ctx context.Context, id, owner string) error {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	defer cancel()
	key := m.keys.snapshot(id)
	body, _ := json.Marshal(SnapshotRecord{Node: m.cfg.NodeID, Owner: owner, CreatedAt: time.Now().UTC()})
	recorded, got, err := m.store.Commit(ctx, []Fence{absent(key)}, []Op{put(key, body)}, key)
	if err != nil {
		return storeFailed(caller, m.cfg.EtcdBudget, storeError(fmt.Sprintf("record snapshot %s on node %s", id, m.cfg.NodeID), err))
	}
	if recorded {
		return nil
	}
	var have SnapshotRecord
	if kv := got[0]; kv != nil && json.Unmarshal(kv.Value, &have) == nil && have.Node == m.cfg.NodeID {
		return nil
	}
	return fmt.Errorf("cluster: snapshot %s is recorded on node %s already, not on %s", id, have.Node, m.cfg.NodeID)
}

// ReleaseSnapshot removes the record of snapshot id if it names this node,
// after the snapshot was deleted. Failures are logged: the next
// registration's reconcile releases what is left.
func (m *Member) ReleaseSnapshot(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	defer cancel()
	if err := m.releaseRecord(ctx, m.keys.snapshot(id)); err != nil {
		m.log.Warn("cluster: release the record of a deleted snapshot", slog.String("snapshot_id", id), slog.Any("error", err))
	}
}

// releaseRecord deletes the record at key if it names this node and did
// not change since it was read.
func (m *Member) releaseRecord(ctx context.Context, key string) error {
	kv, err := getKey(ctx, m.store, key)
	if err != nil || kv == nil {
		return err
	}
	var rec SandboxRecord
	if json.Unmarshal(kv.Value, &rec) != nil || rec.Node != m.cfg.NodeID {
		return nil
	}
	return deleteUnchanged(ctx, m.store, *kv)
}

// reconcileSnapshots makes the fleet's snapshot records of this node those
// of the snapshots it keeps, at each registration: a snapshot without a
// record (taken while etcd was away, or before the node joined a fleet)
// is recorded; a record of this node without its snapshot (deleted while
// the record could not be removed) is released. A snapshot recorded on
// another node is logged at ERROR and left as it is.
func (m *Member) reconcileSnapshots(ctx context.Context) error {
	sl, ok := m.local.(SnapshotLocal)
	if !ok {
		return nil
	}
	_, found, err := m.store.Read(ctx, prefixRange(m.keys.snapshots()))
	if err != nil {
		return fmt.Errorf("cluster: read snapshot records: %w", err)
	}
	records := found[0]
	kept, err := sl.Snapshots(ctx)
	if err != nil {
		return fmt.Errorf("cluster: list the node's snapshots: %w", err)
	}
	recorded := make(map[string]bool, len(records))
	var adopted, released int
	for _, kv := range records {
		id := m.keys.idOf(m.keys.snapshots(), kv.Key)
		var rec SnapshotRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		recorded[id] = true
		_, here := kept[id]
		switch {
		case rec.Node == m.cfg.NodeID && !here:
			if err := deleteUnchanged(ctx, m.store, kv); err != nil {
				return fmt.Errorf("cluster: release the record of snapshot %s: %w", id, err)
			}
			released++
		case rec.Node != m.cfg.NodeID && here:
			m.log.Error("cluster: this node keeps a snapshot whose id the fleet records on another node; calls for the id go to the recorded node",
				slog.String("snapshot_id", id), slog.String("node_id", m.cfg.NodeID), slog.String("recorded_node_id", rec.Node))
		}
	}
	for id, owner := range kept {
		if recorded[id] {
			continue
		}
		if err := m.RecordSnapshot(ctx, id, owner); err != nil {
			m.log.Error("cluster: record a snapshot the node keeps", slog.String("snapshot_id", id), slog.Any("error", err))
			continue
		}
		adopted++
	}
	m.log.Info("cluster: snapshot records reconciled", slog.Int("kept", len(kept)), slog.Int("recorded_again", adopted), slog.Int("released", released))
	return nil
}
