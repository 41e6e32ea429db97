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
// or berthd starts a new task for it.
package server

import (
	"context"
	"log/slog"
	goruntime "runtime"
	"sync"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Version is berthd's release version, set at build time with
// -ldflags "-X github.com/berth-sandbox/berth/server.Version=v0.1.0".
var Version = "dev"

// Config configures the handlers. Zero fields take the defaults given.
type Config struct {
	// DefaultPidsLimit is a sandbox's pids limit (processes and threads)
	// when the request gives none. Default 1024.
	DefaultPidsLimit uint64
	// MaxPidsLimit bounds requested pids limits; larger requests are
	// INVALID_ARGUMENT. Default 32768.
	MaxPidsLimit uint64
	// MaxCPUMillis bounds requested CPU caps, in thousandths of a CPU.
	// Default: the host's CPU count × 1000.
	MaxCPUMillis uint64
	// MaxMemoryBytes bounds requested memory caps, in bytes. Default: no
	// bound beyond the host's memory.
	MaxMemoryBytes uint64
	// AgentReadyTimeout bounds how long CreateSandbox waits for the agent
	// to answer after the task starts. Default 30 s.
	AgentReadyTimeout time.Duration

	// ConnectBudget bounds how long a request waits for a sandbox's agent
	// to connect and answer, and for its first answer to an exec; past it
	// the request fails with UNAVAILABLE SANDBOX_UNREACHABLE. Default 3 s.
	ConnectBudget time.Duration
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
}

func (c *Config) setDefaults() {
	if c.DefaultPidsLimit == 0 {
		c.DefaultPidsLimit = 1024
	}
	if c.MaxPidsLimit == 0 {
		c.MaxPidsLimit = 32768
	}
	if c.MaxCPUMillis == 0 {
		c.MaxCPUMillis = uint64(goruntime.NumCPU()) * 1000
	}
	if c.AgentReadyTimeout == 0 {
		c.AgentReadyTimeout = 30 * time.Second
	}
	if c.ConnectBudget == 0 {
		c.ConnectBudget = 3 * time.Second
	}
	if c.BusyRetryDelay == 0 {
		c.BusyRetryDelay = time.Second
	}
	if c.TaskRestartLimit == 0 {
		c.TaskRestartLimit = 5
	}
	if c.TaskRestartWindow == 0 {
		c.TaskRestartWindow = 10 * time.Minute
	}
}

// Service implements berth.v1.SandboxService and berth.v1.ImageService.
type Service struct {
	berthv1.UnimplementedSandboxServiceServer
	berthv1.UnimplementedImageServiceServer

	cfg    Config
	rt     *runtime.Runtime
	agents *agentconn.Pool
	log    *slog.Logger

	// Runtime conditions (errors.go): task events, runtime identities,
	// task restarts and capacity.
	events   *taskEvents
	ids      *identities
	restarts *restarter
	capacity *capacity
	// bgCtx ends at Close; bg counts the goroutines that Close waits for.
	bgCtx  context.Context
	bgStop context.CancelFunc
	bg     sync.WaitGroup
}

var (
	_ berthv1.SandboxServiceServer = (*Service)(nil)
	_ berthv1.ImageServiceServer   = (*Service)(nil)
)

// New returns a Service that keeps sandboxes in rt. log receives errors that
// are reported to callers as INTERNAL.
//
// New starts following containerd's task events in the background (see
// watchRuntimes); Close stops it.
func New(cfg Config, rt *runtime.Runtime, log *slog.Logger) *Service {
	cfg.setDefaults()
	s := &Service{cfg: cfg, rt: rt, agents: agentconn.NewPool(), log: log}
	s.watchRuntimes()
	return s
}

// Close stops the background work and closes the agent connections.
// Sandboxes and their execs keep running.
func (s *Service) Close() {
	s.bgStop()
	s.bg.Wait()
	s.agents.Close()
}
