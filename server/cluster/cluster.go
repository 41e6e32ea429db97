// Package cluster makes berthd processes on many hosts one fleet behind one
// API, on etcd: membership, placement and routing.
//
// Every node (a berthd next to its host's containerd) registers under a
// lease (Member): its id, the address other nodes reach it at, its labels
// and its capacity in use and limits, refreshed while it lives. A node that
// lost its lease takes no new sandboxes until it registered again.
//
// Which node holds a sandbox is recorded in etcd, one key per sandbox id,
// written by the node itself in a transaction that creates the key only if
// it is absent (CreateRevision == 0), only while the node holds its lease
// and only while it is not draining (Member.Claim). So a sandbox id has
// exactly one holder at a time, across all entry points; records outlive
// leases, so a lost node's sandboxes stay its own until it is back (and
// re-adopts them, or releases those that expired meanwhile).
//
// Any berthd — a node, or a gateway without containerd — accepts every
// RPC (Router): CreateSandbox goes to the holder of the id when the id is
// recorded, else to a node with room that holds the image (least loaded by
// the budget that binds, see place); every other call naming a sandbox goes
// to its holder, unary or streaming, with the caller's principal in
// auth.ForwardedHeader over the nodes' own authenticated connections
// (Peers). ListSandboxes asks every live node. A call for a sandbox whose
// node lost its lease is UNAVAILABLE SANDBOX_UNREACHABLE with cause
// UNREACHABLE_CAUSE_NODE_LOST.
//
// When etcd does not answer, every call that needs it waits at most the
// etcd budget and fails UNAVAILABLE CLUSTER_UNAVAILABLE with a RetryInfo;
// a node serves the sandboxes it holds without it, starts without it, and
// joins (or keeps its lease, when etcd still has it) once it answers.
//
// The fleet reaches its store through Store (fleetstore.go; etcd:
// EtcdStore; docs/fleet-store.md lists what each call relies on). Keys,
// under Config.Prefix (default "/berth/"):
//
//	nodes/<id>      NodeRecord (JSON), under the node's lease
//	seen/<id>       seenRecord (JSON): the node's address, kept after its lease
//	drain/<id>      present while the node drains (NodeService.DrainNode)
//	sandboxes/<id>  SandboxRecord (JSON): the holder and owner of a sandbox
//	tombstones/<node>/<id>  tombstoneRecord (JSON): sandbox id's record was
//	                removed by a delete while node was lost; node deletes
//	                the sandbox when it registers again
package cluster

import (
	"fmt"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/sandboxid"
)

// DefaultEtcdBudget is how long a call waits for etcd unless configured
// otherwise (berthd --etcd-budget): past it a routed call, a create, a
// claim or a NodeService call fails CLUSTER_UNAVAILABLE with RetryInfo.
// It keeps such answers under 2 s (issue 22: a fleet whose etcd is away
// answers within 2 s, whatever the caller's deadline); etcd answers a
// healthy cluster's reads in milliseconds.
const DefaultEtcdBudget = 1500 * time.Millisecond

// Config configures a node's membership. Zero fields take the defaults
// given.
type Config struct {
	// NodeID names the node in the fleet: 1 to 63 characters from
	// [a-z0-9-]. Required.
	NodeID string
	// Address is the host:port at which the other nodes and gateways reach
	// this node's gRPC server. Required.
	Address string
	// Labels are the node's labels; sandboxes' placement constraints
	// (labels "node.berth.dev/KEY") match them.
	Labels map[string]string
	// Prefix starts every key the fleet keeps in etcd, so that several
	// fleets may share one etcd. Default "/berth/".
	Prefix string
	// LeaseTTL is how long the node's lease lasts without a refresh: a
	// node that stops is lost this long after its last refresh at the
	// latest. At least 2 s; default 10 s.
	LeaseTTL time.Duration
	// PublishInterval is how often the node publishes its capacity in use
	// (creations and deletions publish at once). Default 2 s.
	PublishInterval time.Duration
	// Version is berthd's version, published with the node.
	Version string
	// StateDir is the node's state directory (berthd's --state-dir),
	// recorded in its registration's Holder.
	StateDir string
	// Holder says which process registers the node; the zero value is
	// this process (ThisHolder(StateDir)).
	Holder Holder
	// EtcdBudget bounds how long a claim, a release or a publication
	// waits for etcd, and how long Start waits for it before the node
	// serves without it; past it a claim fails UNAVAILABLE
	// CLUSTER_UNAVAILABLE with a RetryInfo. Default DefaultEtcdBudget.
	EtcdBudget time.Duration
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.PublishInterval == 0 {
		c.PublishInterval = 2 * time.Second
	}
	if c.EtcdBudget <= 0 {
		c.EtcdBudget = DefaultEtcdBudget
	}
	if c.Holder == (Holder{}) {
		c.Holder = ThisHolder(c.StateDir)
	}
}

// Validate checks the node id, the address, the prefix and the lease time.
func (c Config) Validate() error {
	if !sandboxid.Valid(c.NodeID) {
		return fmt.Errorf("node id %q must be 1 to 63 characters from [a-z0-9-] starting with a letter or digit", c.NodeID)
	}
	if c.Address == "" {
		return fmt.Errorf("node %s needs the address at which other nodes reach it", c.NodeID)
	}
	if err := validPrefix(c.Prefix); err != nil {
		return err
	}
	if c.LeaseTTL != 0 && c.LeaseTTL < 2*time.Second {
		return fmt.Errorf("lease time %v is below the minimum of 2s", c.LeaseTTL)
	}
	return nil
}

// DefaultPrefix starts the fleet's keys in etcd.
const DefaultPrefix = "/berth/"

func validPrefix(p string) error {
	if p != "" && (!strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/")) {
		return fmt.Errorf("key prefix %q must start and end with /", p)
	}
	return nil
}

// keys names the fleet's keys in etcd.
type keys struct{ prefix string }

func (k keys) nodes() string                    { return k.prefix + "nodes/" }
func (k keys) node(id string) string            { return k.nodes() + id }
func (k keys) seenAll() string                  { return k.prefix + "seen/" }
func (k keys) seen(id string) string            { return k.seenAll() + id }
func (k keys) drains() string                   { return k.prefix + "drain/" }
func (k keys) drain(id string) string           { return k.drains() + id }
func (k keys) sandboxes() string                { return k.prefix + "sandboxes/" }
func (k keys) sandbox(id string) string         { return k.sandboxes() + id }
func (k keys) tombstones(node string) string    { return k.prefix + "tombstones/" + node + "/" }
func (k keys) tombstone(node, id string) string { return k.tombstones(node) + id }
func (k keys) snapshots() string                { return k.prefix + "snapshots/" }
func (k keys) snapshot(id string) string        { return k.snapshots() + id }
func (k keys) idOf(prefix, key string) string   { return strings.TrimPrefix(key, prefix) }

// NodeRecord is what a node publishes about itself under its lease.
type NodeRecord struct {
	ID      string            `json:"id"`
	Address string            `json:"address"`
	Labels  map[string]string `json:"labels,omitempty"`
	Version string            `json:"version"`
	// StartedAt is when the node registered with its current lease;
	// UpdatedAt when it last published.
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Usage
	// Images are the image references in the node's store.
	Images []string `json:"images,omitempty"`
	// Conflicts are the sandboxes the node runs whose ids the fleet
	// records on another node (Member.Conflicts), ordered.
	Conflicts []string `json:"conflicts,omitempty"`
	// Holder is the berthd process that registered the node; empty in
	// records of berthds before it was recorded.
	Holder Holder `json:"holder"`
	// Health is the node's own account of whether it can create
	// sandboxes; the zero value (records of berthds before it) is healthy.
	Health Health `json:"health"`

	// Lease is the lease the record lives under (from the store, not
	// stored).
	Lease LeaseID `json:"-"`
	// Draining is set from the node's drain key (not stored).
	Draining bool `json:"-"`
}

// Usage is a node's capacity in use and its limits; a zero limit is no
// cap.
type Usage struct {
	Sandboxes    uint64 `json:"sandboxes"`
	MaxSandboxes uint64 `json:"max_sandboxes,omitempty"`
	// MemoryBytes is the memory promised to the node's sandboxes (the sum
	// of their memory caps), MemoryBudget the node's budget, in bytes.
	MemoryBytes  uint64 `json:"memory_bytes"`
	MemoryBudget uint64 `json:"memory_budget_bytes,omitempty"`
	Execs        uint64 `json:"execs"`
	MaxExecs     uint64 `json:"max_execs,omitempty"`
}

// Health is a node's own account of whether it can create sandboxes
// (Local.Health): placement tries an unhealthy node only after every
// healthy one.
type Health struct {
	// Reason is empty while the node is healthy, else why it is not:
	// HealthContainerd, HealthNoSpace or HealthAgentLaunch.
	Reason string `json:"reason,omitempty"`
	// Message says what the node saw, for people.
	Message string `json:"message,omitempty"`
	// Since is when Reason last changed; zero for a node that was never
	// unhealthy.
	Since time.Time `json:"since,omitzero"`
}

// Healthy reports whether h names no fault.
func (h Health) Healthy() bool { return h.Reason == "" }

// The reasons of an unhealthy node (Health.Reason).
const (
	// HealthContainerd: the node's containerd does not answer.
	HealthContainerd = "CONTAINERD_UNAVAILABLE"
	// HealthNoSpace: the file system that holds the node's sandboxes is
	// full.
	HealthNoSpace = "NO_SPACE"
	// HealthAgentLaunch: the agents of the node's last creates did not
	// start.
	HealthAgentLaunch = "AGENT_LAUNCH_FAILING"
)

// seenRecord is what the fleet keeps of a node after its lease ends.
type seenRecord struct {
	Address   string    `json:"address"`
	FirstSeen time.Time `json:"first_seen"`
}

// SandboxRecord says which node holds a sandbox.
type SandboxRecord struct {
	// Node is the id of the node that holds the sandbox.
	Node string `json:"node"`
	// Owner is the principal that created it: a routing node answers for a
	// lost node's sandboxes only to those who may see them.
	Owner     string    `json:"owner"`
	CreatedAt time.Time `json:"created_at"`
}
