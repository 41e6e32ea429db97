package server

import (
	"math"
	goruntime "runtime"
	"time"

	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/version"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"golang.org/x/sys/unix"
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
	// Zero: no cap (berthd's default, but on a node of a fleet, where
	// it is HostMemoryBytes).
	MemoryBudgetBytes uint64
	// DiskOvercommit is how many times the size of the btrfs pool that
	// holds the sandboxes' disk quotas (the btrfs snapshotter's file
	// system, read with statfs(2) at New) the quotas may sum to: the disk
	// budget. A CreateSandbox whose resources.disk_bytes would take the
	// sum of the quotas (sandboxes without one count zero) past it fails
	// with FLEET_BUSY, resource CAPACITY_RESOURCE_DISK. Default 1: the
	// quotas fit in the pool, so no sandbox can fill it for the others
	// (issue 21); above 1 the pool is overcommitted, and a full pool
	// answers NO_SPACE; negative: no disk budget. Without disk quotas
	// there is no pool and no budget.
	DiskOvercommit float64
	// MaxSandboxesPerPrincipal caps the sandboxes one principal (the
	// owner a sandbox records) holds, running or stopped; warm-pool
	// members count for the principal that claims them, from the claim.
	// Beyond it CreateSandbox fails with FLEET_BUSY, resource
	// CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES, naming the principal. Zero:
	// no cap.
	MaxSandboxesPerPrincipal int
	// MaxMemoryBytesPerPrincipal caps the sum of the memory caps, in
	// bytes, of one principal's sandboxes (FLEET_BUSY,
	// CAPACITY_RESOURCE_PRINCIPAL_MEMORY). Zero: no cap.
	MaxMemoryBytesPerPrincipal uint64
	// MaxDiskBytesPerPrincipal caps the sum of the disk quotas, in bytes,
	// of one principal's sandboxes (FLEET_BUSY,
	// CAPACITY_RESOURCE_PRINCIPAL_DISK). Zero: no cap.
	MaxDiskBytesPerPrincipal uint64
	// MaxSnapshotsPerPrincipal caps the stored snapshots of one principal
	// (RESOURCE_EXHAUSTED SNAPSHOT_LIMIT). Zero: no cap.
	MaxSnapshotsPerPrincipal int
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
	Reaper lifecycle.ReaperConfig
	// WarmPool maps image references to the number of pre-created
	// sandboxes to keep ready for them; empty disables the pool. Only
	// requests without sandbox_id and request_id, with default resources,
	// user, working directory and no env, are served from it.
	WarmPool map[string]int
	// ForkStandby is the most fork standby members berthd keeps per
	// parent once it forked (runtime.SandboxSpec.Standby,
	// docs/state.md#fork): as many as its largest fork had children, up
	// to this; a next fork's first children are served by them, their
	// containers and agents already running. Zero disables them. Only
	// forks without memory or request_id, of runc sandboxes with idmapped
	// roots, are served; others fork the cold way. Members count against
	// the parent's owner's caps and give way to any sandbox refused for
	// room they hold (lifecycle's giveWay). berthd's flag defaults to 1.
	ForkStandby int
	// ForkStandbyIdle is how long a parent's standby members are kept
	// after its last fork. Default 10 minutes.
	ForkStandbyIdle time.Duration
	// NodeID names this berthd in its fleet (Sandbox.node_id); empty
	// outside a fleet.
	NodeID string
	// Placements records which node holds each sandbox when this berthd
	// is a node of a fleet (a *cluster.Member); nil outside a fleet.
	Placements lifecycle.Placements
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
	// bytes: each holds the first 64 KiB of each stream's buffer from its
	// start (runout.Slabs) and more as its output grows; a Run whose first
	// slabs do not fit fails with FLEET_BUSY (nothing started). Default
	// 1 GiB.
	RunBufferBytes uint64
	// RunBufferWait is how long a Run's output may wait for room in the
	// Run buffer budget before the Run fails (issue 23). Default 30 s.
	RunBufferWait time.Duration

	// Network gives sandboxes of network mode EGRESS their network
	// (package server/network); Start starts it. Nil: EGRESS is refused
	// with FAILED_PRECONDITION NETWORK_UNAVAILABLE, whose message gives
	// NetworkUnavailable as the reason.
	Network            lifecycle.Network
	NetworkUnavailable string

	// AgentVerifier decides whether what listens on a sandbox's agent
	// socket is its agent (agentconn.Verifier). Nil: the runtime's
	// (runtime.Runtime.AgentVerifier): the listener is the sandbox's init
	// process and proves the secret berthd gave it at create. Tests that
	// stand a hostile agent in for a verified one give their own.
	AgentVerifier agentconn.Verifier
}

func (c *Config) setDefaults() {
	if c.DiskOvercommit == 0 {
		c.DiskOvercommit = 1
	}
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
		c.MaxMemoryBytes = HostMemoryBytes()
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
	if c.RunBufferWait <= 0 {
		c.RunBufferWait = 30 * time.Second
	}
}

// HostMemoryBytes returns the host's physical memory in bytes (sysinfo(2)),
// or 1 TiB when it cannot be read.
func HostMemoryBytes() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 1 << 40
	}
	unit := uint64(max(si.Unit, 1))
	return min(uint64(si.Totalram), math.MaxInt64/unit) * unit
}

// Service is berthd's composition root: it builds the engines (runtimes,
// agentreach, admit, lifecycle) over the containerd runtime and the
// services over them (sandboxsvc and execsvc for SandboxService, filesvc,
// imagesvc), and implements berth.v1.SandboxService by forwarding each RPC
