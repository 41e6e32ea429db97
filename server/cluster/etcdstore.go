package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore is the fleet's Store in etcd (v3 API): a Read is a range (or
// one read-only transaction of ranges), a Commit one transaction, the
// fences its compares (FenceAbsent: CreateRevision == 0, FencePresent:
// CreateRevision > 0, FenceUnchanged: ModRevision == Revision,
// FenceLease: LeaseValue == Lease), a lease an etcd lease.
type EtcdStore struct {
	cli *clientv3.Client
}

var _ Store = (*EtcdStore)(nil)

// NewEtcdStore returns the Store in the etcd cli reaches (Connect).
func NewEtcdStore(cli *clientv3.Client) *EtcdStore { return &EtcdStore{cli: cli} }

// Read implements Store: one range alone, several in one transaction
// (etcd serves a transaction at one revision).
func (s *EtcdStore) Read(ctx context.Context, ranges ...Range) (int64, [][]KV, error) {
	opts := func(r Range) []clientv3.OpOption {
		if r.Prefix {
			return []clientv3.OpOption{clientv3.WithPrefix()}
		}
		return nil
	}
	found := make([][]KV, len(ranges))
	if len(ranges) == 1 {
		resp, err := s.cli.Get(ctx, ranges[0].Key, opts(ranges[0])...)
		if err != nil {
			return 0, nil, err
		}
		found[0] = kvsOf(resp.Kvs)
		return resp.Header.Revision, found, nil
	}
	ops := make([]clientv3.Op, len(ranges))
	for i, r := range ranges {
		ops[i] = clientv3.OpGet(r.Key, opts(r)...)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return 0, nil, err
	}
	for i, r := range resp.Responses {
		found[i] = kvsOf(r.GetResponseRange().GetKvs())
	}
	return resp.Header.Revision, found, nil
}

// Commit implements Store as one etcd transaction.
func (s *EtcdStore) Commit(ctx context.Context, fences []Fence, ops []Op, elseGet ...string) (bool, []*KV, error) {
	cmps := make([]clientv3.Cmp, len(fences))
	for i, f := range fences {
		switch f.Kind {
		case FenceAbsent:
			cmps[i] = clientv3.Compare(clientv3.CreateRevision(f.Key), "=", 0)
		case FencePresent:
			cmps[i] = clientv3.Compare(clientv3.CreateRevision(f.Key), ">", 0)
		case FenceUnchanged:
			cmps[i] = clientv3.Compare(clientv3.ModRevision(f.Key), "=", f.Revision)
		case FenceLease:
			cmps[i] = clientv3.Compare(clientv3.LeaseValue(f.Key), "=", int64(f.Lease))
		default:
			return false, nil, fmt.Errorf("cluster store: fence of kind %d on %s", f.Kind, f.Key)
		}
	}
	thens := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		switch op.Kind {
		case OpPut:
			var opts []clientv3.OpOption
			if op.Lease != 0 {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(op.Lease)))
			}
			thens[i] = clientv3.OpPut(op.Key, string(op.Value), opts...)
		case OpDelete:
			thens[i] = clientv3.OpDelete(op.Key)
		case OpDeletePrefix:
			thens[i] = clientv3.OpDelete(op.Key, clientv3.WithPrefix())
		default:
			return false, nil, fmt.Errorf("cluster store: op of kind %d on %s", op.Kind, op.Key)
		}
	}
	elses := make([]clientv3.Op, len(elseGet))
	for i, key := range elseGet {
		elses[i] = clientv3.OpGet(key)
	}
	txn := s.cli.Txn(ctx)
	if len(cmps) > 0 {
		txn = txn.If(cmps...)
	}
	txn = txn.Then(thens...) // clientv3 takes If, Then, Else in that order
	if len(elses) > 0 {
		txn = txn.Else(elses...)
	}
	resp, err := txn.Commit()
	if err != nil {
		return false, nil, err
	}
	if resp.Succeeded {
		return true, nil, nil
	}
	got := make([]*KV, len(elseGet))
	for i, r := range resp.Responses {
		if kvs := kvsOf(r.GetResponseRange().GetKvs()); len(kvs) > 0 {
			got[i] = &kvs[0]
		}
	}
	return false, got, nil
}

// ClaimSandbox implements Store as one transaction: compares that the
// record is absent, the node key under the lease and (unless adopting)
// the drain key absent; puts of the record and the node key; else gets of
// the record and the drain key.
func (s *EtcdStore) ClaimSandbox(ctx context.Context, c SandboxClaim) (bool, *KV, bool, error) {
	fences := []Fence{absent(c.Key), leasedBy(c.NodeKey, c.Lease)}
	if !c.Adopting {
		fences = append(fences, absent(c.DrainKey))
	}
	claimed, got, err := s.Commit(ctx, fences, []Op{put(c.Key, c.Record), putLeased(c.NodeKey, c.NodeRecord, c.Lease)}, c.Key, c.DrainKey)
	if err != nil || claimed {
		return claimed, nil, false, err
	}
	return false, got[0], got[1] != nil, nil
}

// ForgetLost implements Store as one transaction: compares that the record
// is unchanged and the node key absent; the record's delete and the
// tombstone's put.
func (s *EtcdStore) ForgetLost(ctx context.Context, f LostSandbox) (bool, error) {
	forgotten, _, err := s.Commit(ctx, []Fence{unchanged(f.Key, f.Revision), absent(f.NodeKey)},
		[]Op{del(f.Key), put(f.TombstoneKey, f.Tombstone)})
	return forgotten, err
}

// removeBatch bounds the records one RemoveNode transaction deletes: etcd
// refuses transactions of more than --max-txn-ops (128 by default)
// operations.
const removeBatch = 100

// RemoveNode implements Store in transactions of at most removeBatch
// deletes, each fenced on the node key absent: the snapshot records, then
// the sandbox records (each fenced unchanged), the node's own keys with
// the last batch (which is made even when there are no records).
func (s *EtcdStore) RemoveNode(ctx context.Context, r NodeRemoval) (NodeRemoved, error) {
	var done NodeRemoved
	for start := 0; start < len(r.Snapshots); start += removeBatch {
		var ops []Op
		for _, key := range r.Snapshots[start:min(start+removeBatch, len(r.Snapshots))] {
			ops = append(ops, del(key))
		}
		removed, _, err := s.Commit(ctx, []Fence{absent(r.NodeKey)}, ops)
		if err != nil || !removed {
			return done, err
		}
		done.Snapshots += len(ops)
	}
	for start := 0; start == 0 || start < len(r.Records); start += removeBatch {
		batch := r.Records[start:min(start+removeBatch, len(r.Records))]
		fences := []Fence{absent(r.NodeKey)}
		var ops []Op
		for _, kv := range batch {
			fences = append(fences, unchanged(kv.Key, kv.ModRevision))
			ops = append(ops, del(kv.Key))
		}
		if start+removeBatch >= len(r.Records) {
			for _, key := range r.Keys {
				ops = append(ops, del(key))
			}
			for _, prefix := range r.Prefixes {
				ops = append(ops, delPrefix(prefix))
			}
		}
		removed, _, err := s.Commit(ctx, fences, ops)
		if err != nil || !removed {
			return done, err
		}
		done.Records += len(batch)
	}
	done.Done = true
	return done, nil
}

// Watch implements Store with an etcd watch that requires a leader: it
// ends with an error when the member it talks to loses its quorum, rather
// than staying silent.
func (s *EtcdStore) Watch(ctx context.Context, prefix string, afterRev int64) <-chan WatchBatch {
	wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(afterRev+1))
	out := make(chan WatchBatch)
	go func() {
		defer close(out)
		for wr := range wch {
			b := WatchBatch{Revision: wr.Header.Revision, Err: wr.Err()}
			for _, ev := range wr.Events {
				b.Events = append(b.Events, WatchEvent{Deleted: ev.Type == clientv3.EventTypeDelete, KV: kvOf(ev.Kv)})
			}
			select {
			case out <- b:
			case <-ctx.Done():
				return
			}
			if b.Err != nil {
				return
			}
		}
	}()
	return out
}

// Grant implements Store.
func (s *EtcdStore) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	g, err := s.cli.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, err
	}
	return LeaseID(g.ID), nil
}

// KeepAlive implements Store with clientv3's keep-alive, which renews
// about every third of the lease's time and gives up when etcd did not
// answer for the lease's time.
func (s *EtcdStore) KeepAlive(ctx context.Context, lease LeaseID) (<-chan struct{}, error) {
	alive, err := s.cli.KeepAlive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		return nil, err
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for range alive { // clientv3 closes it when ctx ends or renewing stops
		}
	}()
	return ended, nil
}

// LeaseRemaining implements Store (etcd's TimeToLive: -1 s once ended).
func (s *EtcdStore) LeaseRemaining(ctx context.Context, lease LeaseID) (time.Duration, time.Duration, error) {
	resp, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		return 0, 0, err
	}
	return time.Duration(resp.TTL) * time.Second, time.Duration(resp.GrantedTTL) * time.Second, nil
}

// Revoke implements Store.
func (s *EtcdStore) Revoke(ctx context.Context, lease LeaseID) error {
	_, err := s.cli.Revoke(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: %w", ErrLeaseNotFound, err)
	}
	return err
}

func kvOf(kv *mvccpb.KeyValue) KV {
	return KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, Lease: LeaseID(kv.Lease)}
}

func kvsOf(kvs []*mvccpb.KeyValue) []KV {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]KV, len(kvs))
	for i, kv := range kvs {
		out[i] = kvOf(kv)
	}
	return out
}
