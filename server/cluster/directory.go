package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
)

// Directory reads the fleet from its store for routing and placement:
// which nodes hold a lease (kept current by a watch), and which node holds
// a sandbox (read from the store at each call, linearizably). Its methods
// are safe for concurrent use.
type Directory struct {
	store Store
	keys  keys
	log   *slog.Logger

	mu    sync.Mutex
	nodes map[string]NodeRecord // live nodes, from the watch

	stop context.CancelFunc
	done chan struct{}
}

// NewDirectory returns the directory of the fleet under prefix ("" for
// DefaultPrefix) in st (NewEtcdStore). Start fills it.
func NewDirectory(st Store, prefix string, log *slog.Logger) (*Directory, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	return &Directory{store: st, keys: keys{prefix}, log: log, nodes: make(map[string]NodeRecord)}, nil
}

// Start reads the live nodes and follows their changes in the background
// until Close. When etcd does not answer within budget (default DefaultEtcdBudget), it
// logs so and returns nil: the view stays empty until etcd answers, and
// fills then.
func (d *Directory) Start(ctx context.Context, budget time.Duration) error {
	if budget <= 0 {
		budget = DefaultEtcdBudget
	}
	lctx, cancel := context.WithTimeout(ctx, budget)
	rev, err := d.load(lctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		d.log.Warn("cluster: waiting for etcd: the fleet's nodes are read once it answers", slog.Any("error", err))
	}
	runCtx, stop := context.WithCancel(context.Background())
	d.stop, d.done = stop, make(chan struct{})
	go func() {
		defer close(d.done)
		d.follow(runCtx, rev)
	}()
	return nil
}

// Close stops following.
func (d *Directory) Close() {
	if d.stop != nil {
		d.stop()
		<-d.done
	}
}

// load replaces the live nodes with etcd's and returns the revision read.
func (d *Directory) load(ctx context.Context) (int64, error) {
	rev, found, err := d.store.Read(ctx, prefixRange(d.keys.nodes()))
	if err != nil {
		return 0, storeError("read the fleet's nodes", err)
	}
	nodes := make(map[string]NodeRecord, len(found[0]))
	for _, kv := range found[0] {
		if rec, ok := parseNode(kv.Value, kv.Lease); ok {
			nodes[rec.ID] = rec
		}
	}
	d.mu.Lock()
	d.nodes = nodes
	d.mu.Unlock()
	return rev, nil
}

// follow applies the node keys' changes after rev, reloading when the
// watch fails (etcd unreachable, or rev compacted away), until ctx ends.
func (d *Directory) follow(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		if rev == 0 {
			rev = d.reload(ctx)
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		for wb := range d.store.Watch(wctx, d.keys.nodes(), rev) {
			if wb.Err != nil {
				d.log.Warn("cluster: watch of the fleet's nodes failed; reading them again", slog.Any("error", wb.Err))
				break
			}
			d.mu.Lock()
			for _, ev := range wb.Events {
				id := d.keys.idOf(d.keys.nodes(), ev.KV.Key)
				if ev.Deleted {
					delete(d.nodes, id)
				} else if rec, ok := parseNode(ev.KV.Value, ev.KV.Lease); ok {
					d.nodes[id] = rec
				}
			}
			d.mu.Unlock()
			rev = wb.Revision
		}
		cancel()
		rev = d.reload(ctx)
	}
}

// reload reads the live nodes again, every half second until etcd answers,
// and returns the revision read (0 when ctx ended).
func (d *Directory) reload(ctx context.Context) int64 {
	for ctx.Err() == nil {
		if r, err := d.load(ctx); err == nil {
			return r
		}
		sleep(ctx, 500*time.Millisecond)
	}
	return 0
}

func parseNode(b []byte, lease LeaseID) (NodeRecord, bool) {
	var rec NodeRecord
	if json.Unmarshal(b, &rec) != nil || rec.ID == "" {
		return NodeRecord{}, false
	}
	rec.Lease = lease
	return rec, true
}

// LiveNode returns node id when it holds a lease. A node missing from the
// watched view is looked up in etcd, so that a node that registered a
// moment ago is not taken for lost.
func (d *Directory) LiveNode(ctx context.Context, id string) (NodeRecord, bool, error) {
	d.mu.Lock()
	rec, ok := d.nodes[id]
	d.mu.Unlock()
	if ok {
		return rec, true, nil
	}
	kv, err := getKey(ctx, d.store, d.keys.node(id))
	if err != nil {
		return NodeRecord{}, false, storeError("read node "+id, err)
	}
	if kv == nil {
		return NodeRecord{}, false, nil
	}
	rec, ok = parseNode(kv.Value, kv.Lease)
	return rec, ok, nil
}

// LiveNodes returns the nodes holding a lease, from the watched view,
// ordered by id.
func (d *Directory) LiveNodes() []NodeRecord {
	d.mu.Lock()
	out := make([]NodeRecord, 0, len(d.nodes))
	for _, n := range d.nodes {
		out = append(out, n)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Nodes reads the nodes holding a lease, with their drain marks, from etcd
// (linearizably, in one transaction), ordered by id: what placement
// decides on.
func (d *Directory) Nodes(ctx context.Context) ([]NodeRecord, error) {
	_, found, err := d.store.Read(ctx, prefixRange(d.keys.nodes()), prefixRange(d.keys.drains()))
	if err != nil {
		return nil, storeError("read the fleet's nodes", err)
	}
	draining := make(map[string]bool)
	for _, kv := range found[1] {
		draining[d.keys.idOf(d.keys.drains(), kv.Key)] = true
	}
	var out []NodeRecord
	for _, kv := range found[0] {
		if rec, ok := parseNode(kv.Value, kv.Lease); ok {
			rec.Draining = draining[rec.ID]
			out = append(out, rec)
		}
	}
	return out, nil
}

// Sandbox returns the record of sandbox id, read from etcd; false when no
// node holds the id.
func (d *Directory) Sandbox(ctx context.Context, id string) (SandboxRecord, bool, error) {
	return d.record(ctx, d.keys.sandbox(id), "sandbox "+id)
}

// Snapshot returns the record of snapshot id, read from etcd; false when
// no node records it.
func (d *Directory) Snapshot(ctx context.Context, id string) (SnapshotRecord, bool, error) {
	return d.record(ctx, d.keys.snapshot(id), "snapshot "+id)
}

// record reads the record at key, of what ("sandbox sb-1").
func (d *Directory) record(ctx context.Context, key, what string) (SandboxRecord, bool, error) {
	kv, err := getKey(ctx, d.store, key)
	if err != nil {
		return SandboxRecord{}, false, storeError("read the record of "+what, err)
	}
	if kv == nil {
		return SandboxRecord{}, false, nil
	}
	var rec SandboxRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return SandboxRecord{}, false, fmt.Errorf("cluster: the record of %s does not parse: %w", what, err)
	}
	return rec, true, nil
}

// Sandboxes reads every sandbox record from etcd, by sandbox id; records
// that do not parse are left out.
func (d *Directory) Sandboxes(ctx context.Context) (map[string]SandboxRecord, error) {
	return d.records(ctx, d.keys.sandboxes(), "sandbox")
}

// Snapshots reads every snapshot record from etcd, by snapshot id;
// records that do not parse are left out.
func (d *Directory) Snapshots(ctx context.Context) (map[string]SnapshotRecord, error) {
	return d.records(ctx, d.keys.snapshots(), "snapshot")
}

// records reads the records under prefix, of what ("sandbox"), by id.
func (d *Directory) records(ctx context.Context, prefix, what string) (map[string]SandboxRecord, error) {
	_, found, err := d.store.Read(ctx, prefixRange(prefix))
	if err != nil {
		return nil, storeError("read the "+what+" records", err)
	}
	out := make(map[string]SandboxRecord, len(found[0]))
	for _, kv := range found[0] {
		var rec SandboxRecord
		if json.Unmarshal(kv.Value, &rec) == nil {
			out[d.keys.idOf(prefix, kv.Key)] = rec
		}
	}
	return out, nil
}

// NodeSelectorPrefix starts the sandbox labels that constrain placement:
// a sandbox labelled "node.berth.dev/zone=a" is placed only on a node
// labelled zone=a; "node.berth.dev/id=n2" names the node itself.
const NodeSelectorPrefix = "node.berth.dev/"

// placementRequest is what placement needs of a CreateSandbox.
type placementRequest struct {
	image    string
	memBytes uint64
	selector map[string]string // node label -> value
}

func selectorOf(labels map[string]string) map[string]string {
	var sel map[string]string
	for k, v := range labels {
		if key, ok := strings.CutPrefix(k, NodeSelectorPrefix); ok {
			if sel == nil {
				sel = make(map[string]string)
			}
			sel[key] = v
		}
	}
	return sel
}

// matches reports whether node n has every label sel asks for ("id" is
// the node's id unless the node has a label of that name).
func (n NodeRecord) matches(sel map[string]string) bool {
	for k, v := range sel {
		have, ok := n.Labels[k]
		if !ok && k == "id" {
			have, ok = n.ID, true
		}
		if !ok || have != v {
			return false
		}
	}
	return true
}

func (n NodeRecord) hasImage(image string) bool {
	for _, im := range n.Images {
		if im == image {
			return true
		}
	}
	return false
}

// load returns the share of node n's binding budget that would be in use
// with one more sandbox of memBytes: the largest of sandboxes/max and
// memory/budget over the capped ones (0 when n has no cap), and whether it
// fits at all.
func (n NodeRecord) load(memBytes uint64) (share float64, fits bool) {
	fits = true
	if n.MaxSandboxes > 0 {
		share = float64(n.Sandboxes+1) / float64(n.MaxSandboxes)
		fits = n.Sandboxes+1 <= n.MaxSandboxes
	}
	if n.MemoryBudget > 0 {
		share = max(share, float64(n.MemoryBytes+memBytes)/float64(n.MemoryBudget))
		fits = fits && n.MemoryBytes+memBytes <= n.MemoryBudget
	}
	return share, fits
}

// placement is the outcome of place: the nodes to try in order, and what
// kept the others out.
type placement struct {
	candidates []NodeRecord
	nodes      int // nodes holding a lease
	matching   int // of those, matching the selector
	withImage  int // of those, holding the image
	// full are the matching nodes with the image that had no room (or
	// drain), and memoryBound says whether memory was what they lacked.
	full        []NodeRecord
	memoryBound bool
}

// place orders the nodes that can take the sandbox req describes: live,
// not draining, matching its node selector, holding its image, with room
// for one more sandbox and its memory; healthy ones first (an unhealthy
// node, see Health, is a last resort: its record may be a moment behind
// its recovery), then the least loaded by its binding budget (see load),
// then the one with fewer sandboxes, then by id.
func place(nodes []NodeRecord, req placementRequest) placement {
	pl := placement{nodes: len(nodes), memoryBound: true}
	type scored struct {
		n     NodeRecord
		share float64
	}
	var ok []scored
	for _, n := range nodes {
		if !n.matches(req.selector) {
			continue
		}
		pl.matching++
		if !n.hasImage(req.image) {
			continue
		}
		pl.withImage++
		share, fits := n.load(req.memBytes)
		if n.Draining || !fits {
			pl.full = append(pl.full, n)
			if n.Draining || n.MaxSandboxes > 0 && n.Sandboxes+1 > n.MaxSandboxes {
				pl.memoryBound = false
			}
			continue
		}
		ok = append(ok, scored{n, share})
	}
	sort.SliceStable(ok, func(i, j int) bool {
		a, b := ok[i], ok[j]
		if ah, bh := a.n.Health.Healthy(), b.n.Health.Healthy(); ah != bh {
			return ah
		}
		if a.share != b.share {
			return a.share < b.share
		}
		if a.n.Sandboxes != b.n.Sandboxes {
			return a.n.Sandboxes < b.n.Sandboxes
		}
		return a.n.ID < b.n.ID
	})
	for _, s := range ok {
		pl.candidates = append(pl.candidates, s.n)
	}
	return pl
}
