// Package lifecycle creates, restarts, reaps and removes sandboxes: the
// Manager runs a sandbox's creation (a warm-pool member when one fits),
// restarts a task that died without berthd asking, removes sandboxes that
// idled or lived past their limits (Reaper), keeps the warm pool full
// (Pool), re-adopts what containerd holds at start and removes what no
// sandbox owns. Every create, delete and restart of one sandbox id runs
// under that id's lock (keylock.Locks), one after another.
//
// Anything that stops a sandbox's task on purpose must hold its restarts
// (restarter.hold, as deleteLocked does through deletingSandbox), or the
// Manager starts a new task for it. Events are matched to a task by its
// identity (pid and start time), never by the sandbox id alone.
package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/berth-sandbox/berth/internal/keylock"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
	"go.opentelemetry.io/otel"
)

var tracer = otel.Tracer("github.com/berth-sandbox/berth/server/lifecycle")

// Config configures a Manager; the Config of package server documents each field and
// its default (package server fills them in).
type Config struct {
	AgentReadyTimeout time.Duration
	ConnectBudget     time.Duration
	TaskRestartLimit  int
	TaskRestartWindow time.Duration
	Reaper            ReaperConfig
	WarmPool          map[string]int
	// ForkStandby is how many fork standby members to keep per parent
	// after its fork (standby.go); zero: none. ForkStandbyIdle is how long
	// after its last fork they are kept (zero: the Pool's default).
	ForkStandby      int
	ForkStandbyIdle  time.Duration
	MaxAgentLogBytes int64
	AgentLogCheck    time.Duration
	// MaxSnapshotsPerPrincipal caps how many stored snapshots one
	// principal may hold (RESOURCE_EXHAUSTED SNAPSHOT_LIMIT); zero: no
	// cap. Snapshots keep disk that no sandbox quota counts.
	MaxSnapshotsPerPrincipal int
	// Defaults is the spec of a request that sets nothing: the limits,
	// idle timeout and maximum lifetime warm-pool members are made with,
	// and that a recorded sandbox without them gets.
	Defaults runtime.SandboxSpec
	// Network, Placements: see the Config of package server; nil when absent.
	Network            Network
	NetworkUnavailable string
	Placements         Placements
	Observer           Observer
}

// Network is what the Manager needs of sandbox networking: attach a
// sandbox's network before its container starts, detach it when the
// sandbox goes, and at start re-adopt the sandboxes alive and clean the
// rest (*network.Manager).
type Network interface {
	Start(ctx context.Context, live map[string]bool) error
	Attach(ctx context.Context, id string, p network.Policy) (network.Attachment, error)
	Detach(ctx context.Context, id string) error
	Addr(id string) (netip.Addr, bool)
	Subnet() netip.Prefix
	Close()
}

// store is what the Manager does in containerd (*runtime.Runtime): the
// sandboxes' records, containers and tasks, their host directories and
// agent logs, and containerd's task events.
type store interface {
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
	List(ctx context.Context, selector map[string]string) ([]runtime.Sandbox, error)
	Create(ctx context.Context, spec runtime.SandboxSpec) error
	Claim(ctx context.Context, id string, spec runtime.SandboxSpec) error
	Delete(ctx context.Context, id string) error
	RestartTask(ctx context.Context, id string, exited uint32) (uint32, error)
	Woken(ctx context.Context, id string) error
	WaitExit(ctx context.Context, id string) (<-chan containerd.ExitStatus, error)
	MarkExpired(ctx context.Context, id, reason string) error
	SetHoldUntil(ctx context.Context, id string, until time.Time) error
	Promised(ctx context.Context) (map[string]runtime.Promise, error)
	ListImages(ctx context.Context) ([]runtime.Image, error)
	TaskEvents(ctx context.Context) (<-chan runtime.TaskEvent, <-chan error)
	HostDirs() ([]string, error)
	RemoveHostDir(id string) error
	ReclaimForkMemory(id string) (int, error)
	SocketPath(id string) string
	LogTail(id string, max int64) []byte
	TrimLog(id string, max int64) (bool, error)
	CreateWorkLimit() time.Duration
	Ping(ctx context.Context) error
	PoolSpace() (runtime.PoolSpace, bool, error)
}

// Observer is told of creations and task restarts (server/metrics).
type Observer interface {
	SandboxCreated(fromPool bool, took time.Duration)
	AgentRestarted()
}

// Manager runs sandboxes' lifecycles; see the package doc.
type Manager struct {
	cfg      Config
	rt       store
	agents   *agentconn.Pool
	reach    *agentreach.Reacher
	ids      *runtimes.Registry
	events   *runtimes.TaskEvents
	capacity *admit.Capacity
	restarts *restarter
	reaper   *Reaper
	pool     *Pool
	log      *slog.Logger
	obs      Observer
	// snapMu guards snapLocks: one lock a principal, held from the count
	// of its snapshots through the new one's creation, so that its
	// concurrent creates cannot pass the cap while other principals'
	// snapshots go on.
	snapMu    sync.Mutex
	snapLocks map[string]*sync.Mutex

	// lifecycle serializes what creates, removes or restarts a sandbox,
	// per sandbox id: a create and a delete of one id never interleave,
	// so neither sees the other's half-made or half-removed sandbox.
	lifecycle keylock.Locks

	mu       sync.Mutex
	creating map[string]*creation // creations in progress, by sandbox id

	// health is whether the node can create sandboxes (a fleet places
	// them elsewhere while it cannot).
	health *health

	// bgCtx ends at Close; bg counts the goroutines that use it.
	bgCtx  context.Context
	bgStop context.CancelFunc
	bg     sync.WaitGroup
}

// New returns a Manager of rt's sandboxes that reaches their agents through
// reach and agents, records runtimes in ids and admits creations through
// capacity. It follows events (containerd's task events, restarting tasks
// that die) in the background from now until Close.
func New(cfg Config, rt store, agents *agentconn.Pool, reach *agentreach.Reacher, ids *runtimes.Registry,
	events *runtimes.TaskEvents, capacity *admit.Capacity, log *slog.Logger) *Manager {
	m := &Manager{cfg: cfg, rt: rt, agents: agents, reach: reach, ids: ids, events: events, capacity: capacity,
		log: log, obs: cfg.Observer, creating: make(map[string]*creation)}
	m.bgCtx, m.bgStop = context.WithCancel(context.Background())
	m.health = &health{onChange: m.healthChanged}
	m.reaper = NewReaper(cfg.Reaper, prober{m}, stopper{m}, log)
	m.pool = NewPool(PoolConfig{Sizes: cfg.WarmPool, Standby: cfg.ForkStandby, StandbyIdle: cfg.ForkStandbyIdle}, maker{m}, log)
	m.restarts = newRestarter(m)
	events.OnGone = func(ev runtime.TaskEvent) { ids.TaskGone(ev.SandboxID, ev.Pid) }
	events.OnExit = m.restarts.onExit
	reach.OnPause = m.reaper.SetPaused
	reach.Waker = m.wake
	m.bg.Add(2)
	go func() {
		defer m.bg.Done()
		events.Run(m.bgCtx)
	}()
	go func() {
		defer m.bg.Done()
		// Journals of sandboxes deleted while berthd was down.
		if live, err := rt.Promised(m.bgCtx); err == nil {
			ids.PruneJournals(func(id string) bool { _, ok := live[id]; return ok })
		}
	}()
	return m
}

// Start re-adopts the sandboxes containerd holds (see Adopt), starts the
// network, then the node's health checks, the idle/lifetime reaper, the
// warm-pool refill and the agent-log bound in the background until Close.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.Adopt(ctx); err != nil {
		return err
	}
	if err := m.startNetwork(ctx); err != nil {
		return err
	}
	m.bg.Add(4)
	go func() { defer m.bg.Done(); m.checkHealth(m.bgCtx) }()
	go func() { defer m.bg.Done(); m.reaper.Run(m.bgCtx) }()
	go func() { defer m.bg.Done(); m.pool.Run(m.bgCtx) }()
	go func() { defer m.bg.Done(); m.trimAgentLogs(m.bgCtx) }()
	return nil
}

// Close stops the background work and waits for it: creations in progress
// are canceled and cleaned up. Sandboxes, warm-pool members included, keep
// running for the next berthd to adopt.
func (m *Manager) Close() {
	m.bgStop()
	m.bg.Wait()
	if m.cfg.Network != nil {
		m.cfg.Network.Close()
	}
}

// Context returns the Manager's background context, which ends at Close,
// and registers one more goroutine that Close waits for: call done when
// it returns.
func (m *Manager) Context() (ctx context.Context, done func()) {
	m.bg.Add(1)
	return m.bgCtx, m.bg.Done
}

// startNetwork starts the sandbox network with the sandboxes containerd
// holds now (after Adopt removed the dead ones): theirs is re-adopted, the
// rest removed. A network that cannot start leaves berthd serving without
// EGRESS (NETWORK_UNAVAILABLE, with the cause).
func (m *Manager) startNetwork(ctx context.Context) error {
	if m.cfg.Network == nil {
		return nil
	}
	sbs, err := m.rt.List(ctx, nil)
	if err != nil {
		return fmt.Errorf("start the network: %w", err)
	}
	live := make(map[string]bool, len(sbs))
	for _, sb := range sbs {
		live[sb.ID] = true
	}
	if err := m.cfg.Network.Start(ctx, live); err != nil {
		m.log.Error("the sandbox network did not start: EGRESS sandboxes are refused", slog.Any("error", err))
		m.cfg.Network.Close()
		m.cfg.NetworkUnavailable = err.Error()
		m.cfg.Network = nil
	}
	return nil
}

// Network returns the sandbox network, or nil and why there is none (set
// at Start; stable while serving).
func (m *Manager) Network() (Network, string) { return m.cfg.Network, m.cfg.NetworkUnavailable }

// WarmPoolReady returns the number of warm-pool sandboxes ready for image.
func (m *Manager) WarmPoolReady(image string) int { return m.pool.Ready(image) }

// ForkStandbyReady returns the number of fork standby members ready for
// sandbox parent (standby.go).
func (m *Manager) ForkStandbyReady(parent string) int { return m.pool.Ready(standbyKey(parent)) }

// Status returns the reaper's view of a sandbox: its last activity, idle
// deadline and whether it is being stopped; false when it is not tracked.
func (m *Manager) Status(id string) (Status, bool) { return m.reaper.Status(id) }

// Starting reports whether a creation of sandbox id is in progress.
func (m *Manager) Starting(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.creating[id]
	return ok
}

// Touch records activity in sandbox id now.
func (m *Manager) Touch(id string) { m.reaper.Touch(id) }

// Hold holds off sandbox id's idle timeout until until, recording it in
// the sandbox's labels first so that a restarted berthd keeps it.
func (m *Manager) Hold(ctx context.Context, id string, until time.Time) error {
	if err := m.rt.SetHoldUntil(ctx, id, until); err != nil {
		return err
	}
	m.reaper.Hold(id, until)
	return nil
}
