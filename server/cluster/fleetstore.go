package cluster

import (
	"context"
	"errors"
	"time"
)

// Store is what the fleet needs of the store it keeps its records in
// (etcd: EtcdStore): keys read at one revision, writes applied atomically
// only while their fences hold, a watch of a prefix, and leases that
// expire unless kept alive. The keys are those of keys; the fleet's
// records (NodeRecord, SandboxRecord, ...) are their values, in JSON.
// docs/fleet-store.md lists what each use relies on, and how a store other
// than etcd would meet it.
//
// Every call is linearizable: a read sees every write that was
// acknowledged before it began. A call that ctx ends or that the store
// does not answer returns an error and, for Commit, may or may not have
// applied: the fleet's callers repeat only what is safe to repeat.
type Store interface {
	// Read reads the keys of each range, all at one revision of the store
	// (one consistent cut across ranges), and returns that revision and
	// the keys found for each range in its order, keys ordered.
	Read(ctx context.Context, ranges ...Range) (revision int64, found [][]KV, err error)
	// Commit applies ops, in order, in one atomic step if every fence
	// holds, and reports true; else it applies none of them, reports
	// false, and returns the keys elseGet names as they are in that same
	// step (nil for an absent key), in order. With no fences, ops always
	// apply.
	Commit(ctx context.Context, fences []Fence, ops []Op, elseGet ...string) (applied bool, got []*KV, err error)
	// Watch sends the changes to the keys under prefix after revision
	// afterRev, in order, in batches (the changes of one Commit in one
	// batch; a batch's Revision is the store's revision when it was sent,
	// to watch on from), until ctx ends or the watch fails: then a last
	// batch carries Err and the channel is closed (the store lost its
	// quorum, or afterRev was compacted away; read again and watch from
	// that read's revision). The caller cancels ctx once it stops
	// reading.
	Watch(ctx context.Context, prefix string, afterRev int64) <-chan WatchBatch

	// Grant takes a new lease that lasts ttl (rounded up to a second)
	// unless kept alive. When a lease ends — it expired, or was revoked —
	// the store deletes every key put under it, at once and atomically:
	// for the fleet, the node whose record it is becomes lost.
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, error)
	// KeepAlive renews lease in the background until ctx ends; the
	// channel it returns is closed when renewing stops: ctx ended, the
	// lease ended, or the store did not answer for about the lease's
	// time. The lease may still live then (LeaseRemaining says).
	KeepAlive(ctx context.Context, lease LeaseID) (ended <-chan struct{}, err error)
	// LeaseRemaining returns how long lease lives unless renewed, and the
	// time it was granted for; remaining is 0 or less once it ended.
	LeaseRemaining(ctx context.Context, lease LeaseID) (remaining, granted time.Duration, err error)
	// Revoke ends lease now (deleting its keys, as expiry does); a lease
	// that ended already is ErrLeaseNotFound.
	Revoke(ctx context.Context, lease LeaseID) error

	// The fleet's writes to several keys that must hold together. Each
	// states the guarantee the fleet needs rather than the fences that
	// give it on etcd (one transaction there), so that a store without
	// multi-key transactions can meet it with single-key writes and a
	// check after (docs/fleet-store.md).

	// ClaimSandbox records a sandbox on its node (c.Key, c.Record) and
	// publishes the node's record (c.NodeKey, c.NodeRecord, under
	// c.Lease) only if no record of the sandbox exists, the node's key is
	// still under c.Lease (the node holds the lease it registered with:
	// a node the fleet may take for lost records nothing in its name),
	// and, unless c.Adopting, the node's drain key c.DrainKey is absent.
	// When it reports claimed, all of these held once both were written
	// and no other record of the sandbox was written: one holder per
	// sandbox id. Else it wrote nothing that stays, and reports what it
	// found: holder is the sandbox's record as it is (nil when absent),
	// draining whether c.DrainKey exists; with neither, the lease no
	// longer holds.
	ClaimSandbox(ctx context.Context, c SandboxClaim) (claimed bool, holder *KV, draining bool, err error)
	// ForgetLost removes the record of a sandbox whose node is lost and
	// leaves that node a tombstone (f.TombstoneKey, f.Tombstone), only
	// while the record is unchanged since read at f.Revision and the
	// node's key f.NodeKey is absent (the node holds no lease). When it
	// reports forgotten, the record is gone and the tombstone is there; a
	// node that registers again finds the tombstone (or, on a store that
	// cannot write both at once, its record being removed) and deletes
	// the sandbox. Else it removed nothing: the record changed or the
	// node registered again.
	ForgetLost(ctx context.Context, f LostSandbox) (forgotten bool, err error)
	// RemoveNode removes the records of a node that holds no lease: first
	// the keys of r.Snapshots, then the records r.Records (each only if
	// unchanged since read at its ModRevision), and with the last of them
	// r.Keys and every key under each of r.Prefixes (the node's own keys),
	// all only while r.NodeKey is absent. It may remove them in several
	// steps: progress says how many of each it removed, and Done whether
	// it removed everything. A step refused (the node registered, or a
	// record changed) ends it with what earlier steps removed kept, and
	// the node's own keys not removed, so the node stays listed and the
	// call can be repeated.
	RemoveNode(ctx context.Context, r NodeRemoval) (progress NodeRemoved, err error)
}

// SandboxClaim is what Store.ClaimSandbox writes and checks.
type SandboxClaim struct {
	Key    string // the sandbox's record
	Record []byte
	// NodeKey is the claiming node's key, put with NodeRecord under
	// Lease, the lease the node registered with.
	NodeKey    string
	NodeRecord []byte
	Lease      LeaseID
	// DrainKey is the node's drain mark: the claim is refused while it
	// exists, unless Adopting (a record of a sandbox the node runs
	// already, which a draining node records too).
	DrainKey string
	Adopting bool
}

// LostSandbox is what Store.ForgetLost removes and writes.
type LostSandbox struct {
	Key      string // the sandbox's record,
	Revision int64  // as read (its ModRevision)
	NodeKey  string // the key of the node that holds it, absent while lost
	// TombstoneKey and Tombstone are written for the node.
	TombstoneKey string
	Tombstone    []byte
}

// NodeRemoval is what Store.RemoveNode removes.
type NodeRemoval struct {
	NodeKey   string   // absent while the node holds no lease
	Snapshots []string // the node's snapshot records, removed first
	// Records are the node's sandbox records as read (Key, ModRevision).
	Records []KV
	// Keys and Prefixes are removed with the last records.
	Keys     []string
	Prefixes []string
}

// NodeRemoved is how far a Store.RemoveNode got.
type NodeRemoved struct {
	Snapshots int // of NodeRemoval.Snapshots, removed
	Records   int // of NodeRemoval.Records, removed
	Done      bool
}

// LeaseID names a lease of a Store; 0 is none.
type LeaseID int64

// ErrLeaseNotFound is a Store's error for a lease that ended (expired or
// revoked) or never was.
var ErrLeaseNotFound = errors.New("cluster store: lease not found")

// KV is one key of a Store as read.
type KV struct {
	Key   string
	Value []byte
	// ModRevision is the store's revision of the key's last write: a
	// FenceUnchanged of it holds while nothing wrote the key since.
	ModRevision int64
	// Lease is the lease the key was put under (0: none).
	Lease LeaseID
}

// Range names what a Read reads: one key, or every key under a prefix.
type Range struct {
	Key    string
	Prefix bool
}

func keyRange(key string) Range       { return Range{Key: key} }
func prefixRange(prefix string) Range { return Range{Key: prefix, Prefix: true} }

// FenceKind is what a Fence asks of its key.
type FenceKind int

// The fences a Commit can take: each the condition of one key, checked in
// the same atomic step as the writes.
const (
	// FenceAbsent holds while the key does not exist: a write that
	// creates a key only once (a sandbox id's one holder, a node id's one
	// registration), and "the node holds no lease" for its node key.
	FenceAbsent FenceKind = iota + 1
	// FencePresent holds while the key exists.
	FencePresent
	// FenceUnchanged holds while the key exists and was not written since
	// the read that returned Revision as its ModRevision: compare-and-swap
	// of a record read before.
	FenceUnchanged
	// FenceLease holds while the key exists under lease Lease: for the
	// node key, "this node still holds the lease it registered with", so
	// that a node that lost its lease (and may be taken for lost by the
	// fleet) writes nothing in its name.
	FenceLease
)

// Fence is one condition of a Commit.
type Fence struct {
	Kind     FenceKind
	Key      string
	Revision int64   // FenceUnchanged
	Lease    LeaseID // FenceLease
}

func absent(key string) Fence  { return Fence{Kind: FenceAbsent, Key: key} }
func present(key string) Fence { return Fence{Kind: FencePresent, Key: key} }
func unchanged(key string, rev int64) Fence {
	return Fence{Kind: FenceUnchanged, Key: key, Revision: rev}
}
func leasedBy(key string, l LeaseID) Fence { return Fence{Kind: FenceLease, Key: key, Lease: l} }

// OpKind is what an Op does.
type OpKind int

// The writes a Commit can make.
const (
	// OpPut writes Value at Key, under Lease when it is not 0 (the key
	// goes when the lease ends).
	OpPut OpKind = iota + 1
	// OpDelete deletes Key; an absent key is no error.
	OpDelete
	// OpDeletePrefix deletes every key under Key.
	OpDeletePrefix
)

// Op is one write of a Commit.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte
	Lease LeaseID
}

func put(key string, value []byte) Op { return Op{Kind: OpPut, Key: key, Value: value} }
func putLeased(key string, value []byte, l LeaseID) Op {
	return Op{Kind: OpPut, Key: key, Value: value, Lease: l}
}
func del(key string) Op          { return Op{Kind: OpDelete, Key: key} }
func delPrefix(prefix string) Op { return Op{Kind: OpDeletePrefix, Key: prefix} }

// WatchBatch is the changes of one revision of a Watch, or its end (Err).
type WatchBatch struct {
	Revision int64
	Events   []WatchEvent
	Err      error
}

// WatchEvent is one key's change: its value after a put, or its deletion
// (a delete, or the end of the lease it was put under).
type WatchEvent struct {
	Deleted bool
	KV      KV
}

// getKey reads key from st: nil when it is absent.
func getKey(ctx context.Context, st Store, key string) (*KV, error) {
	_, found, err := st.Read(ctx, keyRange(key))
	if err != nil || len(found[0]) == 0 {
		return nil, err
	}
	return &found[0][0], nil
}

// deleteUnchanged deletes kv's key if nothing wrote it since it was read
// as kv (a record released or a tombstone removed by the node that read
// it): a key changed meanwhile is left as it is, without error.
func deleteUnchanged(ctx context.Context, st Store, kv KV) error {
	_, _, err := st.Commit(ctx, []Fence{unchanged(kv.Key, kv.ModRevision)}, []Op{del(kv.Key)})
	return err
}
