// Package sandboxsvc is berth.v1.SandboxService's sandbox RPCs —
// CreateSandbox, GetSandbox, ListSandboxes, DeleteSandbox, KeepAlive,
// PauseSandbox, ResumeSandbox, HibernateSandbox — one
// file each: they validate the request, name the caller, and hand the
// sandbox's lifecycle to the lifecycle engine through small interfaces
// (store, sandboxes, agents), which tests fake without containerd.
package sandboxsvc

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/lifecycle"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Config holds the defaults and maximums a request is checked against;
// the Config of package server documents each field, its unit and its default.
type Config struct {
	DefaultPidsLimit    uint64
	MaxPidsLimit        uint64
	MaxCPUMillis        uint64
	MaxMemoryBytes      uint64
	DefaultCPUMillis    int64
	DefaultMemoryBytes  int64
	DefaultOpenFiles    uint64
	MaxOpenFiles        uint64
	MaxSandboxOpenFiles uint64
	AllowHostUsers      bool
	DefaultDiskBytes    uint64
	MaxDiskBytes        uint64
	DefaultIdleTimeout  time.Duration
	MaxIdleTimeout      time.Duration
	DefaultMaxLifetime  time.Duration
	MaxLifetime         time.Duration
	// NodeID names this berthd in its fleet (Sandbox.node_id).
	NodeID string
	// ServerVersion is berthd's version (Sandbox.server_version).
	ServerVersion string
}

// store is what the handlers read of containerd (*runtime.Runtime).
type store interface {
	ResolveImage(ctx context.Context, ref string, v runtime.ImageViewer) (string, error)
	ImageUser(ctx context.Context, ref, spec string) (uid, gid uint32, err error)
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
	List(ctx context.Context, labels map[string]string) ([]runtime.Sandbox, error)
	Usage(ctx context.Context, id string) (runtime.Usage, error)
	GVisorEnabled() bool
	DiskQuota() error
}

// sandboxes is what the handlers ask of the sandboxes' lifecycle
// (*lifecycle.Manager).
type sandboxes interface {
	Create(ctx context.Context, spec runtime.SandboxSpec, p auth.Principal, fromPool bool) (lifecycle.Created, error)
	Delete(ctx context.Context, id string, p auth.Principal) error
	Pause(ctx context.Context, id string, p auth.Principal) error
	Resume(ctx context.Context, id string, p auth.Principal) error
	Hibernate(ctx context.Context, id string, p auth.Principal) (runtime.Hibernation, error)
	CreateSnapshot(ctx context.Context, id string, p auth.Principal, labels map[string]string) (runtime.Snapshot, error)
	GetSnapshot(ctx context.Context, snapID string, p auth.Principal) (runtime.Snapshot, error)
	ListSnapshots(ctx context.Context, p auth.Principal) ([]runtime.Snapshot, error)
	DeleteSnapshot(ctx context.Context, snapID string, p auth.Principal) error
	Fork(ctx context.Context, id string, p auth.Principal, req lifecycle.ForkRequest) ([]lifecycle.Created, error)
	CommitSnapshot(ctx context.Context, snapID string, p auth.Principal, opts runtime.CommitOptions) (runtime.Commit, error)
	Status(id string) (lifecycle.Status, bool)
	Starting(id string) bool
	Touch(id string)
	Hold(ctx context.Context, id string, until time.Time) error
	Network() (lifecycle.Network, string)
}

// agents asks a running sandbox's agent who it is (*agentreach.Reacher).
type agents interface {
	Info(ctx context.Context, sb runtime.Sandbox) (*agentv1.InfoResponse, error)
}

// Service implements the sandbox RPCs of berth.v1.SandboxService.
type Service struct {
	cfg    Config
	rt     store
	life   sandboxes
	agents agents
	log    *slog.Logger
}

// New returns the sandbox RPCs over rt, life and agents.
func New(cfg Config, rt store, life sandboxes, agents agents, log *slog.Logger) *Service {
	return &Service{cfg: cfg, rt: rt, life: life, agents: agents, log: log}
}

// sandboxNotFound is the error of a sandbox that does not exist, and of one
// the caller may not see: the same words and details (server/status), so that no
// answer tells the two apart.
func sandboxNotFound(id string) error {
	return fmt.Errorf("%w: %s", runtime.ErrSandboxNotFound, id)
}

// visibleSandbox returns the record of sandbox id when the caller of ctx
// may see it (auth.Sees). A warm-pool member no caller claimed, or another
// principal's sandbox, is sandboxNotFound.
func (s *Service) visibleSandbox(ctx context.Context, id string) (runtime.Sandbox, error) {
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	if sb.Pooled || !auth.Sees(ctx, sb.Owner) {
		return runtime.Sandbox{}, sandboxNotFound(id)
	}
	return sb, nil
}

// caller returns the principal of ctx; a context the auth interceptors did
// not make has none and is refused as UNAUTHENTICATED.
// imageViewer is p as the runtime's image calls see it.
func imageViewer(p auth.Principal) runtime.ImageViewer {
	return runtime.ImageViewer{Principal: p.Name, Admin: p.Admin}
}

func caller(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, apierr.New(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "the request carries no authenticated principal", nil)
	}
	return p, nil
}

// minMemoryBytes is the smallest memory cap accepted: below a few MiB the
// agent itself cannot run.
const minMemoryBytes = 4 << 20

// maxShmBytes bounds resources.shm_bytes whatever --max-memory-bytes says:
// far from the wrap of its rounding to whole KiB and from the int64 of the
// OCI spec.
const maxShmBytes = 1 << 62
