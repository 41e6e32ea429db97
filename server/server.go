// Package server is berthd as a library: the gRPC handlers of
// berth.v1.SandboxService and berth.v1.ImageService on top of containerd
// (package runtime) and the agents inside sandboxes (package agentconn).
//
// Errors become gRPC statuses in one place, toStatus (errors.go). The four
// runtime conditions are detected for real: containerd's task events end
// exec streams whose runtime died (events.go, execguard.go) and restart
// dead tasks (restart.go), runtime identities tell stale exec ids from
// unknown ones (identity.go), every request reaches its agent within a
// connect budget (reach.go), and capacity admits new work (capacity.go).
//
// Anything in berthd that stops a sandbox's task on purpose must hold its
// restarts (restarter.hold, as deleteSandbox does through deletingSandbox),
// or berthd starts a new task for it. Creating, removing and restarting a
// sandbox hold its lifecycle lock (Service.lifecycle, per sandbox id), so
// that they happen one after another; events are matched to a task by its
// identity (pid and start time), never by the sandbox id alone.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/version"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/fleet"
	"github.com/berth-sandbox/berth/server/idlock"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runout"
	"github.com/berth-sandbox/berth/server/runtime"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

// Version is berthd's release version: internal/version's (set at build
// time, see there), unless set with -ldflags "-X
// github.com/berth-sandbox/berth/server.Version=v0.1.0".
var Version = "dev"

func init() {
	if Version == "dev" {
		Version = version.Get()
	}
}

// Config configures the handlers. Zero fields take the defaults given.
type Config struct {
	// DefaultPidsLimit is a sandbox's pids limit (processes and threads)
	// when the request gives none. Default 512.
	DefaultPidsLimit uint64
	// MaxPidsLimit bounds requested pids limits; larger requests are
	// INVALID_ARGUMENT. Default 32768.
	MaxPidsLimit uint64
	// MaxCPUMillis bounds requested CPU caps, in thousandths of a CPU.
	// Default: the host's CPU count × 1000.
	MaxCPUMillis uint64
	// MaxMemoryBytes bounds requested memory caps, in bytes; larger
	// requests are INVALID_ARGUMENT. Default: the host's physical memory
	// (sysinfo(2) totalram), which also keeps a cap far from the int64
	// the OCI spec stores it in.
	MaxMemoryBytes uint64
	// DefaultCPUMillis is a sandbox's CPU cap, in thousandths of a CPU,
	// when the request gives none. Default 1000 (one CPU); negative: no
	// cap.
	DefaultCPUMillis int64
	// DefaultMemoryBytes is a sandbox's memory cap, in bytes, when the
	// request gives none. Default 1 GiB; negative: no cap.
	DefaultMemoryBytes int64
	// DefaultOpenFiles is a sandbox's RLIMIT_NOFILE (per process) when the
	// request gives none. Default 1024, the limit containerd and Docker
	// give.
	DefaultOpenFiles uint64
	// MaxOpenFiles bounds requested RLIMIT_NOFILE values. Default 1048576
	// (the kernel's default fs.nr_open, above which setrlimit fails).
	MaxOpenFiles uint64
	// MaxSandboxOpenFiles bounds a sandbox's worst case of open files,
	// pids_limit × open_files_limit; a request beyond it is
	// INVALID_ARGUMENT. It keeps one sandbox from exhausting the host's
	// file table (fs.file-max: about 2.4 million with 24 GiB of memory).
	// Default 1048576 (2^20).
	MaxSandboxOpenFiles uint64
	// AllowHostUsers lets a request run its sandbox in the host's user
	// namespace (CreateSandboxRequest.host_users); refused by default.
	AllowHostUsers bool
	// DefaultDiskBytes is a sandbox's disk quota, in bytes, when the request
	// sets none (resources.disk_bytes). Zero: no quota. Non-zero needs a
	// runtime with disk quotas (runtime.Runtime.DiskQuota), or Start fails.
	DefaultDiskBytes uint64
	// MaxDiskBytes bounds requested disk quotas, in bytes; larger requests
	// are INVALID_ARGUMENT. Zero: no bound beyond the file system.
	MaxDiskBytes uint64
	// AgentReadyTimeout bounds how long CreateSandbox waits for the agent
	// to answer after the task starts. Default 30 s.
	AgentReadyTimeout time.Duration

	// ConnectBudget bounds how long a request waits for a sandbox's agent
	// to connect and answer, and for its first answer to an exec; past it
	// the request fails with UNAVAILABLE SANDBOX_UNREACHABLE. Default 3 s.
	ConnectBudget time.Duration
	// AgentBusyLimit bounds how long a request waits for an agent that
	// keeps working — using CPU, sending other streams' events — but has
	// not answered it yet: a busy agent is not an unreachable one. Past it
	// the request fails with SANDBOX_UNREACHABLE, cause AGENT_BUSY.
	// Default 30 s, and never below ConnectBudget.
	AgentBusyLimit time.Duration
	// MaxSandboxes caps the sandboxes the server holds, running or
	// stopped; CreateSandbox beyond it fails with RESOURCE_EXHAUSTED
	// FLEET_BUSY. Zero: no cap.
	MaxSandboxes int
	// MaxExecsPerSandbox caps the execs running at once in one sandbox;
	// a start beyond it fails with FLEET_BUSY. Zero: no cap.
	MaxExecsPerSandbox int
	// MaxExecs caps the execs running at once in all sandboxes; a start
	// beyond it fails with FLEET_BUSY. Zero: no cap.
	MaxExecs int
	// MemoryBudgetBytes caps the memory, in bytes, promised to sandboxes:
	// the sum of their resources.memory_bytes (sandboxes without a memory
	// cap count zero). A CreateSandbox beyond it fails with FLEET_BUSY.
	// Zero: no cap.
	MemoryBudgetBytes uint64
	// BusyRetryDelay is the retry delay a FLEET_BUSY error suggests
	// (google.rpc.RetryInfo). Default 1 s.
	BusyRetryDelay time.Duration
	// TaskRestartLimit is how many times within TaskRestartWindow berthd
	// starts a new task for a sandbox whose task exited without berthd
	// asking (the agent died or was killed); beyond it the sandbox stays
	// stopped. Default 5; negative: never restart.
	TaskRestartLimit int
	// TaskRestartWindow is the window of TaskRestartLimit. Default 10 min.
	TaskRestartWindow time.Duration
	// JournalDir is a directory only berthd can write where it keeps, per
	// sandbox, which runtime each exec id was started in, so that exec ids
	// of earlier runtimes are told apart from unknown ones (STALE_HANDLE,
	// not EXEC_NOT_FOUND) across berthd restarts. Empty: remember them in
	// memory only.
	JournalDir string
	// DefaultIdleTimeout is a sandbox's idle timeout when the request sets
	// none. Default 30 min.
	DefaultIdleTimeout time.Duration
	// MaxIdleTimeout bounds requested idle timeouts and KeepAlive holds;
	// larger requests are INVALID_ARGUMENT. Default 24 h.
	MaxIdleTimeout time.Duration
	// DefaultMaxLifetime is a sandbox's maximum lifetime when the request
	// sets none. Default 24 h.
	DefaultMaxLifetime time.Duration
	// MaxLifetime bounds requested maximum lifetimes; larger requests are
	// INVALID_ARGUMENT. Default 7 days.
	MaxLifetime time.Duration
	// Reaper tunes the idle and lifetime checks (interval, probe timeout).
	Reaper fleet.ReaperConfig
	// WarmPool maps image references to the number of pre-created
	// sandboxes to keep ready for them; empty disables the pool. Only
	// requests without sandbox_id and request_id, with default resources,
	// user, working directory and no env, are served from it.
	WarmPool map[string]int
	// NodeID names this berthd in its fleet (Sandbox.node_id); empty
	// outside a fleet.
	NodeID string
	// Placements records which node holds each sandbox when this berthd
	// is a node of a fleet (a *cluster.Member); nil outside a fleet.
	Placements placements
	// MaxAgentLogBytes bounds each sandbox's agent log (about 170 bytes
	// an exec): past it the newest half is kept as agent.log.1 and the log
	// starts anew. Default 4 MiB.
	MaxAgentLogBytes int64
	// AgentLogCheck is how often agent logs are measured. Default 10 s.
	AgentLogCheck time.Duration
	// PullRegistries names the registries PullImage may reach, as
	// references write them ("registry.example.com", "localhost:5000",
	// "localhost:*" for any port);
	// "*" stands for every registry not on berthd's host. Empty: "*". A
	// registry on berthd's host is reached only when named (see
	// runtime.PullOptions.Registries); others are FAILED_PRECONDITION
	// REGISTRY_NOT_ALLOWED with nothing sent.
	PullRegistries []string
	// PullResolveTimeout bounds resolving an image reference at its
	// registry in PullImage; an unreachable registry fails after it.
	// Default 10 s.
	PullResolveTimeout time.Duration
	// Observer receives counts and latencies for metrics (see
	// server/metrics). Nil: nothing is counted.
	Observer Observer
	// Tracer, when set, traces berthd's calls to agents (their traceparent
	// sent along) and relays the agents' spans to it; runtime.Config's
	// TraceAgents must be set too, so that agents trace. Nil: no tracing.
	Tracer *telemetry.Tracer

	// RunStdoutBytes and RunStderrBytes are the output caps of a Run that
	// sets none, in bytes. Defaults 2 MiB and 1 MiB: a response then fits
	// a default gRPC client's 4 MiB receive limit.
	RunStdoutBytes uint64
	RunStderrBytes uint64
	// RunMaxOutputBytes bounds a Run's two caps together, in bytes; a Run
	// asking for more is INVALID_ARGUMENT naming the cap. Default 64 MiB.
	RunMaxOutputBytes uint64
	// RunBufferBytes is what berthd may hold for all Runs in progress, in
	// bytes: each reserves its two caps before it starts, and a Run that
	// does not fit fails with FLEET_BUSY (nothing started). Default 1 GiB.
	RunBufferBytes uint64

	// Network gives sandboxes of network mode EGRESS their network
	// (package server/network); Start starts it. Nil: EGRESS is refused
	// with FAILED_PRECONDITION NETWORK_UNAVAILABLE, whose message gives
	// NetworkUnavailable as the reason.
	Network            Network
	NetworkUnavailable string

	// AgentVerifier decides whether what listens on a sandbox's agent
	// socket is its agent (agentconn.Verifier). Nil: the runtime's
	// (runtime.Runtime.AgentVerifier): the listener is the sandbox's init
	// process and proves the secret berthd gave it at create. Tests that
	// stand a hostile agent in for a verified one give their own.
	AgentVerifier agentconn.Verifier
}

// Network is what the handlers need of sandbox networking: attach a
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

func (c *Config) setDefaults() {
	if c.DefaultPidsLimit == 0 {
		c.DefaultPidsLimit = 512
	}
	if c.DefaultCPUMillis == 0 {
		c.DefaultCPUMillis = 1000
	}
	if c.DefaultMemoryBytes == 0 {
		c.DefaultMemoryBytes = 1 << 30
	}
	if c.DefaultOpenFiles == 0 {
		c.DefaultOpenFiles = 1024
	}
	if c.MaxOpenFiles == 0 {
		c.MaxOpenFiles = 1 << 20
	}
	if c.MaxSandboxOpenFiles == 0 {
		c.MaxSandboxOpenFiles = 1 << 20
	}
	if c.MaxPidsLimit == 0 {
		c.MaxPidsLimit = 32768
	}
	if c.MaxCPUMillis == 0 {
		c.MaxCPUMillis = uint64(goruntime.NumCPU()) * 1000
	}
	if c.MaxMemoryBytes == 0 {
		c.MaxMemoryBytes = hostMemoryBytes()
	}
	if c.AgentReadyTimeout == 0 {
		c.AgentReadyTimeout = 30 * time.Second
	}
	if c.ConnectBudget == 0 {
		c.ConnectBudget = 3 * time.Second
	}
	if c.AgentBusyLimit == 0 {
		c.AgentBusyLimit = 30 * time.Second
	}
	c.AgentBusyLimit = max(c.AgentBusyLimit, c.ConnectBudget)
	if c.BusyRetryDelay == 0 {
		c.BusyRetryDelay = time.Second
	}
	if c.TaskRestartLimit == 0 {
		c.TaskRestartLimit = 5
	}
	if c.TaskRestartWindow == 0 {
		c.TaskRestartWindow = 10 * time.Minute
	}
	if c.DefaultIdleTimeout == 0 {
		c.DefaultIdleTimeout = 30 * time.Minute
	}
	if c.MaxIdleTimeout == 0 {
		c.MaxIdleTimeout = 24 * time.Hour
	}
	if c.DefaultMaxLifetime == 0 {
		c.DefaultMaxLifetime = 24 * time.Hour
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = 7 * 24 * time.Hour
	}
	c.MaxIdleTimeout = max(c.MaxIdleTimeout, c.DefaultIdleTimeout)
	c.MaxLifetime = max(c.MaxLifetime, c.DefaultMaxLifetime)
	if c.Observer == nil {
		c.Observer = noObserver{}
	}
	if c.MaxAgentLogBytes <= 0 {
		c.MaxAgentLogBytes = 4 << 20
	}
	if c.AgentLogCheck <= 0 {
		c.AgentLogCheck = 10 * time.Second
	}
	if c.PullResolveTimeout == 0 {
		c.PullResolveTimeout = 10 * time.Second
	}
	if c.RunStdoutBytes == 0 {
		c.RunStdoutBytes = 2 << 20
	}
	if c.RunStderrBytes == 0 {
		c.RunStderrBytes = 1 << 20
	}
	if c.RunMaxOutputBytes == 0 {
		c.RunMaxOutputBytes = 64 << 20
	}
	c.RunMaxOutputBytes = max(c.RunMaxOutputBytes, c.RunStdoutBytes+c.RunStderrBytes)
	if c.RunBufferBytes == 0 {
		c.RunBufferBytes = 1 << 30
	}
	c.RunBufferBytes = max(c.RunBufferBytes, c.RunMaxOutputBytes)
}

// hostMemoryBytes returns the host's physical memory in bytes (sysinfo(2)),
// or 1 TiB when it cannot be read.
func hostMemoryBytes() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 1 << 40
	}
	unit := uint64(max(si.Unit, 1))
	return min(uint64(si.Totalram), math.MaxInt64/unit) * unit
}

// Service implements berth.v1.SandboxService and berth.v1.ImageService.
type Service struct {
	berthv1.UnimplementedSandboxServiceServer
	berthv1.UnimplementedImageServiceServer

	cfg    Config
	rt     *runtime.Runtime
	agents *agentconn.Pool
	log    *slog.Logger
	obs    Observer

	// Runtime conditions (errors.go): task events, runtime identities,
	// task restarts and capacity.
	events   *taskEvents
	ids      *identities
	restarts *restarter
	capacity *capacity
	reaper   *fleet.Reaper
	pool     *fleet.Pool
	// runBuffers bounds the memory of Runs' collected output.
	runBuffers *runout.Budget

	// lifecycle serializes what creates, removes or restarts a sandbox,
	// per sandbox id: a create and a delete of one id never interleave,
	// so neither sees the other's half-made or half-removed sandbox.
	lifecycle idlock.Locks

	mu       sync.Mutex
	creating map[string]*creation // CreateSandbox in progress, by sandbox id
	warned   map[string]bool      // agent boot ids warned about version skew

	// bgCtx ends at Close; bg counts the goroutines that use it.
	bgCtx  context.Context
	bgStop context.CancelFunc
	bg     sync.WaitGroup
}

var (
	_ berthv1.SandboxServiceServer = (*Service)(nil)
	_ berthv1.ImageServiceServer   = (*Service)(nil)
)

// New returns a Service that keeps sandboxes in rt. log receives errors that
// are reported to callers as INTERNAL. Call Start before serving so that
// existing sandboxes are re-adopted and idle timeouts and the warm pool
// work.
//
// New starts following containerd's task events in the background (see
// watchRuntimes); Close stops it.
func New(cfg Config, rt *runtime.Runtime, log *slog.Logger) *Service {
	cfg.setDefaults()
	verifier := cfg.AgentVerifier
	if verifier == nil {
		verifier = rt.AgentVerifier()
	}
	s := &Service{cfg: cfg, rt: rt, log: log, obs: cfg.Observer,
		creating: make(map[string]*creation), warned: make(map[string]bool),
		runBuffers: runout.NewBudget(cfg.RunBufferBytes)}
	var poolOpts []agentconn.Option
	if cfg.Tracer != nil {
		poolOpts = append(poolOpts, agentconn.WithDialOptions(grpc.WithStatsHandler(telemetry.ClientHandler())), agentconn.WithOnConnect(s.relaySpans))
	}
	s.agents = agentconn.NewPool(verifier, poolOpts...)
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	s.reaper = fleet.NewReaper(cfg.Reaper, prober{s}, stopper{s}, log)
	s.pool = fleet.NewPool(fleet.PoolConfig{Sizes: cfg.WarmPool}, maker{s}, log)
	s.watchRuntimes()
	return s
}

// Start re-adopts the sandboxes containerd holds (see Adopt), then starts
// the idle/lifetime reaper and the warm-pool refill in the background until
// Close. It fails without doing anything when Config asks for disk quotas
// that the runtime cannot set.
func (s *Service) Start(ctx context.Context) error {
	if err := s.rt.DiskQuota(); err != nil && (s.cfg.DefaultDiskBytes > 0 || s.cfg.MaxDiskBytes > 0) {
		return fmt.Errorf("a default or maximum disk quota is configured, but: %w", err)
	}
	if n := s.rt.OrphanLeases(); n > 0 {
		s.log.Info("dropped the containerd leases of berthds that no longer run; what they held for work cut off goes at containerd's next garbage collection", slog.Int("leases", n))
	}
	if err := s.Adopt(ctx); err != nil {
		return err
	}
	if err := s.startNetwork(ctx); err != nil {
		return err
	}
	s.bg.Add(3)
	go func() { defer s.bg.Done(); s.reaper.Run(s.bgCtx) }()
	go func() { defer s.bg.Done(); s.pool.Run(s.bgCtx) }()
	go func() { defer s.bg.Done(); s.trimAgentLogs(s.bgCtx) }()
	return nil
}

// Close stops the background work, waits for it (creations in progress are
// canceled and cleaned up) and closes the agent connections. Sandboxes,
// warm-pool members included, and their execs keep running for the next
// berthd to adopt.
func (s *Service) Close() {
	s.bgStop()
	s.bg.Wait()
	s.agents.Close()
	if s.cfg.Network != nil {
		s.cfg.Network.Close()
	}
}

// startNetwork starts the sandbox network with the sandboxes containerd
// holds now (after Adopt removed the dead ones): theirs is re-adopted, the
// rest removed. A network that cannot start leaves berthd serving without
// EGRESS (NETWORK_UNAVAILABLE, with the cause).
func (s *Service) startNetwork(ctx context.Context) error {
	if s.cfg.Network == nil {
		return nil
	}
	sbs, err := s.rt.List(ctx, nil)
	if err != nil {
		return fmt.Errorf("start the network: %w", err)
	}
	live := make(map[string]bool, len(sbs))
	for _, sb := range sbs {
		live[sb.ID] = true
	}
	if err := s.cfg.Network.Start(ctx, live); err != nil {
		s.log.Error("the sandbox network did not start: EGRESS sandboxes are refused", slog.Any("error", err))
		s.cfg.Network.Close()
		s.cfg.NetworkUnavailable = err.Error()
		s.cfg.Network = nil
	}
	return nil
}

// WarmPoolReady returns the number of warm-pool sandboxes ready for image.
func (s *Service) WarmPoolReady(image string) int { return s.pool.Ready(image) }
