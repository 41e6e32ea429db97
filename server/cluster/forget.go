package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc/status"
)

// lostNode returns the node named by err when err is a SANDBOX_UNREACHABLE
// whose cause is NODE_LOST (the node holding the sandbox has no lease);
// "" otherwise.
func lostNode(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if u, ok := d.(*berthv1.Unreachable); ok && u.GetCause() == berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST {
			return u.GetNodeId()
		}
	}
	return ""
}

// tombstoneRecord is the value of tombstones/<node>/<id>: the sandbox's
// record was removed while its node was lost, by a delete of its owner or
// an admin, and the node deletes the sandbox when it registers again
// (Member.reconcile).
type tombstoneRecord struct {
	// Revision is the store's revision of the removed record's last
	// change (KV.ModRevision).
	Revision int64 `json:"revision"`
	// DeletedAt is when the record was removed.
	DeletedAt time.Time `json:"deleted_at"`
	// Principal asked for the delete.
	Principal string `json:"principal,omitempty"`
}

// forgetLost removes the record of sandbox id when it still names node
// and node still holds no lease, leaving a tombstone (tombstoneRecord)
// for node (Store.ForgetLost): the DeleteSandbox of a sandbox
// whose node is lost, asked for by principal. It reports false when the
// record or the node changed since (the node registered again, or another
// call removed or replaced the record): the caller routes the delete
// again. A record that is gone already counts as removed.
func (d *Directory) forgetLost(ctx context.Context, id, node, principal string) (bool, error) {
	key := d.keys.sandbox(id)
	kv, err := getKey(ctx, d.store, key)
	if err != nil {
		return false, storeError("read the record of sandbox "+id, err)
	}
	if kv == nil {
		return true, nil
	}
	var rec SandboxRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return false, fmt.Errorf("cluster: the record of sandbox %s does not parse: %w", id, err)
	}
	if rec.Node != node {
		return false, nil
	}
	tomb, _ := json.Marshal(tombstoneRecord{Revision: kv.ModRevision, DeletedAt: time.Now().UTC(), Principal: principal})
	removed, err := d.store.ForgetLost(ctx, LostSandbox{Key: key, Revision: kv.ModRevision, NodeKey: d.keys.node(node),
		TombstoneKey: d.keys.tombstone(node, id), Tombstone: tomb})
	if err != nil {
		return false, storeError("remove the record of sandbox "+id, err)
	}
	return removed, nil
}
