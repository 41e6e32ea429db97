// Package server is berthd as a library: the gRPC handlers of
// berth.v1.SandboxService and berth.v1.ImageService on top of containerd
// (package runtime) and the agents inside sandboxes (package agentconn).
package server

import (
	"log/slog"
	goruntime "runtime"
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
}

// Service implements berth.v1.SandboxService and berth.v1.ImageService.
type Service struct {
	berthv1.UnimplementedSandboxServiceServer
	berthv1.UnimplementedImageServiceServer

	cfg    Config
	rt     *runtime.Runtime
	agents *agentconn.Pool
	log    *slog.Logger
}

var (
	_ berthv1.SandboxServiceServer = (*Service)(nil)
	_ berthv1.ImageServiceServer   = (*Service)(nil)
)

// New returns a Service that keeps sandboxes in rt. log receives errors that
// are reported to callers as INTERNAL.
func New(cfg Config, rt *runtime.Runtime, log *slog.Logger) *Service {
	cfg.setDefaults()
	return &Service{cfg: cfg, rt: rt, agents: agentconn.NewPool(), log: log}
}

// Close closes the agent connections. Sandboxes keep running.
func (s *Service) Close() { s.agents.Close() }
