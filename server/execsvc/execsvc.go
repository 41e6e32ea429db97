// Package execsvc is berth.v1.SandboxService's process RPCs — Exec, Run,
// ListExecs, SignalExec, PortForward — one file each, and the exec guard
// (execguard.go) that tells each exec stream's failure apart: the runtime
// replaced under it (RUNTIME_REPLACED), an exec id of an earlier runtime
// (STALE_HANDLE), an unreachable or busy agent (SANDBOX_UNREACHABLE), no
// capacity (FLEET_BUSY). The agent owns every exec; berthd relays its
// events without copying their payloads.
package execsvc

import (
	"context"
	"log/slog"
	"net"
	"time"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runout"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
)

// Config configures the process RPCs; the Config of package server documents each field,
// its unit and its default.
type Config struct {
	ConnectBudget     time.Duration
	BusyRetryDelay    time.Duration
	RunStdoutBytes    uint64
	RunStderrBytes    uint64
	RunMaxOutputBytes uint64
	// DirectForwards bounds the PortForward connections berthd holds
	// dialed itself (each one of berthd's descriptors), and
	// DirectForwardsPerSandbox those of one sandbox; past either the
	// sandbox's agent dials, under the sandbox's own limits. 0: a quarter
	// of berthd's RLIMIT_NOFILE, and DefaultDirectForwardsPerSandbox.
	DirectForwards           int
	DirectForwardsPerSandbox int
}

// reacher reaches a sandbox's agent before anything is sent to it
// (*agentreach.Reacher).
type reacher interface {
	Reach(ctx context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, apierr.Runtime, error)
	Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error)
	NewWatch(sandboxID string, pid uint32) *agentreach.Watch
	PauseWatch(sandboxID string) (paused bool, changed <-chan struct{})
}

// store reads a sandbox's record from containerd (*runtime.Runtime).
type store interface {
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
}

// portDialer connects to a port in a sandbox's network namespace from
// berthd itself, or fails with runtime.ErrNoDirectPath when only its agent
// can (*runtime.Runtime).
type portDialer interface {
	DialPort(ctx context.Context, id string, pid uint32, port uint32) (*net.TCPConn, error)
}

// taskEvents tells when a sandbox's task exits (*runtimes.TaskEvents).
type taskEvents interface {
	Watch(sandboxID string) *runtimes.Watch
	Expect(w *runtimes.Watch, pid uint32, started time.Time) bool
	Fired(w *runtimes.Watch) <-chan struct{}
	Result(w *runtimes.Watch) (runtime.TaskEvent, runtimes.ExitDecision, bool)
	Unwatch(w *runtimes.Watch)
	OOMNear(sandboxID string, started, exitAt time.Time) bool
}

// registry knows each sandbox's runtimes and which runtime each exec id
// was started in (*runtimes.Registry).
type registry interface {
	Current(sandboxID string) apierr.Runtime
	Observe(sandboxID string, id apierr.Runtime) apierr.Runtime
	AwaitReplacement(ctx context.Context, sandboxID, old string) (apierr.Runtime, bool)
	RecordExec(sandboxID, execID, bootID string) (bool, error)
	RetractExec(sandboxID, execID, bootID string)
	ExecRuntime(sandboxID, execID string) (apierr.Runtime, bool)
}

// admitter admits new execs (*admit.Capacity).
type admitter interface {
	AdmitExec(sandboxID string) (*admit.ExecSlot, error)
}

// background runs work that outlives a request (followers of execs whose
// caller left) until berthd closes (*lifecycle.Manager).
type background interface {
	Context() (ctx context.Context, done func())
}

// Observer counts output for metrics (server/metrics).
type Observer interface {
	OutputSent(stream string, n int)
	OutputDropped(bytes uint64)
}

// Deps are the engines the process RPCs stand on.
type Deps struct {
	Store      store
	Reach      reacher
	Events     taskEvents
	Registry   registry
	Capacity   admitter
	RunBuffers *runout.Budget
	Background background
	Observer   Observer
	// Ports dials forwarded ports for PortForward; nil: the agent always
	// does.
	Ports portDialer
}

// Service implements the process RPCs of berth.v1.SandboxService.
type Service struct {
	cfg        Config
	rt         store
	reach      reacher
	events     taskEvents
	ids        registry
	capacity   admitter
	runBuffers *runout.Budget
	life       background
	obs        Observer
	ports      portDialer
	direct     *directSlots
	log        *slog.Logger
}

// New returns the process RPCs over d.
func New(cfg Config, d Deps, log *slog.Logger) *Service {
	return &Service{cfg: cfg, rt: d.Store, reach: d.Reach, events: d.Events, ids: d.Registry, capacity: d.Capacity,
		runBuffers: d.RunBuffers, life: d.Background, obs: d.Observer, ports: d.Ports,
		direct: newDirectSlots(cfg.DirectForwards, cfg.DirectForwardsPerSandbox), log: log}
}
