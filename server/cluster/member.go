package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Local is the node's own berthd, as its membership needs it.
type Local interface {
	// Usage returns the node's capacity in use and its limits.
	Usage(ctx context.Context) (Usage, error)
	// Images returns the image references in the node's store.
	Images(ctx context.Context) ([]string, error)
	// Holds returns the sandboxes the node holds — containers and
	// creations in progress, but no unclaimed warm-pool members — by id,
	// with their owners.
	Holds(ctx context.Context) (map[string]string, error)
	// Remove deletes sandbox id, which the node holds, whoever owns it:
	// its owner or an admin deleted it through the fleet while the node
	// was lost (a tombstone, see Member.reconcile). A missing sandbox is
	// not an error.
	Remove(ctx context.Context, id string) error
	// Health returns whether the node can create sandboxes now, as the
	// node last found (no I/O). The node calls Member.Kick when it
	// changes, so that the fleet sees it at once.
	Health() Health
}

// Member is a node's membership in the fleet: its lease, its published
// record and the records of the sandboxes it holds. Its methods are safe
// for concurrent use.
type Member struct {
	cfg   Config
	keys  keys
	store Store
	log   *slog.Logger

	local Local
	kick  chan struct{} // publish now
	// pub orders what publishes the node's usage (claims and publish),
	// so that an older reading never overwrites a newer one: a one-slot
	// semaphore, taken within a caller's context.
	pub chan struct{}
	// refused receives the refusal (*NodeIDInUseError) of the node's
	// first registration when it happened in the background.
	refused chan error

	mu    sync.Mutex
	lease LeaseID // 0 while the node holds none
	// registering is closed when the registration under way (if any)
	// has stored its lease or failed: its record may be visible a moment
	// before lease is set.
	registering chan struct{}
	startedAt   time.Time
	last        NodeRecord      // last published
	held        map[string]bool // sandbox ids recorded on this node
	// joined is set once the node registered in this process.
	joined bool
	// pubFailing is set while publications fail (logged once).
	pubFailing bool
	// conflicts are the local sandboxes whose ids the fleet records on
	// another node, by id, with that node's id (see reconcile).
	conflicts map[string]string

	stop context.CancelFunc
	done chan struct{}
}

// NewMember returns the membership of the node cfg describes in the fleet
// whose records st keeps (NewEtcdStore). Start registers it.
func NewMember(cfg Config, st Store, log *slog.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Member{cfg: cfg, keys: keys{cfg.Prefix}, store: st, log: log, kick: make(chan struct{}, 1), pub: make(chan struct{}, 1), refused: make(chan error, 1),
		held: make(map[string]bool), conflicts: make(map[string]string)}, nil
}

// NodeID returns the node's id.
func (m *Member) NodeID() string { return m.cfg.NodeID }

// Start takes the sandboxes local holds for the node's own — they were
// recorded on it when it last ran, and records of a node's sandboxes
// change only through the node — and registers the node under a new
// lease: revoking the lease of an earlier berthd of this node that no
// longer runs (a crash and restart), and failing with a *NodeIDInUseError, before
// it touched any record, when another berthd (of another host, another
// state directory, or a live process) does. It adopts the records of the
// sandboxes local holds (see reconcile). Then it keeps the lease and the
// published record fresh in the background, and registers again when the
// lease is lost, until Close.
//
// When etcd does not answer within the etcd budget, Start logs that the
// node waits for it and returns nil: the node serves the sandboxes it
// holds, takes no new ones (NODE_NOT_ACCEPTING), and registers in the
// background as soon as etcd answers; a refusal of that registration is
// sent on Refused.
func (m *Member) Start(ctx context.Context, local Local) error {
	m.local = local
	holds, err := local.Holds(ctx)
	if err != nil {
		return fmt.Errorf("cluster: list the node's sandboxes: %w", err)
	}
	m.mu.Lock()
	for id := range holds {
		m.held[id] = true
	}
	m.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	_, err = getKey(pctx, m.store, m.keys.node(m.cfg.NodeID))
	cancel()
	if err == nil {
		err = m.register(ctx)
		var inUse *NodeIDInUseError
		if errors.As(err, &inUse) {
			return err
		}
	}
	if err != nil {
		m.log.Warn("cluster: waiting for etcd: the node serves the sandboxes it holds and takes no new ones until it registered",
			slog.String("node_id", m.cfg.NodeID), slog.Int("sandboxes", len(holds)), slog.Any("error", err))
	}
	runCtx, stop := context.WithCancel(context.Background())
	m.stop, m.done = stop, make(chan struct{})
	go func() {
		defer close(m.done)
		m.run(runCtx)
	}()
	return nil
}

// Refused receives the *NodeIDInUseError of a first registration that
// Start left to the background (etcd did not answer then): another
// berthd holds the node id, and this one must not serve under it.
func (m *Member) Refused() <-chan error { return m.refused }

// Close stops refreshing and revokes the lease: the node is lost for the
// fleet at once (its sandboxes stay recorded as its own, and keep running
// for the next berthd to adopt). It waits at most the etcd budget for
// etcd; a lease it could not revoke ends after the lease time.
func (m *Member) Close() {
	if m.stop == nil {
		return
	}
	m.stop()
	<-m.done
	m.mu.Lock()
	lease := m.lease
	m.lease = 0
	m.mu.Unlock()
	if lease != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.EtcdBudget)
		defer cancel()
		if err := m.store.Revoke(ctx, lease); err != nil {
			m.log.Warn("cluster: revoke the node's lease; it ends after the lease time", slog.Any("error", err), slog.Duration("lease_ttl", m.cfg.LeaseTTL))
		}
	}
}

// registerWait bounds how long a claim waits for a registration under way
// to store its lease: long enough for a store that answers, short enough
// that a claim while etcd is down is still refused (NODE_NOT_ACCEPTING)
// at once, for the caller to try another node.
const registerWait = time.Second

// register takes a lease and puts the node's record under it, if no other
// registration of the node id holds one, then reconciles the sandbox
// records. It revokes the lease of a registration of an earlier process of
// this node that no longer runs (Holder.deadSelf), waits for one that
// recorded no holder to end, and refuses one of another berthd.
func (m *Member) register(ctx context.Context) error {
	for waited := false; ; waited = true {
		lease, err := m.store.Grant(ctx, m.cfg.LeaseTTL)
		if err != nil {
			return fmt.Errorf("cluster: take a lease of %v: %w", m.cfg.LeaseTTL, err)
		}
		now := time.Now().UTC()
		rec, err := m.record(ctx, now)
		if err != nil {
			m.revoke(lease)
			return err
		}
		rec.StartedAt = now
		body, _ := json.Marshal(rec)
		seen, _ := json.Marshal(seenRecord{Address: m.cfg.Address, FirstSeen: now})
		nodeKey := m.keys.node(m.cfg.NodeID)
		registered := make(chan struct{})
		m.mu.Lock()
		m.registering = registered
		m.mu.Unlock()
		registeredNow, got, err := m.store.Commit(ctx, []Fence{absent(nodeKey)},
			[]Op{putLeased(nodeKey, body, lease), put(m.keys.seen(m.cfg.NodeID), seen)}, nodeKey)
		m.mu.Lock()
		if err == nil && registeredNow {
			m.lease, m.startedAt, m.last = lease, now, rec
		}
		m.registering = nil
		m.mu.Unlock()
		close(registered)
		if err != nil {
			m.revoke(lease)
			return fmt.Errorf("cluster: register node %s: %w", m.cfg.NodeID, err)
		}
		if registeredNow {
			m.log.Info("cluster: node registered", slog.String("node_id", m.cfg.NodeID), slog.String("address", m.cfg.Address),
				slog.String("lease", fmt.Sprintf("%x", int64(lease))), slog.Duration("lease_ttl", m.cfg.LeaseTTL))
			if err := m.reconcile(ctx); err != nil {
				// Registered but not reconciled: undone, for the next
				// attempt to start from a clean state.
				m.mu.Lock()
				m.lease = 0
				m.mu.Unlock()
				m.revoke(lease)
				return err
			}
			m.mu.Lock()
			m.joined = true
			m.mu.Unlock()
			return nil
		}
		m.revoke(lease)
		if have := got[0]; have != nil {
			var other NodeRecord
			if err := json.Unmarshal(have.Value, &other); err != nil {
				return fmt.Errorf("cluster: the record of node %s does not parse: %w", m.cfg.NodeID, err)
			}
			if !m.cfg.Holder.earlierSelf(other.Holder) {
				return &NodeIDInUseError{NodeID: m.cfg.NodeID, Address: other.Address, Holder: other.Holder}
			}
			if m.cfg.Holder.deadSelf(other.Holder) {
				// This node's own registration, held by a process that no
				// longer runs (berthd crashed and was restarted): its lease
				// serves no one, so it ends now rather than after the
				// lease time, and the node registers at once.
				dead := have.Lease
				if err := m.store.Revoke(ctx, dead); err != nil && !errors.Is(err, ErrLeaseNotFound) {
					return fmt.Errorf("cluster: revoke lease %x of node %s's earlier berthd (%s), which no longer runs: %w", int64(dead), m.cfg.NodeID, other.Holder, err)
				}
				m.log.Info("cluster: revoked the lease of an earlier berthd of this node that no longer runs", slog.String("node_id", m.cfg.NodeID),
					slog.String("lease", fmt.Sprintf("%x", int64(dead))), slog.String("holder", other.Holder.String()))
				continue
			}
		}
		if !waited {
			m.log.Warn("cluster: the node id is registered under a live lease of an earlier berthd of this node that no longer runs; waiting for it to expire",
				slog.String("node_id", m.cfg.NodeID), slog.Duration("lease_ttl", m.cfg.LeaseTTL))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: node id %s stays registered by another lease: %w", m.cfg.NodeID, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func (m *Member) revoke(lease LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.store.Revoke(ctx, lease)
}

// reconcile makes the sandbox records agree with what the node holds, after
// a (re-)registration: a sandbox whose delete was asked for while the node
// was lost (a tombstone for this node, see Directory.forgetLost) is
// deleted here — the one case where the node deletes a sandbox on etcd's
// word: its owner or an admin asked for it — and its tombstone removed
// (kept, for the next registration, when the delete fails; the sandbox is
// not recorded again meanwhile); a sandbox the node holds without a record
// is recorded again (re-adopted); a record naming the node without a
// sandbox (it expired or was removed while the node was away) is
// released. A sandbox whose id the fleet records on another node is a
// conflict: it is kept running, logged at ERROR and counted (Conflicts),
// never deleted — the record may be the wrong one (a node restarted under
// another id, a second berthd with this id), and only an operator can
// tell. Records and tombstones are read, in one transaction, before the
// local sandboxes: a creation that claims its id after the read is listed
// by Holds, so its record is never taken for a leftover.
func (m *Member) reconcile(ctx context.Context) error {
	_, found, err := m.store.Read(ctx, prefixRange(m.keys.sandboxes()), prefixRange(m.keys.tombstones(m.cfg.NodeID)))
	if err != nil {
		return fmt.Errorf("cluster: read sandbox records: %w", err)
	}
	holds, err := m.local.Holds(ctx)
	if err != nil {
		return fmt.Errorf("cluster: list the node's sandboxes: %w", err)
	}
	deleted, err := m.buryDeleted(ctx, found[1], holds)
	if err != nil {
		return err
	}
	recorded := make(map[string]bool)
	conflicts := make(map[string]string)
	var adopted, released int
	for _, kv := range found[0] {
		id := m.keys.idOf(m.keys.sandboxes(), kv.Key)
		var rec SandboxRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		recorded[id] = true
		_, here := holds[id]
		switch {
		case rec.Node == m.cfg.NodeID && here:
			m.setHeld(id, true)
		case rec.Node == m.cfg.NodeID:
			if err := deleteUnchanged(ctx, m.store, kv); err != nil {
				return fmt.Errorf("cluster: release the record of sandbox %s: %w", id, err)
			}
			released++
		case here:
			conflicts[id] = rec.Node
			m.setHeld(id, false)
			m.log.Error("cluster: ownership conflict: this node runs a sandbox whose id the fleet records on another node; it keeps running here, calls for the id go to the recorded node, and an operator must delete one of the two",
				slog.String("sandbox_id", id), slog.String("node_id", m.cfg.NodeID), slog.String("recorded_node_id", rec.Node))
		}
	}
	for id, owner := range holds {
		if recorded[id] {
			continue
		}
		if err := m.claim(ctx, id, owner, true); err != nil {
			m.log.Error("cluster: record a sandbox the node holds", slog.String("sandbox_id", id), slog.Any("error", err))
			continue
		}
		adopted++
	}
	m.mu.Lock()
	m.conflicts = conflicts
	m.mu.Unlock()
	m.log.Info("cluster: sandbox records reconciled", slog.Int("held", len(holds)), slog.Int("recorded_again", adopted),
		slog.Int("released", released), slog.Int("conflicts", len(conflicts)), slog.Int("deleted", deleted))
	m.Kick()
	return m.reconcileSnapshots(ctx)
}

// buryDeleted deletes the sandboxes of holds that tombstones (this node's,
// read at the same revision as the records) name, and takes them out of
// holds; it removes each tombstone whose sandbox is gone, and reports how
// many sandboxes it deleted. A sandbox it fails to delete stays out of
// holds (not recorded again) and its tombstone stays, for the next
// registration.
func (m *Member) buryDeleted(ctx context.Context, tombstones []KV, holds map[string]string) (int, error) {
	deleted := 0
	for _, kv := range tombstones {
		id := m.keys.idOf(m.keys.tombstones(m.cfg.NodeID), kv.Key)
		if _, here := holds[id]; here {
			delete(holds, id)
			m.setHeld(id, false)
			var tomb tombstoneRecord
			_ = json.Unmarshal(kv.Value, &tomb)
			if err := m.local.Remove(ctx, id); err != nil {
				m.log.Error("cluster: delete a sandbox deleted through the fleet while this node was lost; it is not recorded again, and the delete is tried again when the node next registers",
					slog.String("sandbox_id", id), slog.String("principal", tomb.Principal), slog.Any("error", err))
				continue
			}
			deleted++
			m.log.Info("cluster: deleted a sandbox deleted through the fleet while this node was lost", slog.String("sandbox_id", id),
				slog.String("principal", tomb.Principal), slog.Time("deleted_at", tomb.DeletedAt), slog.Int64("record_revision", tomb.Revision))
		}
		if err := deleteUnchanged(ctx, m.store, kv); err != nil {
			return deleted, fmt.Errorf("cluster: remove the tombstone of sandbox %s: %w", id, err)
		}
	}
	return deleted, nil
}

// Conflicts returns the local sandboxes whose ids the fleet records on
// another node, by sandbox id, with the recorded node's id, as the last
// registration found them (less those removed since). Such a sandbox keeps
// running; calls for its id go to the recorded node.
func (m *Member) Conflicts() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.conflicts))
	for id, node := range m.conflicts {
		out[id] = node
	}
	return out
}

func (m *Member) setHeld(id string, held bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if held {
		m.held[id] = true
	} else {
		delete(m.held, id)
	}
}

// Holds reports whether the fleet records sandbox id on this node, as far
// as the node itself claimed or adopted it: records of a node's sandboxes
// change only through the node.
func (m *Member) Holds(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[id]
}

// Claim records sandbox id, created by owner, on this node
// (Store.ClaimSandbox): only if no node holds the id, while the node holds
// its lease and is not draining; the same write publishes the node's
// usage, which counts the creation in progress (Local.Usage), so that the
// next placement sees it. An id the node holds already is claimed again
// without change.
//
// Errors are statuses: ABORTED SANDBOX_PLACED_ELSEWHERE (metadata node_id)
// when another node holds the id, UNAVAILABLE NODE_NOT_ACCEPTING when the
// node drains or holds no lease, UNAVAILABLE CLUSTER_UNAVAILABLE when etcd
// does not answer.
func (m *Member) Claim(ctx context.Context, id, owner string) error {
	return m.claim(ctx, id, owner, false)
}

// claim is Claim; adopting records a sandbox the node holds already, which
// a draining node does too.
func (m *Member) claim(ctx context.Context, id, owner string, adopting bool) error {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	defer cancel()
	if !m.takePub(ctx) {
		return storeFailed(caller, m.cfg.EtcdBudget, ctx.Err())
	}
	defer func() { <-m.pub }()
	m.mu.Lock()
	lease, rec, registering := m.lease, m.last, m.registering
	m.mu.Unlock()
	if lease == 0 && registering != nil {
		// A caller may have seen the new record already: wait a moment
		// for its lease, but not for a store that does not answer.
		select {
		case <-registering:
		case <-time.After(registerWait):
		case <-ctx.Done():
		}
		m.mu.Lock()
		lease, rec = m.lease, m.last
		m.mu.Unlock()
	}
	if lease == 0 {
		return notAccepting(m.cfg.NodeID, id, false)
	}
	if u, err := m.local.Usage(ctx); err == nil {
		rec.Usage = u
	}
	rec.UpdatedAt = time.Now().UTC()
	nodeBody, _ := json.Marshal(rec)
	body, _ := json.Marshal(SandboxRecord{Node: m.cfg.NodeID, Owner: owner, CreatedAt: time.Now().UTC()})
	claimed, holder, draining, err := m.store.ClaimSandbox(ctx, SandboxClaim{
		Key: m.keys.sandbox(id), Record: body,
		NodeKey: m.keys.node(m.cfg.NodeID), NodeRecord: nodeBody, Lease: lease,
		DrainKey: m.keys.drain(m.cfg.NodeID), Adopting: adopting,
	})
	if err != nil {
		return storeFailed(caller, m.cfg.EtcdBudget, storeError(fmt.Sprintf("record sandbox %s on node %s", id, m.cfg.NodeID), err))
	}
	if claimed {
		m.setHeld(id, true)
		return nil
	}
	if holder != nil {
		var have SandboxRecord
		if err := json.Unmarshal(holder.Value, &have); err != nil {
			return fmt.Errorf("cluster: the record of sandbox %s does not parse: %w", id, err)
		}
		if have.Node == m.cfg.NodeID {
			m.setHeld(id, true)
			return nil
		}
		return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonPlacedElsewhere,
			fmt.Sprintf("sandbox %s is recorded on node %s, not on %s", id, have.Node, m.cfg.NodeID), map[string]string{"sandbox_id": id, "node_id": have.Node})
	}
	return notAccepting(m.cfg.NodeID, id, draining)
}

// notAccepting is UNAVAILABLE NODE_NOT_ACCEPTING of node for sandbox id:
// it drains, or it holds no lease (metadata cause "draining" or
// "no_lease").
func notAccepting(node, id string, draining bool) error {
	meta := map[string]string{"sandbox_id": id, "node_id": node, "cause": causeNoLease}
	msg := fmt.Sprintf("node %s holds no lease in the cluster store and takes no new sandboxes until it registered again", node)
	if draining {
		meta["cause"], msg = causeDraining, fmt.Sprintf("node %s is draining: it takes no new sandboxes", node)
	}
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonNodeNotAccepting, msg, meta)
}

// The causes of a NODE_NOT_ACCEPTING, in its metadata.
const (
	causeNoLease  = "no_lease"
	causeDraining = "draining"
)

// Release removes the record of sandbox id if it names this node, after
// the sandbox was removed (deleted, expired, or its creation failed).
// Failures are logged: the next registration's reconcile releases what
// is left.
func (m *Member) Release(ctx context.Context, id string) {
	m.setHeld(id, false)
	m.mu.Lock()
	delete(m.conflicts, id)
	m.mu.Unlock()
	defer m.Kick()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	defer cancel()
	if err := m.releaseRecord(ctx, m.keys.sandbox(id)); err != nil {
		m.log.Warn("cluster: release the record of a removed sandbox", slog.String("sandbox_id", id), slog.Any("error", err))
	}
}

// Kick publishes the node's record soon.
func (m *Member) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// record returns the node's record as it is now, without StartedAt. An
// unhealthy node whose usage or images cannot be read (its containerd
// does not answer) still publishes its health, with the usage and images
// it published last.
func (m *Member) record(ctx context.Context, now time.Time) (NodeRecord, error) {
	health := m.local.Health()
	u, uerr := m.local.Usage(ctx)
	images, ierr := m.local.Images(ctx)
	if health.Healthy() {
		if uerr != nil {
			return NodeRecord{}, fmt.Errorf("cluster: the node's usage: %w", uerr)
		}
		if ierr != nil {
			return NodeRecord{}, fmt.Errorf("cluster: the node's images: %w", ierr)
		}
	}
	if uerr != nil || ierr != nil {
		m.mu.Lock()
		last := m.last
		m.mu.Unlock()
		if uerr != nil {
			u = last.Usage
		}
		if ierr != nil {
			images = last.Images
		}
	}
	conflicts := slices.Sorted(maps.Keys(m.Conflicts()))
	return NodeRecord{ID: m.cfg.NodeID, Address: m.cfg.Address, Labels: m.cfg.Labels, Version: m.cfg.Version, UpdatedAt: now, Usage: u, Images: images, Conflicts: conflicts, Holder: m.cfg.Holder, Health: health}, nil
}

// takePub takes the publication slot within ctx (false when ctx ended
// first); the caller gives it back with <-m.pub.
func (m *Member) takePub(ctx context.Context) bool {
	select {
	case m.pub <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// publish puts the node's record under its lease.
func (m *Member) publish(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
	defer cancel()
	if !m.takePub(ctx) {
		return
	}
	defer func() { <-m.pub }()
	m.mu.Lock()
	lease, started := m.lease, m.startedAt
	m.mu.Unlock()
	if lease == 0 {
		return
	}
	rec, err := m.record(ctx, time.Now().UTC())
	if err != nil {
		m.log.Warn("cluster: publish the node's record", slog.Any("error", err))
		return
	}
	rec.StartedAt = started
	body, _ := json.Marshal(rec)
	_, _, err = m.store.Commit(ctx, nil, []Op{putLeased(m.keys.node(m.cfg.NodeID), body, lease)})
	m.mu.Lock()
	failing := m.pubFailing
	m.pubFailing = err != nil
	if err == nil && m.lease == lease {
		m.last = rec
	}
	m.mu.Unlock()
	switch {
	case err != nil && !failing:
		m.log.Warn("cluster: publish the node's record; retrying every publish interval, logged again once it succeeds", slog.Any("error", err), slog.Duration("interval", m.cfg.PublishInterval))
	case err != nil:
		m.log.Debug("cluster: publish the node's record", slog.Any("error", err))
	case failing:
		m.log.Info("cluster: the node's record is published again")
	}
}

// run keeps the lease alive and publishes the record until ctx ends; it
// registers the node when it holds no lease (etcd did not answer at Start,
// or the lease was lost). When the keep-alive breaks off (etcd did not
// answer for the lease time), the lease is kept if etcd, once it answers,
// says it still lives (an etcd restarted renews the leases it had);
// otherwise the node takes no new sandboxes and registers again under a
// fresh lease, retrying about every second while etcd does not answer.
func (m *Member) run(ctx context.Context) {
	tick := time.NewTicker(m.cfg.PublishInterval)
	defer tick.Stop()
	for ctx.Err() == nil {
		m.mu.Lock()
		lease := m.lease
		m.mu.Unlock()
		if lease == 0 {
			m.registerUntilDone(ctx)
			continue
		}
		ended, err := m.store.KeepAlive(ctx, lease)
		if err == nil {
		refresh:
			for {
				select {
				case <-ended:
					break refresh
				case <-tick.C:
					m.publish(ctx)
				case <-m.kick:
					m.publish(ctx)
				case <-ctx.Done():
					return
				}
			}
		}
		if ctx.Err() != nil || m.leaseLives(ctx, lease) {
			continue
		}
		m.mu.Lock()
		if m.lease == lease {
			m.lease = 0
		}
		m.mu.Unlock()
		m.log.Warn("cluster: the node lost its lease; it takes no new sandboxes until it registered again", slog.String("node_id", m.cfg.NodeID), slog.Any("error", err))
	}
}

// leaseLives waits for etcd to answer whether lease still lives, asking
// about every half second, and reports its answer (false when ctx ended).
func (m *Member) leaseLives(ctx context.Context, lease LeaseID) bool {
	for waited := false; ctx.Err() == nil; waited = true {
		tctx, cancel := context.WithTimeout(ctx, m.cfg.EtcdBudget)
		remaining, _, err := m.store.LeaseRemaining(tctx, lease)
		cancel()
		if err == nil {
			if remaining > 0 && waited {
				m.log.Info("cluster: etcd answers again and the node's lease held", slog.String("node_id", m.cfg.NodeID), slog.Int64("lease_remaining_s", int64(remaining/time.Second)))
			}
			return remaining > 0
		}
		if !waited {
			m.log.Warn("cluster: etcd does not answer the node's keep-alive; waiting for it", slog.String("node_id", m.cfg.NodeID), slog.Any("error", err))
		}
		sleep(ctx, jitter(500*time.Millisecond))
	}
	return false
}

// registerUntilDone registers the node, retrying about every second (with
// jitter, so that the nodes of a fleet whose leases lapsed together do not
// come back together) until it succeeds or ctx ends. A refusal of the
// node's first registration in this process goes to Refused.
func (m *Member) registerUntilDone(ctx context.Context) {
	for ctx.Err() == nil {
		regCtx, cancel := context.WithTimeout(ctx, 2*m.cfg.LeaseTTL)
		err := m.register(regCtx)
		cancel()
		if err == nil {
			return
		}
		level := slog.LevelWarn
		if inUse := (*NodeIDInUseError)(nil); errors.As(err, &inUse) {
			level = slog.LevelError // another berthd took the id while this one was away
			m.mu.Lock()
			joined := m.joined
			m.mu.Unlock()
			if !joined {
				select {
				case m.refused <- err:
				default:
				}
			}
		}
		wait := jitter(time.Second)
		m.log.Log(ctx, level, "cluster: register the node", slog.String("node_id", m.cfg.NodeID), slog.Any("error", err), slog.Duration("retry_in", wait))
		sleep(ctx, wait)
	}
}

// jitter returns d less up to a half of it, at random.
func jitter(d time.Duration) time.Duration {
	return d - rand.N(d/2+1)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// storeError is UNAVAILABLE CLUSTER_UNAVAILABLE, with a RetryInfo, for a
// failed etcd call; a context's end passes as it is (see storeFailed).
func storeError(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable, fmt.Sprintf("cluster store: %s: %v", what, err), nil,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
}

// storeFailed returns the error of a call whose etcd calls, under ctx
// bounded by the etcd budget, failed with err: the caller's own
// cancellation or deadline (ctx ended) as is; etcd not answering within
// the budget, or answering with an error, UNAVAILABLE CLUSTER_UNAVAILABLE
// with a RetryInfo. Nothing was recorded, so the call is safe to repeat.
func storeFailed(ctx context.Context, budget time.Duration, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	if !errors.Is(err, context.DeadlineExceeded) && rpcstatus.Reason(err) != rpcstatus.ReasonClusterUnavailable {
		return err
	}
	msg := fmt.Sprintf("the fleet's store (etcd) did not answer within %v: nothing was sent to any node; retry after %v", budget, clusterRetryDelay)
	if !errors.Is(err, context.DeadlineExceeded) {
		msg = fmt.Sprintf("%s; nothing was sent to any node, retry after %v", status.Convert(err).Message(), clusterRetryDelay)
	}
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable, msg, nil,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(clusterRetryDelay)})
}
