// Package server is berthd as a library: its composition root. New builds
// the engines — runtimes (each sandbox's runtimes, the exec-id journal,
// containerd's task events), agentreach (reaching an agent within the
// connect budget), admit (capacity), lifecycle (create, restart, reap, warm
// pool) — over the containerd runtime, and the services over them:
// sandboxsvc and execsvc (berth.v1.SandboxService), filesvc, imagesvc.
// NewGRPCServer registers them behind the interceptors: authentication,
// fleet routing, request activity, and the one error boundary
// (server/status) where handlers' plain errors become statuses.
// docs/architecture.md draws the layers; layout_test.go checks them.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/contextsvc"
	"github.com/berth-sandbox/berth/server/execsvc"
	"github.com/berth-sandbox/berth/server/filesvc"
	"github.com/berth-sandbox/berth/server/imagesvc"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"github.com/berth-sandbox/berth/server/runout"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
	"github.com/berth-sandbox/berth/server/sandboxsvc"
	"github.com/berth-sandbox/berth/server/sessionsvc"
	"github.com/berth-sandbox/berth/server/volumesvc"
	"github.com/berth-sandbox/berth/server/watchsvc"
)

// to the package that owns it (services.go).
type Service struct {
	berthv1.UnimplementedSandboxServiceServer

	cfg    Config
	rt     *runtime.Runtime
	agents *agentconn.Pool
	reach  *agentreach.Reacher
	log    *slog.Logger
	obs    Observer

	// Runtime conditions: task events, runtime registry, capacity.
	events   *runtimes.TaskEvents
	ids      *runtimes.Registry
	capacity *admit.Capacity
	life     *lifecycle.Manager
	// sandboxes and execs serve the RPCs of SandboxService.
	sandboxes *sandboxsvc.Service
	execs     *execsvc.Service
	sessions  *sessionsvc.Service
	volumes   *volumesvc.Service
	contexts  *contextsvc.Service
	watches   *watchsvc.Service
	// files and images serve FileService and ImageService.
	files  *filesvc.Service
	images *imagesvc.Service
	// runBuffers bounds the memory of Runs' collected output.
	runBuffers *runout.Budget
}

var _ berthv1.SandboxServiceServer = (*Service)(nil)

// New returns a Service that keeps sandboxes in rt. log receives errors that
// are reported to callers as INTERNAL. Call Start before serving so that
// existing sandboxes are re-adopted and idle timeouts and the warm pool
// work.
//
// New starts following containerd's task events in the background (see
// lifecycle.New); Close stops it.
func New(cfg Config, rt *runtime.Runtime, log *slog.Logger) *Service {
	cfg.setDefaults()
	verifier := cfg.AgentVerifier
	if verifier == nil {
		verifier = rt.AgentVerifier()
	}
	if cfg.JournalDir != "" {
		if err := os.MkdirAll(cfg.JournalDir, 0o700); err != nil {
			log.Error("runtime journal unavailable; exec ids of earlier runtimes are remembered in memory only",
				slog.String("dir", cfg.JournalDir), slog.Any("error", err))
			cfg.JournalDir = ""
		}
	}
	s := &Service{cfg: cfg, rt: rt, log: log, obs: cfg.Observer, runBuffers: runout.NewBudget(cfg.RunBufferBytes, cfg.RunBufferWait, wire.StreamWindow)}
	var poolOpts []agentconn.Option
	if cfg.Tracer != nil {
		poolOpts = append(poolOpts, agentconn.WithDialOptions(grpc.WithStatsHandler(telemetry.ClientHandler())), agentconn.WithOnConnect(s.relaySpans))
	}
	s.agents = agentconn.NewPool(verifier, poolOpts...)
	s.ids = runtimes.NewRegistry(cfg.JournalDir, log)
	s.events = runtimes.NewTaskEvents(rt, log)
	s.reach = agentreach.New(agentreach.Config{ConnectBudget: cfg.ConnectBudget, BusyLimit: cfg.AgentBusyLimit, ServerVersion: Version},
		rt, s.ids, s.agents, log)
	budget, budgetNow := diskBudget(cfg.DiskOvercommit, cfg.DefaultDiskBytes, rt, log)
	s.capacity = admit.New(admit.Limits{DiskBudget: budget, DiskBudgetNow: budgetNow, MaxSandboxes: cfg.MaxSandboxes, MaxExecsPerSandbox: cfg.MaxExecsPerSandbox, MaxExecs: cfg.MaxExecs,
		MemoryBudget: cfg.MemoryBudgetBytes, RetryDelay: cfg.BusyRetryDelay,
		PerPrincipal: admit.PrincipalLimits{MaxSandboxes: cfg.MaxSandboxesPerPrincipal, MemoryBytes: cfg.MaxMemoryBytesPerPrincipal,
			DiskBytes: cfg.MaxDiskBytesPerPrincipal}}, cfg.Observer, held(rt))
	defaults := runtime.SandboxSpec{PidsLimit: cfg.DefaultPidsLimit, OpenFiles: cfg.DefaultOpenFiles, DiskBytes: cfg.DefaultDiskBytes,
		IdleTimeout: cfg.DefaultIdleTimeout, MaxLifetime: cfg.DefaultMaxLifetime}
	if cfg.DefaultCPUMillis > 0 {
		defaults.CPUMillis = uint64(cfg.DefaultCPUMillis)
	}
	if cfg.DefaultMemoryBytes > 0 {
		defaults.MemoryBytes = uint64(cfg.DefaultMemoryBytes)
	}
	s.life = lifecycle.New(lifecycle.Config{AgentReadyTimeout: cfg.AgentReadyTimeout, ConnectBudget: cfg.ConnectBudget,
		TaskRestartLimit: cfg.TaskRestartLimit, TaskRestartWindow: cfg.TaskRestartWindow, Reaper: cfg.Reaper, WarmPool: cfg.WarmPool,
		ForkStandby: cfg.ForkStandby, ForkStandbyIdle: cfg.ForkStandbyIdle,
		MaxAgentLogBytes: cfg.MaxAgentLogBytes, AgentLogCheck: cfg.AgentLogCheck, MaxSnapshotsPerPrincipal: cfg.MaxSnapshotsPerPrincipal, Defaults: defaults,
		Network: cfg.Network, NetworkUnavailable: cfg.NetworkUnavailable, Placements: cfg.Placements, Observer: cfg.Observer},
		rt, s.agents, s.reach, s.ids, s.events, s.capacity, log)
	s.sandboxes = sandboxsvc.New(sandboxsvc.Config{DefaultPidsLimit: cfg.DefaultPidsLimit, MaxPidsLimit: cfg.MaxPidsLimit, MaxCPUMillis: cfg.MaxCPUMillis,
		MaxMemoryBytes: cfg.MaxMemoryBytes, DefaultCPUMillis: cfg.DefaultCPUMillis, DefaultMemoryBytes: cfg.DefaultMemoryBytes,
		DefaultOpenFiles: cfg.DefaultOpenFiles, MaxOpenFiles: cfg.MaxOpenFiles, MaxSandboxOpenFiles: cfg.MaxSandboxOpenFiles,
		AllowHostUsers: cfg.AllowHostUsers, DefaultDiskBytes: cfg.DefaultDiskBytes, MaxDiskBytes: cfg.MaxDiskBytes,
		DefaultIdleTimeout: cfg.DefaultIdleTimeout, MaxIdleTimeout: cfg.MaxIdleTimeout, DefaultMaxLifetime: cfg.DefaultMaxLifetime,
		MaxLifetime: cfg.MaxLifetime, NodeID: cfg.NodeID, ServerVersion: Version}, rt, s.life, s.reach, log)
	s.execs = execsvc.New(execsvc.Config{ConnectBudget: cfg.ConnectBudget, BusyRetryDelay: cfg.BusyRetryDelay,
		RunStdoutBytes: cfg.RunStdoutBytes, RunStderrBytes: cfg.RunStderrBytes, RunMaxOutputBytes: cfg.RunMaxOutputBytes},
		execsvc.Deps{Store: rt, Reach: s.reach, Events: s.events, Registry: s.ids, Capacity: s.capacity, RunBuffers: s.runBuffers,
			Background: s.life, Observer: cfg.Observer, Ports: rt}, log)
	s.sessions = sessionsvc.New(s.reach)
	s.contexts = contextsvc.New(s.reach)
	s.watches = watchsvc.New(s.reach)
	s.volumes = volumesvc.New(volumesvc.Config{DefaultQuotaBytes: cfg.DefaultDiskBytes, MaxQuotaBytes: cfg.MaxDiskBytes}, rt, s.life)
	s.files = filesvc.New(s.reach, s.reach, cfg.Observer, filesvc.WithDirectReads(rt, log))
	s.images = imagesvc.New(imagesvc.Config{PullRegistries: cfg.PullRegistries, PullResolveTimeout: cfg.PullResolveTimeout}, rt, s.life, log)
	return s
}

// Start re-adopts the sandboxes containerd holds (see lifecycle.Adopt),
// then starts the idle/lifetime reaper and the warm-pool refill in the
// background until Close. It fails without doing anything when Config asks
// for disk quotas that the runtime cannot set.
func (s *Service) Start(ctx context.Context) error {
	if err := s.rt.DiskQuota(); err != nil && (s.cfg.DefaultDiskBytes > 0 || s.cfg.MaxDiskBytes > 0) {
		return fmt.Errorf("a default or maximum disk quota is configured, but: %w", err)
	}
	if n := s.rt.OrphanLeases(); n > 0 {
		s.log.Info("dropped the containerd leases of berthds that no longer run; what they held for work cut off goes at containerd's next garbage collection", slog.Int("leases", n))
	}
	return s.life.Start(ctx)
}

// Close stops the background work, waits for it (creations in progress are
// canceled and cleaned up) and closes the agent connections. Sandboxes,
// warm-pool members included, and their execs keep running for the next
// berthd to adopt.
func (s *Service) Close() {
	s.life.Close()
	s.agents.Close()
}

// WarmPoolReady returns the number of warm-pool sandboxes ready for image.
func (s *Service) WarmPoolReady(image string) int { return s.life.WarmPoolReady(image) }

// ForkStandbyReady returns the number of fork standby members ready for
// sandbox parent (Config.ForkStandby).
func (s *Service) ForkStandbyReady(parent string) int { return s.life.ForkStandbyReady(parent) }

// ClusterLocal returns the node's side of its fleet membership
// (cluster.Local): its usage, images and sandboxes.
func (s *Service) ClusterLocal() cluster.Local { return s.life.ClusterLocal() }

// diskBudget is the disk admission may promise to sandboxes, in bytes: the
// size of rt's btrfs pool times overcommit (Config.DiskOvercommit),
// saturating at the largest uint64, as read at start, and a function that
// reads it again (statfs(2) of the pool, admit.Limits.DiskBudgetNow) for
// each admission: a pool grown or shrunk while berthd runs counts as it
// is. Zero and nil (no budget) without disk quotas or with a negative
// overcommit. A budget that holds fewer than fewDefaultQuotas sandboxes of
// the default quota is logged at WARN.
func diskBudget(overcommit float64, defaultQuota uint64, rt *runtime.Runtime, log *slog.Logger) (uint64, func() (uint64, error)) {
	if overcommit < 0 || rt.DiskQuota() != nil {
		return 0, nil
	}
	now := func() (uint64, error) {
		_, size, err := rt.DiskPool()
		if err != nil {
			return 0, err
		}
		return scaledBudget(size, overcommit), nil
	}
	root, size, err := rt.DiskPool()
	if err != nil {
		// The quotas hold; only their sum goes unchecked.
		log.Error("disk budget unavailable: the sum of disk quotas is not checked", slog.Any("error", err))
		return 0, nil
	}
	budget := scaledBudget(size, overcommit)
	log.Info("disk budget", slog.String("pool", root), slog.Uint64("pool_bytes", size), slog.Float64("overcommit", overcommit),
		slog.Uint64("budget_bytes", budget))
	if defaultQuota > 0 && budget/defaultQuota < fewDefaultQuotas {
		log.Warn("the disk budget holds few sandboxes of the default disk quota: lower --default-disk-bytes or raise --disk-overcommit",
			slog.Uint64("sandboxes", budget/defaultQuota), slog.Uint64("default_disk_bytes", defaultQuota), slog.Uint64("budget_bytes", budget))
	}
	return budget, now
}

// scaledBudget is a pool of size bytes times overcommit, saturating at the
// largest uint64, at least 1 (0 would mean no budget).
func scaledBudget(size uint64, overcommit float64) uint64 {
	if b := float64(size) * overcommit; b < math.MaxUint64 {
		return max(uint64(b), 1)
	}
	return math.MaxUint64
}

// fewDefaultQuotas is how many sandboxes of the default disk quota a disk
// budget should hold before berthd warns that it holds few.
const fewDefaultQuotas = 10

// held lists what rt's sandboxes, stored snapshots, fork copies and
// volumes (their quotas) hold for admission.
func held(rt *runtime.Runtime) func(context.Context) (map[string]admit.Held, error) {
	return func(ctx context.Context) (map[string]admit.Held, error) {
		promised, err := rt.Promised(ctx)
		if err != nil {
			return nil, err
		}
		stored, err := rt.StoredDisk(ctx)
		if err != nil {
			return nil, err
		}
		volumes, err := rt.VolumeDisk()
		if err != nil {
			return nil, err
		}
		maps.Copy(stored, volumes)
		out := make(map[string]admit.Held, len(promised)+len(stored))
		for id, p := range promised {
			out[id] = admit.Held(p)
		}
		for key, p := range stored {
			out[key] = admit.Held(p)
		}
		return out, nil
	}
}
