// Package runtime is berthd's glue to containerd: it turns a sandbox spec
// into a container whose PID 1 is berth-agent, reads sandbox records back
// from container labels, removes sandboxes, and imports and lists images.
// Everything it knows lives in containerd, so a restarted berthd sees the
// same sandboxes.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/keylock"
	"github.com/containerd/cgroups/v3"
	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"k8s.io/utils/cpuset"

	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

// Label keys berthd stores on every sandbox container. Keys with the
// LabelPrefix are reserved: callers' labels may not use it.
const (
	LabelPrefix    = "berth.dev/"
	labelSandbox   = LabelPrefix + "sandbox"
	labelImage     = LabelPrefix + "image"
	labelCreatedAt = LabelPrefix + "created-at"
	labelPidsLimit = LabelPrefix + "pids-limit"
	labelCPUMillis = LabelPrefix + "cpu-millis"
	labelMemory    = LabelPrefix + "memory-bytes"
	labelOpenFiles = LabelPrefix + "open-files"
	labelRuntime   = LabelPrefix + "runtime"
	labelHostUsers = LabelPrefix + "host-users"
	labelDisk      = LabelPrefix + "disk-bytes"
	// More of the record: labels.go.
)

// ContainerdLabelPrefix starts the labels containerd itself acts on
// (garbage-collection references and roots, containerd's
// docs/garbage-collection.md): callers' labels may not use it, and they
// are never shown as a sandbox's labels.
const ContainerdLabelPrefix = "containerd.io/"

// Paths inside every sandbox.
const (
	// AgentPath is where the agent binary is bind-mounted, read-only.
	AgentPath = "/.berth-agent"
	// RunDir is where the "run" subdirectory of the sandbox's host
	// directory is bind-mounted; the agent listens on RunDir/agent.sock.
	// That subdirectory is a tmpfs of its own of RunDirBytes (rundir.go):
	// the workload can write there, but not the host's disk.
	RunDir = "/.berth-run"
	// socketName is the agent's socket file name in RunDir and in the host
	// directory's "run".
	socketName = "agent.sock"
	// logName is the agent's stdout and stderr log in the host directory,
	// outside "run": the sandbox can replace anything in "run" (a symlink
	// there would have containerd's shim, host root, open any host file).
	logName = "agent.log"
)

// Runtimes a sandbox can run under (SandboxSpec.Runtime).
const (
	// RuntimeRunc runs the sandbox as an ordinary container (runc).
	RuntimeRunc = "runc"
	// RuntimeGVisor runs it under gVisor's runsc: the workload's system
	// calls go to gVisor's user-space kernel, not the host's.
	RuntimeGVisor = "gvisor"
)

// Domain errors. The gRPC handlers map them to status codes.
var (
	// ErrSandboxNotFound means no sandbox container has the id.
	ErrSandboxNotFound = errors.New("sandbox not found")
	// ErrSandboxExists means a container with the id exists already.
	ErrSandboxExists = errors.New("sandbox exists")
	// ErrImageNotFound means the image reference is not in the image store.
	ErrImageNotFound = errors.New("image not found")
	// ErrImageArchive means an image archive could not be imported.
	ErrImageArchive = errors.New("invalid image archive")
	// ErrImageUnusable means what the image holds cannot start a sandbox.
	ErrImageUnusable = errors.New("image cannot start a sandbox")
)

// Config configures the runtime. Zero fields take the defaults given.
type Config struct {
	// Address is containerd's socket path. Required.
	Address string
	// Namespace is berthd's containerd namespace. Default "berth".
	Namespace string
	// Snapshotter is the containerd snapshotter. Default "overlayfs".
	// Sandboxes get disk quotas (SandboxSpec.DiskBytes) only with "btrfs",
	// whose root containerd must have on a btrfs with quotas enabled
	// (scripts/btrfs-quota.sh); see DiskQuota.
	Snapshotter string
	// StateDir is the host directory holding one directory per sandbox
	// with the agent's socket and log. Sandbox socket paths must stay under
	// the 108 bytes of sun_path (unix(7)), so keep it short. Default
	// "/run/berth".
	StateDir string
	// AgentBinary is the host path of the static berth-agent binary,
	// bind-mounted read-only into every sandbox. Required.
	AgentBinary string
	// ExecHeartbeat, ExecRetention, ExecRingBytes and ExecRetainedBytes are
	// given to the agent of every sandbox created from now on (berth-agent
	// --heartbeat-interval, --retention, --ring-bytes, --retained-bytes);
	// existing sandboxes keep theirs. Zero keeps the agent's defaults: a
	// heartbeat after 15 s of silence, finished execs attachable for 10
	// minutes, 8 MiB of events retained per exec, and an eighth of the
	// sandbox's memory (4 MiB to 256 MiB) retained by all its execs.
	ExecHeartbeat     time.Duration
	ExecRetention     time.Duration
	ExecRingBytes     uint64
	ExecRetainedBytes uint64
	// WorkloadNofile is the soft RLIMIT_NOFILE of every process the agent
	// starts (berth-agent --workload-nofile), capped by the container's
	// hard limit; zero keeps the agent's default of 1024.
	WorkloadNofile uint64
	// TraceAgents starts new sandboxes' agents with --trace: they trace
	// their calls and hand the spans to berthd (internal/telemetry).
	TraceAgents bool
	// IDFirst is the first host id of the user-namespace ranges given to
	// sandboxes, IDRanges how many ranges of IDRangeSize ids there are.
	// Defaults 1073741824 (2^30) and 16384: host ids 2^30 to 2^31-1, far
	// from any host account. Two berthds on one host need disjoint ranges.
	IDFirst  uint32
	IDRanges uint32
	// GVisorBinary is the runsc wrapper that the runc shim runs for gvisor
	// sandboxes (scripts/runsc-berth). Empty: gvisor sandboxes are refused.
	GVisorBinary string
	// RootIDMapping chooses how sandboxes in user namespaces of their own
	// get their image's files under their ids: RootIDMappingAuto (""),
	// RootFSIDMapped or RootFSChowned; see IDMapped.
	RootIDMapping string
	// CreateWorkLimit bounds the long work of a create, within the
	// caller's deadline: unpacking an image, and the chowned copy of
	// RootFSChowned. Default 10 minutes.
	CreateWorkLimit time.Duration
	// MaxImageStoreBytes bounds containerd's content store (the blobs of
	// every image in the runtime's namespace), in bytes: an import or pull
	// that would take it past the bound fails with an *ImageStoreFull.
	// Zero: no bound.
	MaxImageStoreBytes uint64
	// CallBudget bounds a request to containerd that should answer at
	// once — reading or changing a record, creating, signalling or
	// deleting a task; past it the request fails with an
	// *UnavailableError (Slow). Moving data (import, unpack, pull) and
	// waiting for a task's exit are not bounded by it. Default 10 s.
	CallBudget time.Duration
	// CPUSet is CPUSetAuto ("" too) or CPUSetOff: whether a sandbox whose
	// CPU cap is below the host's CPUs is pinned to a cpuset of its size,
	// so that nproc shows its share (cpuset.go). With CPUSetAuto where
	// pinning cannot work (probeCPUSet), none is pinned and
	// Runtime.CPUSetUnavailable says why.
	CPUSet string
	// CPUWeight is CPUWeightAuto ("" too) or CPUWeightOff: whether the
	// sandboxes' parent cgroup weighs as its sandboxes' CPU caps
	// (cpuweight.go). With CPUWeightAuto where that cannot work
	// (probeCPUWeight), nothing is weighed and
	// Runtime.CPUWeightUnavailable says why.
	CPUWeight string
}

func (c *Config) setDefaults() {
	if c.Namespace == "" {
		c.Namespace = "berth"
	}
	if c.Snapshotter == "" {
		c.Snapshotter = "overlayfs"
	}
	if c.StateDir == "" {
		c.StateDir = "/run/berth"
	}
	if c.IDFirst == 0 {
		c.IDFirst = 1 << 30
	}
	if c.IDRanges == 0 {
		c.IDRanges = 16384
	}
	if c.CallBudget <= 0 {
		c.CallBudget = 10 * time.Second
	}
	if c.CreateWorkLimit <= 0 {
		c.CreateWorkLimit = 10 * time.Minute
	}
	if c.CPUSet == "" {
		c.CPUSet = CPUSetAuto
	}
	if c.CPUWeight == "" {
		c.CPUWeight = CPUWeightAuto
	}
}

// Runtime creates and inspects sandboxes in containerd.
type Runtime struct {
	cfg     Config
	client  *containerd.Client
	secrets secrets

	idMu       sync.Mutex
	idReserved map[uint32]string // id ranges of creates in progress
	idRetry    map[string]uint32 // id ranges of failed creates, by sandbox id

	// cpus are the CPUs sandboxes may be pinned to, read at start
	// (probeCPUSet), or cpusetErr why none are; cpuReserved the pinnings
	// of creates in progress, by sandbox id.
	cpus        cpuset.CPUSet
	cpusetErr   error
	cpuMu       sync.Mutex
	cpuReserved map[string]pinning
	// unified is whether the cgroup hierarchy is v2. cpuWeightErr says
	// why the sandboxes' parent cgroup is not weighed (probeCPUWeight);
	// weighs coalesces reweighs.
	unified      bool
	cpuWeightErr error
	weighs       coalescer[struct{}]
	// quota sets sandboxes' disk quotas; nil when quotaErr says why
	// there are none.
	quota    *qgroup.FS
	quotaErr error
	// volMu serializes volume creates and deletes with the checks of
	// creates that mount volumes (volume.go); volPending holds those
	// creates' sandbox ids by volumeKey until their containers exist.
	volMu        sync.Mutex
	volPendingMu sync.Mutex
	volPending   map[string]map[string]bool
	// pool is the btrfs snapshotter's root when quota is set: the file
	// system of every sandbox's writable snapshot (PoolFullError).
	pool string
	// idmapErr says why sandboxes get chowned copies of their image
	// (RootFSChowned) instead of idmapped roots; nil when they do not.
	idmapErr error
	// orphanLeases counts the leases of dead berthds deleted at start.
	orphanLeases int
	// lists coalesces concurrent List calls (coalescer).
	lists coalescer[[]Sandbox]
	// kinds remembers which tasks run under gVisor (DialPort).
	kinds taskKinds
	// forkTaking are the fork copies being taken, which children's
	// creates wait for (ForkSnapshot).
	forkTaking copiesTaking
	// shimQueues hold the task creates of a shim group's sandboxes
	// one at a time (a fork's children under runc; enterShim).
	shimQueues keylock.Locks
	// freezers are the cgroup freezers of the runc tasks berthd paused or
	// resumed (freezer.go).
	freezers freezers
	// standbys are the standby members waiting (standby.go).
	standbys standbys
}

// New connects to containerd at cfg.Address and returns a Runtime that
// works in cfg.Namespace. It fails when containerd does not answer within
// ctx or the agent binary is missing. Whether sandboxes can get disk quotas
// is found out here too: see DiskQuota.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.setDefaults()
	if cfg.Address == "" {
		return nil, errors.New("containerd address is empty")
	}
	if err := cfg.checkAgentFlags(); err != nil {
		return nil, err
	}
	if st, err := os.Stat(cfg.AgentBinary); err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("agent binary %s is not a regular file", cfg.AgentBinary)
	}
	// 0711: a sandbox's root, an unprivileged host id, must be able to
	// pass through to its run directory (runc bind-mounts it from inside
	// the sandbox's user namespace); listing stays berthd's.
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "s")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace),
		// Back within a second of containerd's return: gRPC's reconnect
		// backoff otherwise grows to the client's 10 s.
		containerd.WithExtraDialOpts([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: cfg.CallBudget,
		})}))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", cfg.Address, err)
	}
	if _, err := client.Version(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", cfg.Address, err)
	}
	if err := checkMountsShared(cfg.Address, cfg.StateDir); err != nil {
		client.Close()
		return nil, err
	}
	r := &Runtime{cfg: cfg, client: client, idReserved: make(map[uint32]string), idRetry: make(map[string]uint32), cpuReserved: make(map[string]pinning)}
	switch cfg.CPUSet {
	case CPUSetAuto:
		// Never fatal: a berthd that cannot pin runs as with CPUSetOff.
		r.cpus, r.cpusetErr = probeCPUSet(cgroupRoot, cgroups.Mode() == cgroups.Unified, cfg.Namespace)
	case CPUSetOff:
	default:
		client.Close()
		return nil, fmt.Errorf("cpuset %q: want %q or %q", cfg.CPUSet, CPUSetAuto, CPUSetOff)
	}
	r.unified = cgroups.Mode() == cgroups.Unified
	switch cfg.CPUWeight {
	case CPUWeightAuto:
		// Never fatal: a berthd that cannot weigh runs as with
		// CPUWeightOff.
		if r.cpuWeightErr = probeCPUWeight(cgroupRoot, r.unified, cfg.Namespace); r.cpuWeightErr == nil {
			if err := r.reweigh(ctx); err != nil {
				r.cpuWeightErr = err
			}
		}
	case CPUWeightOff:
	default:
		client.Close()
		return nil, fmt.Errorf("cpu weight %q: want %q or %q", cfg.CPUWeight, CPUWeightAuto, CPUWeightOff)
	}
	if r.orphanLeases, err = r.dropOrphanLeases(ctx); err != nil {
		client.Close()
		return nil, err
	}
	if cfg.Snapshotter == quotaSnapshotter {
		// The copies of forks that a dead berthd was making (ForkSnapshot).
		if root, err := r.btrfsRoot(ctx); err == nil {
			r.dropOrphanForkCopies(root)
		}
	}
	switch cfg.RootIDMapping {
	case RootIDMappingAuto, RootFSIDMapped:
		if err := r.probeIDMap(ctx); err != nil {
			r.idmapErr = fmt.Errorf("%w: snapshotter %s: %w", ErrNoIDMap, cfg.Snapshotter, err)
			if cfg.RootIDMapping == RootFSIDMapped {
				client.Close()
				return nil, r.idmapErr
			}
		}
	case RootFSChowned:
		r.idmapErr = fmt.Errorf("%w: chowned copies were asked for", ErrNoIDMap)
	default:
		client.Close()
		return nil, fmt.Errorf("root id mapping %q: want %q, %q or %q", cfg.RootIDMapping, "auto", RootFSIDMapped, RootFSChowned)
	}
	if r.quota, err = r.openDiskQuota(ctx); err != nil {
		if !errors.Is(err, ErrDiskQuotaUnsupported) {
			client.Close()
			return nil, err
		}
		r.quotaErr = err
	} else {
		r.pool = r.quota.Dir()
	}
	return r, nil
}

// Close closes the connection to containerd. Sandboxes keep running.
func (r *Runtime) Close() error {
	if r.quota != nil {
		r.quota.Close()
	}
	return r.client.Close()
}

// Namespace returns the containerd namespace the runtime works in.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// SandboxSpec is what a sandbox is created from.
type SandboxSpec struct {
	// ID is the sandbox id, already validated.
	ID string
	// Image is an image reference present in the image store.
	Image string
	// FromSnapshot names a stored snapshot (CreateSnapshot) whose files
	// the sandbox's root starts with, in place of Image's (which must be
	// the snapshot's image); "" for none.
	FromSnapshot string
	// Labels are the caller's labels, without reserved keys.
	Labels map[string]string
	// PidsLimit caps processes and threads of the workload; the cgroup
	// allows AgentPidsReserve more for the agent.
	PidsLimit uint64
	// CPUMillis caps CPU in thousandths of a CPU; zero means no cap.
	CPUMillis uint64
	// MemoryBytes caps memory in bytes, swap included; zero means no cap.
	MemoryBytes uint64
	// OpenFiles is RLIMIT_NOFILE, soft and hard, of the agent and so of
	// every process in the sandbox; zero keeps containerd's default (1024).
	OpenFiles uint64
	// HostUsers runs the sandbox in the host's user namespace. Otherwise
	// it gets one of its own, ids 0-65535 mapped to a host range no other
	// sandbox of the runtime uses (userns.go).
	HostUsers bool
	// Runtime is RuntimeRunc (also for "") or RuntimeGVisor.
	Runtime string
	// DiskBytes caps the bytes the sandbox's writable layer holds beyond
	// its image (data and metadata, btrfs quota group "exclusive" bytes),
	// and, in the agent, the file bytes one Upload or WriteFile may
	// store; zero means no cap. Non-zero needs DiskQuota() == nil.
	DiskBytes uint64
	// ShmBytes is the size of /dev/shm in bytes (rounded up to KiB); zero
	// means DefaultShmBytes.
	ShmBytes uint64
	// Env is added to the process environment of the agent and so of every
	// process in the sandbox. Values go into the OCI spec only: labels keep
	// the keys and a hash.
	Env map[string]string
	// UID and GID are the workload user, passed to the agent.
	UID, GID uint32
	// WorkDir is the absolute working directory for processes without a
	// cwd, passed to the agent.
	WorkDir string
	// IdleTimeout and MaxLifetime are recorded for berthd's reaper; the
	// runtime does not enforce them.
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	// Pooled marks a warm-pool member that no caller has claimed yet.
	Pooled bool
	// Owner is the principal that creates the sandbox (LabelOwner); empty
	// for warm-pool members until a caller claims one. It is not part of
	// Digest: who asked is not what was asked for.
	Owner string
	// Network is the sandbox's network; the zero value is mode NONE.
	Network NetworkSpec
	// IdleAction is what the idle timeout does: IdleDelete (also for ""),
	// IdlePause or IdleHibernate. The runtime only records it.
	IdleAction string
	// Fork records, on a sandbox ForkSandbox makes, the call that made
	// it; the zero value for any other sandbox. Not part of Digest.
	Fork ForkOrigin
	// Volumes are Owner's volumes mounted into the sandbox (volume.go),
	// paths already validated; none for a warm-pool member.
	Volumes []VolumeMount
	// Standby makes a fork standby member (standby.go): with Pooled and
	// Fork.Parent, the spec of that parent's next fork's child, started on
	// a placeholder root with its agent waiting until TakeStandby. Not
	// recorded (Pooled and Fork.Parent are).
	Standby bool
}

// ForkOrigin is the ForkSandbox call a sandbox comes from.
type ForkOrigin struct {
	// Parent is the id of the sandbox forked.
	Parent string
	// RequestID is the call's request_id ("" for none).
	RequestID string
	// Count is how many children the call made.
	Count int
	// Memory says the child was restored from its parent's memory
	// (ForkSandbox with memory, gVisor): the parent's processes, exec
	// records and memory, its agent serving under a secret and boot id
	// of the child's own.
	Memory bool
	// MemoryImage, at the create of a child with Memory, is the
	// directory of the parent's checkpoint image and wake token
	// (Runtime.ForkMemory) its task is restored from. Not recorded.
	MemoryImage string
	// ShimGroup, under runc, is the id of the sandbox whose shim process
	// serves the child (withShimGroup): "" for Parent's; the child's own
	// id for one that starts a shim of its own, which later children
	// join. Only Create reads it; it is not recorded.
	ShimGroup string
}

// Idle actions of SandboxSpec.IdleAction.
const (
	IdleDelete    = "delete"
	IdlePause     = "pause"
	IdleHibernate = "hibernate"
)

// Sandbox is a sandbox as recorded in containerd.
type Sandbox struct {
	ID        string
	Image     string
	Labels    map[string]string
	CreatedAt time.Time
	// PidsLimit, CPUMillis, MemoryBytes, OpenFiles and DiskBytes are the limits the
	// sandbox was created with, as in SandboxSpec.
	PidsLimit   uint64
	CPUMillis   uint64
	MemoryBytes uint64
	OpenFiles   uint64
	// HostUsers and Runtime are as in SandboxSpec; IDBase is the host id
	// its root maps to (0 with HostUsers).
	HostUsers bool
	Runtime   string
	IDBase    uint32
	// RootFS is how a sandbox with a user namespace of its own sees its
	// image's files as its own: RootFSIDMapped or RootFSChowned; "" for
	// a sandbox in the host's user namespace (HostUsers, gVisor).
	RootFS    string
	DiskBytes uint64
	ShmBytes  uint64
	// CPUSet is the CPUs the sandbox is pinned to, in the kernel's list
	// format ("1", "0-3"); "" when it is not pinned (cpuset.go).
	CPUSet string
	// UID, GID, WorkDir, IdleTimeout, MaxLifetime, Pooled and Owner are as
	// in SandboxSpec.
	UID, GID    uint32
	WorkDir     string
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	Pooled      bool
	Owner       string
	// Network is as in SandboxSpec, without NetNS and ResolvConf.
	Network NetworkSpec
	// EnvKeys are the sorted names of SandboxSpec.Env; EnvHash is
	// EnvDigest of it.
	EnvKeys []string
	EnvHash string
	// SpecHash is SandboxSpec.Digest at creation (or at a pool claim).
	SpecHash string
	// Expired is the reason the reaper recorded before removing it ("" when
	// it has not expired): a berthd that died meanwhile finishes the job.
	Expired string
	// HoldUntil is the end of the latest KeepAlive hold; zero when none.
	HoldUntil time.Time
	// Running is true when the container's task is running.
	Running bool
	// Paused is true when the container's task is paused or pausing
	// (Pause): alive, its processes frozen. Running is false then.
	Paused bool
	// Hibernated is true when the sandbox was hibernated (Hibernate) and
	// has no task: its processes ended, its container and files are kept.
	Hibernated bool
	// HibernationMark is the container's hibernation mark whatever its
	// task: HibernatedMemoryKept or HibernatedProcessesEnded while it is
	// hibernated and while Hibernate is under way (a gVisor sandbox's
	// task runs on while its agent quiesces and runsc saves it); "" when
	// it is not hibernated.
	HibernationMark string
	// IdleAction is as in SandboxSpec, IdleDelete when none was recorded.
	IdleAction string
	// FromSnapshot, Fork and Volumes are as in SandboxSpec.
	FromSnapshot string
	Fork         ForkOrigin
	Volumes      []VolumeMount
	// TaskPID is the task's host pid; zero when there is no task.
	TaskPID uint32
	// SocketPath is the host path of the agent's socket.
	SocketPath string
}

// hostDir returns the host directory of sandbox id.
func (r *Runtime) hostDir(id string) string {
	return filepath.Join(r.cfg.StateDir, "s", id)
}

// SocketPath returns the host path of the agent socket of sandbox id.
func (r *Runtime) SocketPath(id string) string {
	return filepath.Join(r.hostDir(id), "run", socketName)
}

// LogPath returns the host path of the agent log of sandbox id.
func (r *Runtime) LogPath(id string) string {
	return filepath.Join(r.hostDir(id), logName)
}

// Create creates the sandbox container and starts its task with the agent
// as PID 1, its writable snapshot capped at spec.DiskBytes. It does not
// wait for the agent to answer. It fails with ErrImageNotFound when the
// image is not stored, ErrSandboxExists when the id is taken and
// ErrDiskQuotaUnsupported when a disk quota is asked for and cannot be set;
// on any failure it removes what it created.
func (r *Runtime) Create(ctx context.Context, spec SandboxSpec) (retErr error) {
	c := r.begin(ctx, "create sandbox "+spec.ID)
	defer c.end(&retErr)
	defer r.reweighAfter(ctx)
	ph := phasesOf(ctx)
	step, cancel := c.step()
	defer cancel()
	image, err := r.client.GetImage(step, spec.Image)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s", ErrImageNotFound, spec.Image)
		}
		return fmt.Errorf("get image %s: %w", spec.Image, err)
	}
	// A private image runs in its principal's sandboxes (the services
	// check the caller; an admin may run it too), never in a warm-pool
	// member, which has no owner until a caller claims it. A fork standby
	// member runs none of its image's files (its root is a placeholder
	// until a fork's copy of its parent replaces it, and the fork checks
	// its caller may see the parent), so its parent's private image
	// does not keep it from being made.
	if image.Labels()[labelImagePrivateTo] != "" && !spec.Standby && (spec.Pooled || spec.Owner == "") {
		return fmt.Errorf("%w: %s", ErrImageHidden, spec.Image)
	}
	if err := r.checkHeadroom(c.op); err != nil {
		return err
	}
	if spec.Standby {
		if err := r.checkStandby(spec); err != nil {
			return err
		}
	}
	unpacked, err := image.IsUnpacked(step, r.cfg.Snapshotter)
	if err != nil {
		return fmt.Errorf("check unpacked image %s: %w", spec.Image, err)
	}
	// Moving data (an unpack, a chowned copy) is bounded by the caller's
	// deadline and CreateWorkLimit, not by the call budget; what it makes
	// lives under a lease, which a create that is cut off leaves to expire
	// so that its retry finds the work done.
	work, cancelWork := context.WithTimeout(ctx, r.cfg.CreateWorkLimit)
	defer cancelWork()
	work, doneLease, err := r.withLease(work, createLeaseExpiry)
	if err != nil {
		return fmt.Errorf("lease for the create of %s: %w", spec.ID, err)
	}
	defer func() {
		if work.Err() == nil {
			doneLease(context.WithoutCancel(ctx))
		}
	}()
	if !unpacked {
		if err := image.Unpack(work, r.cfg.Snapshotter); err != nil {
			return c.longWork(work, fmt.Errorf("unpack image %s: %w", spec.Image, err))
		}
	}

	dir := r.hostDir(spec.ID)
	if len(r.SocketPath(spec.ID)) >= 108 {
		return fmt.Errorf("agent socket path %s is longer than unix(7) allows (107 bytes)", r.SocketPath(spec.ID))
	}
	switch err := os.Mkdir(dir, 0o700); {
	case err == nil:
		// Removed if the create fails before its container exists (after
		// that, Delete removes it).
		defer func() {
			if retErr != nil && !errors.Is(retErr, ErrSandboxExists) {
				check, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CallBudget)
				defer cancel()
				if _, err := r.client.LoadContainer(check, spec.ID); errdefs.IsNotFound(err) {
					r.removeHostDir(spec.ID)
				}
			}
		}()
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("create sandbox directory: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create sandbox directory: %w", err)
	}

	labels := spec.labels(time.Now())
	secret := agentproof.NewSecret()
	var restore *childRestore
	if spec.Fork.MemoryImage != "" {
		if restore, err = r.forkRestore(ctx, spec); err != nil {
			return err
		}
		secret = restore.secret
	}
	labels[labelAgentSecret] = secret
	r.secrets.drop(spec.ID) // a deleted sandbox of the same id had another

	releaseVolumes, err := r.claimVolumes(spec)
	if err != nil {
		return err
	}
	defer releaseVolumes()
	specOpts := r.specOpts(image, spec, dir)
	if len(spec.Volumes) > 0 {
		specOpts = append(specOpts, r.withVolumes(spec))
	}
	if shimGroup(spec) != "" {
		specOpts = append(specOpts, withShimGroup(spec))
	}
	// One containerd read, no file of berthd's own (the cgroups were
	// probed at start): its failure is containerd's, classified by end.
	pinStep, cancelPin := c.step()
	cpus, releaseCPUs, err := r.allocCPUs(pinStep, spec)
	cancelPin()
	if err != nil {
		return err
	}
	defer releaseCPUs()
	if cpus.Size() > 0 {
		labels[labelCPUSet] = cpus.String()
		specOpts = append(specOpts, oci.WithCPUs(cpus.String()))
	}
	snapshot := containerd.WithNewSnapshot(spec.ID, image)
	parent, from := "", ""
	if spec.FromSnapshot != "" {
		if err := r.snapshotsSupported(); err != nil {
			return err
		}
		if spec.runtime() != RuntimeGVisor && (!spec.userns() || r.idmapErr != nil) {
			return fmt.Errorf("%w: a sandbox created from a snapshot needs an idmapped root or gVisor (not host_users, and a kernel that can idmap: %v)", ErrSnapshotUnsupported, r.idmapErr)
		}
		if parent, from, err = r.snapshotParent(step, spec.FromSnapshot); err != nil {
			return err
		}
		if spec.runtime() == RuntimeGVisor {
			snapshot = r.withCopiedRoot(spec.ID, image, parent, from)
		}
	}
	var base uint32
	if spec.userns() {
		var release func()
		if base, release, err = r.allocIDBase(ctx, spec.ID); err != nil {
			return err
		}
		defer release()
		defer func() { r.rememberIDBase(spec.ID, base, retErr == nil) }()
		labels[labelIDBase] = strconv.FormatUint(uint64(base), 10)
		if r.idmapErr == nil {
			// The sandbox's own snapshot, mounted with its ids mapped
			// (mountRoot): no copy of the image.
			labels[labelRootFS] = RootFSIDMapped
			labels[labelGCRefSnapshot+r.cfg.Snapshotter] = spec.ID
			snapshot = r.withIDMappedRoot(spec.ID, image, parent, from, base)
			specOpts = append([]oci.SpecOpts{oci.WithRootFSPath(r.rootDir(spec.ID))}, specOpts...)
		} else {
			// The image's files chowned into the range (a copy per range).
			labels[labelRootFS] = RootFSChowned
			remapped, err := r.remappedImage(work, image, base)
			if err != nil {
				return c.longWork(work, err)
			}
			snapshot = withSnapshotOf(spec.ID, image, remapped)
		}
		specOpts = append(specOpts, oci.WithUserNamespace(idMaps(base), idMaps(base)))
	}
	if spec.Standby {
		specOpts = append(specOpts, r.withStandbyRoot(spec.ID))
	}
	ph.Done("image")
	c.changes()
	step, cancel = c.mutation()
	defer cancel()
	// Under the create's lease: the remapped parent must not be collected
	// before the container holds it.
	step = leases.WithLease(step, leaseID(work))
	container, err := r.client.NewContainer(step, spec.ID,
		containerd.WithImage(image),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		snapshot,
		containerd.WithContainerLabels(labels),
		r.withRuntime(spec),
		containerd.WithNewSpec(specOpts...),
	)
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("%w: %s", ErrSandboxExists, spec.ID)
		}
		if uerr := unmountRoot(r.rootDir(spec.ID)); uerr != nil {
			return fmt.Errorf("create container %s: %w (%v)", spec.ID, err, uerr)
		}
		// Its own snapshot costs a retry nothing to make again (the
		// costly parts, an unpacked image and a chowned copy, are its
		// parents).
		if rerr := r.removeSnapshot(context.WithoutCancel(ctx), spec.ID); rerr != nil {
			err = fmt.Errorf("%w (%v)", err, rerr)
		}
		return fmt.Errorf("create container %s: %w", spec.ID, err)
	}
	defer func() {
		if retErr != nil {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := r.Delete(cleanup, spec.ID); err != nil {
				retErr = fmt.Errorf("%w (cleanup failed: %v)", retErr, err)
			}
		}
	}()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}

	ph.Done("container")
	if err := lockHostDir(dir, spec.userns(), base); err != nil {
		return err
	}
	// The limit is in place before the task, and so anything in the
	// sandbox, runs.
	if spec.DiskBytes > 0 {
		if err := r.limitDisk(ctx, spec.ID, spec.DiskBytes); err != nil {
			return fmt.Errorf("disk quota of sandbox %s: %w", spec.ID, err)
		}
	}

	// Mounted once the id is known to be this create's: another
	// sandbox's run directory must never be covered. A fresh tmpfs also
	// holds no stale socket of an earlier sandbox of the same id.
	if err := mountRunDir(filepath.Join(dir, "run"), base, base); err != nil {
		return err
	}
	// A restored agent read its secret at its first start (the
	// parent's): the fork wake gives it the child's.
	if restore == nil {
		if err := r.writeSecret(spec.ID, secret, base); err != nil {
			return err
		}
	}
	if err := r.mountVolumes(spec.ID, spec.Owner, spec.Volumes, spec.userns(), base); err != nil {
		return err
	}
	if err := r.createLog(spec.ID); err != nil {
		return err
	}
	if spec.Standby {
		if err := r.prepareStandby(spec.ID, base); err != nil {
			return err
		}
	}
	ph.Done("quota")
	if restore != nil {
		if err := r.restoreChild(ctx, container, spec.ID, restore, ph); err != nil {
			return err
		}
		return ctx.Err()
	}
	group := shimGroup(spec)
	leave, err := r.enterShim(ctx, group)
	if err != nil {
		return err
	}
	if group != "" {
		ph.Done("queue")
	}
	step, cancel = c.mutation()
	defer cancel()
	task, err := container.NewTask(step, cio.LogFile(r.LogPath(spec.ID)))
	leave()
	if err != nil {
		return fmt.Errorf("create task %s: %w", spec.ID, err)
	}
	ph.Done("task")
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	if err := task.Start(step); err != nil {
		return fmt.Errorf("start task %s: %w", spec.ID, err)
	}
	ph.Done("start")
	if spec.Standby {
		if err := r.awaitStandby(step, spec.ID, task.Pid(), base); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// AgentPidsReserve is added to a sandbox's pids limit in its cgroup for the
// agent's own threads (it keeps some in reserve, see agent.ReserveThreads),
// so that the workload gets the pids limit it asked for and a fork bomb
// that exhausts it cannot starve the agent.
const AgentPidsReserve = 32

// AgentCapabilities are the capabilities the sandbox's PID 1 (the agent)
// holds in its bounding, permitted and effective sets: what it needs to
// start processes as the workload user (setuid, setgid, setpcap for locking
// securebits), to signal them, and to act on files for that user. Processes
// the agent starts hold none.
var AgentCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL",
}

// specOpts builds the OCI spec of a sandbox: the image's config with the
// agent as entrypoint (given the workload user, working directory and exec
// settings), the caller's env on top of the image's, and the safe defaults of
// SPEC.md section 6 — a fresh network namespace (containerd's default spec
// creates one with only lo), AgentCapabilities for the agent alone,
// no_new_privs, containerd's default seccomp profile (applied after the
// capabilities, which it reads) and a pids limit — plus the sandbox's cgroup
// mounted read-only.
//
// The agent keeps the OOM score it inherits; it starts every child with the
// highest (1000), so the OOM killer takes a workload process first. A lower
// score for the agent (spec.Process.OOMScoreAdj) is not set: runc needs
// CAP_SYS_RESOURCE to lower a score, and without it container creation fails
// ("can't get final child's PID from pipe"), as on machines whose root lacks
// that capability.
func (r *Runtime) specOpts(image containerd.Image, spec SandboxSpec, dir string) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		withUserDBCheck(image.Name()),
		oci.WithImageConfig(image),
		oci.WithProcessArgs(r.agentArgs(spec)...),
		oci.WithProcessCwd("/"),
		// The agent is root whatever the image's USER says: it switches to
		// the workload user for every process it starts.
		oci.WithUIDGID(0, 0),
		oci.WithHostname(spec.ID),
		oci.WithMounts([]specs.Mount{
			{Destination: AgentPath, Type: "bind", Source: r.cfg.AgentBinary, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			{Destination: RunDir, Type: "bind", Source: filepath.Join(dir, "run"), Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
			// The sandbox's own cgroup, read-only: the agent reads its
			// oom_kill counter to tell an OOM kill from another SIGKILL.
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev"}},
		}),
		// The agent keeps these to act for the workload user; it locks
		// securebits and empties its bounding set at start, so no process
		// it runs holds any (agent.LockCapabilities). Nothing inheritable
		// or ambient.
		oci.WithCapabilities(AgentCapabilities),
		oci.WithAmbientCapabilities(nil),
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
		withQuotaSafeIoctls,
		oci.WithPidsLimit(int64(spec.PidsLimit + AgentPidsReserve)),
		oci.WithDevShmSize(int64((spec.shmBytes() + 1023) / 1024)),
		// Unprivileged ICMP echo sockets for every group, as docker sets
		// it in a container's network namespace: ping works without
		// CAP_NET_RAW, which no sandbox process holds (for pings that use
		// them, like iputils'; busybox's ping needs a raw socket).
		// In a user namespace the range may only hold its own ids (the
		// kernel refuses unmapped ones with EINVAL).
		withSysctl("net.ipv4.ping_group_range", pingGroups(spec)),
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(envList(spec.Env)))
	}
	// Last: whether HOME is in the environment now (the image's config or
	// the sandbox's env set it) decides whether the agent keeps it.
	opts = append(opts, withKeepHome)
	if spec.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(spec.MemoryBytes))
		if swapAccounting() {
			// memory+swap equal to memory: no swap (cgroup v1
			// memory.memsw.limit_in_bytes, v2 memory.swap.max = 0).
			opts = append(opts, oci.WithMemorySwap(int64(spec.MemoryBytes)))
		}
	}
	if spec.OpenFiles > 0 {
		// Soft and hard alike: the agent raises nothing above the hard
		// limit, and no process in the sandbox can.
		opts = append(opts, oci.WithRlimit(&specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: spec.OpenFiles, Hard: spec.OpenFiles}))
	}
	if spec.CPUMillis > 0 {
		const period = 100_000 // µs, the kernel's default CFS period
		opts = append(opts, oci.WithCPUCFS(int64(spec.CPUMillis)*period/1000, period))
	}
	if r.cfg.CPUWeight != CPUWeightOff {
		// Its weight among the sandboxes: 1024 per CPU of its cap
		// (cpuweight.go).
		opts = append(opts, oci.WithCPUShares(cpuShares(spec.CPUMillis)))
	}
	if spec.userns() && spec.Network.NetNS != "" {
		// The network namespace berthd made belongs to the host's user
		// namespace: the sandbox may neither mount sysfs nor write its
		// net sysctls.
		opts = append(opts, withSysBind, withoutNetSysctls)
	}
	return append(opts, spec.Network.specOpts()...)
}

// agentArgs is the agent's command line.
func (r *Runtime) agentArgs(spec SandboxSpec) []string {
	args := []string{AgentPath, "--socket", RunDir + "/" + socketName, "--secret-file", RunDir + "/" + agentproof.SecretFile,
		"--user", fmt.Sprintf("%d:%d", spec.UID, spec.GID), "--workdir", spec.workDir(),
		"--login-env", "--name-host"}
	if spec.Standby {
		args = append(args, "--standby-wait", RunDir+"/"+standbyFIFO)
	}
	if r.cfg.ExecHeartbeat > 0 {
		args = append(args, "--heartbeat-interval", r.cfg.ExecHeartbeat.String())
	}
	if r.cfg.ExecRetention > 0 {
		args = append(args, "--retention", r.cfg.ExecRetention.String())
	}
	if r.cfg.ExecRingBytes > 0 {
		args = append(args, "--ring-bytes", strconv.FormatUint(r.cfg.ExecRingBytes, 10))
	}
	if r.cfg.ExecRetainedBytes > 0 {
		args = append(args, "--retained-bytes", strconv.FormatUint(r.cfg.ExecRetainedBytes, 10))
	}
	if r.cfg.WorkloadNofile > 0 {
		args = append(args, "--workload-nofile", strconv.FormatUint(r.cfg.WorkloadNofile, 10))
	}
	if r.cfg.TraceAgents {
		args = append(args, "--trace")
	}
	if spec.DiskBytes > 0 {
		args = append(args, "--disk-bytes", strconv.FormatUint(spec.DiskBytes, 10))
	}
	return args
}

// DefaultShmBytes is the size of a sandbox's /dev/shm when its spec asks
// for none: docker's default.
const DefaultShmBytes = 64 << 20

func (s SandboxSpec) shmBytes() uint64 {
	if s.ShmBytes == 0 {
		return DefaultShmBytes
	}
	return s.ShmBytes
}

// withSysctl sets a namespaced kernel parameter of the sandbox.
func withSysctl(key, value string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		s.Linux.Sysctl[key] = value
		return nil
	}
}

// withKeepHome passes --keep-home to the agent when the process
// environment sets HOME: the agent then keeps it instead of taking the
// workload user's home from /etc/passwd (runc sets HOME only when it is
// missing, for the agent's own user).
func withKeepHome(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process == nil {
		return nil
	}
	for _, kv := range s.Process.Env {
		if strings.HasPrefix(kv, "HOME=") {
			s.Process.Args = append(s.Process.Args, "--keep-home")
			return nil
		}
	}
	return nil
}

// swapAccounting reports whether the kernel accounts swap per cgroup: runc
// refuses a swap limit otherwise. cgroup v2 always does.
func swapAccounting() bool {
	for _, p := range []string{"/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// WaitExit returns a channel that receives the task's exit once it exits,
// so callers waiting for the agent can stop early when the task dies.
func (r *Runtime) WaitExit(ctx context.Context, id string) (_ <-chan containerd.ExitStatus, err error) {
	c := r.begin(ctx, "watch the task of sandbox "+id)
	defer c.end(&err)
	step, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(step, id)
	if err != nil {
		return nil, r.containerError(id, err)
	}
	task, err := container.Task(step, nil)
	if err != nil {
		return nil, fmt.Errorf("load task %s: %w", id, err)
	}
	// The wait lasts until the exit: the caller's context bounds it.
	return task.Wait(ctx)
}

// Get returns the sandbox with id, or ErrSandboxNotFound.
func (r *Runtime) Get(ctx context.Context, id string) (_ Sandbox, err error) {
	c := r.begin(ctx, "read sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return Sandbox{}, r.containerError(id, err)
	}
	info, err := container.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Sandbox{}, r.containerError(id, err)
	}
	if info.Labels[labelSandbox] != "true" {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
	}
	return r.sandbox(ctx, container, info.Labels)
}

// List returns every sandbox whose labels include all of selector, ordered
// by id.
// Concurrent listings with one selector share containerd's answers
// (coalescer): each still sees the sandboxes of a moment after it asked.
// The result is shared: callers must not change it.
func (r *Runtime) List(ctx context.Context, selector map[string]string) ([]Sandbox, error) {
	keys := slices.Sorted(maps.Keys(selector))
	filter := fmt.Sprintf("labels.%q==true", labelSandbox)
	for _, k := range keys {
		filter += fmt.Sprintf(",labels.%q==%q", k, selector[k])
	}
	return r.lists.do(ctx, filter, func(ctx context.Context) ([]Sandbox, error) { return r.list(ctx, filter) })
}

// list reads the sandboxes whose containers match containerd filter.
func (r *Runtime) list(ctx context.Context, filter string) (_ []Sandbox, err error) {
	c := r.begin(ctx, "list sandboxes")
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	// Two requests, whatever the count: the containers with their labels,
	// and every task of the namespace (one request per sandbox made a
	// thousand concurrent listings of 18 sandboxes 55,000 requests).
	containers, err := r.client.ContainerService().List(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	ts, err := r.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	byID := make(map[string]*tasktypes.Process, len(ts.GetTasks()))
	for _, t := range ts.GetTasks() {
		byID[t.GetID()] = t // a task's id is its container's
	}
	out := make([]Sandbox, 0, len(containers))
	for _, c := range containers {
		sb := r.sandboxOf(c.ID, c.Labels)
		if t := byID[c.ID]; t != nil {
			r.setTask(&sb, t)
		}
		out = append(out, sb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// sandbox builds a Sandbox from a container and its labels, asking
// containerd for the task's state (one request: its pid and status). A
// container without a task is a stopped sandbox; containerd not answering
// about the task is an error.
func (r *Runtime) sandbox(ctx context.Context, c containerd.Container, labels map[string]string) (Sandbox, error) {
	sb := r.sandboxOf(c.ID(), labels)
	t, err := r.task(ctx, c.ID())
	switch {
	case errdefs.IsNotFound(err):
		return sb, nil
	case err != nil:
		return Sandbox{}, fmt.Errorf("load task %s: %w", c.ID(), err)
	}
	r.setTask(&sb, t)
	return sb, nil
}

// task returns the process of sandbox id's task, its pid and status, as
// containerd's task service tells them in one request (the client's
// Container.Task and Task.Status make one each). Errors: containerd's,
// NOT_FOUND (errdefs) when there is no task.
func (r *Runtime) task(ctx context.Context, id string) (*tasktypes.Process, error) {
	resp, err := r.client.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
	if err != nil {
		return nil, errgrpc.ToNative(err)
	}
	return resp.GetProcess(), nil
}

// setTask sets the task fields of sb from its task's process t, as
// Sandbox.setTask, and reads a task containerd holds running as paused
// when its cgroup's freezer is frozen (a runc task berthd paused:
// freezer.go).
func (r *Runtime) setTask(sb *Sandbox, t *tasktypes.Process) {
	sb.setTask(t)
	if sb.Running && r.frozenByFreezer(sb.ID, sb.TaskPID) {
		sb.Running, sb.Paused = false, true
	}
}

// setTask sets the task fields of sb from its task's process t.
func (sb *Sandbox) setTask(t *tasktypes.Process) {
	sb.TaskPID = t.GetPid()
	sb.Running = t.GetStatus() == tasktypes.Status_RUNNING
	sb.Paused = t.GetStatus() == tasktypes.Status_PAUSED || t.GetStatus() == tasktypes.Status_PAUSING
	sb.Hibernated = sb.Hibernated && !sb.Running && !sb.Paused
}

// sandboxOf builds the Sandbox of container id from its labels, without
// its task's state.
func (r *Runtime) sandboxOf(id string, labels map[string]string) Sandbox {
	sb := recordFromLabels(id, labels)
	sb.SocketPath = r.SocketPath(id)
	return sb
}

// recordFromLabels builds the Sandbox of container id from its labels.
func recordFromLabels(id string, labels map[string]string) Sandbox {
	sb := Sandbox{
		ID:     id,
		Image:  labels[labelImage],
		Labels: make(map[string]string),
	}
	for k, v := range labels {
		if !strings.HasPrefix(k, LabelPrefix) && !strings.HasPrefix(k, ContainerdLabelPrefix) {
			sb.Labels[k] = v
		}
	}
	sb.CreatedAt, _ = time.Parse(time.RFC3339Nano, labels[labelCreatedAt])
	sb.PidsLimit, _ = strconv.ParseUint(labels[labelPidsLimit], 10, 64)
	sb.CPUMillis, _ = strconv.ParseUint(labels[labelCPUMillis], 10, 64)
	sb.MemoryBytes, _ = strconv.ParseUint(labels[labelMemory], 10, 64)
	sb.OpenFiles, _ = strconv.ParseUint(labels[labelOpenFiles], 10, 64)
	sb.HostUsers = labels[labelHostUsers] == "true"
	sb.Runtime = labels[labelRuntime]
	if sb.Runtime == "" {
		sb.Runtime = RuntimeRunc
	}
	if b, err := strconv.ParseUint(labels[labelIDBase], 10, 32); err == nil {
		sb.IDBase = uint32(b)
		sb.RootFS = labels[labelRootFS]
		if sb.RootFS == "" {
			sb.RootFS = RootFSChowned // made before berthd recorded it
		}
	}
	sb.DiskBytes, _ = strconv.ParseUint(labels[labelDisk], 10, 64)
	// A label that is not berthd's writing counts as no pinning, as in
	// allocCPUs.
	if cpus, err := cpuset.Parse(labels[labelCPUSet]); err == nil {
		sb.CPUSet = cpus.String()
	}
	sb.decodeLabels(labels)
	return sb
}

// Delete kills the sandbox's task and removes the task, the container, its
// snapshot and its host directory. Deleting a missing sandbox succeeds.
func (r *Runtime) Delete(ctx context.Context, id string) (err error) {
	c := r.begin(ctx, "delete sandbox "+id)
	defer c.end(&err)
	defer r.reweighAfter(ctx)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return r.removeHostDir(id)
		}
		return fmt.Errorf("load container %s: %w", id, err)
	}
	c.changes()
	// A forked sandbox's snapshot rests on the fork's copy, which goes
	// with the last sandbox resting on it.
	parent := r.snapshotParentOf(ctx, id)
	// A create of the container still under way may start its task
	// between the two deletes (containerd then refuses the container's
	// delete as FAILED_PRECONDITION): delete that task too.
	for attempt := 0; ; attempt++ {
		if err := r.deleteTask(ctx, container); err != nil {
			return err
		}
		// An idmapped root is unmounted before its snapshot goes: btrfs
		// refuses to delete a mounted subvolume (EBUSY).
		if err := unmountRoot(r.rootDir(id)); err != nil {
			return err
		}
		// The sandbox's snapshot goes before its container: an idmapped
		// root's is held only by the container's gc.ref label, and
		// containerd's garbage collector, which a container's delete
		// may start before the removal below, deletes a snapshot
		// without clearing it from its parent's children (containerd's
		// metadata/gc.go remove): a stored snapshot the sandbox was made
		// from could then never be deleted ("cannot remove snapshot with
		// child" while containerd lists none; TestFleetSnapshots in CI,
		// TestSnapshotPointInTime once). A removal by the snapshotter
		// service clears it.
		if err := r.removeSnapshot(ctx, id); err != nil {
			return err
		}
		err := container.Delete(ctx, containerd.WithSnapshotCleanup)
		if err == nil || errdefs.IsNotFound(err) {
			break
		}
		if !errdefs.IsFailedPrecondition(err) || attempt == 3 {
			return fmt.Errorf("delete container %s: %w", id, err)
		}
	}
	if err := r.removeHostDir(id); err != nil {
		return err
	}
	return r.reclaimForks(ctx, parent)
}

// withInitKill is containerd's WithProcessKill for a gVisor task: SIGKILL
// to the task's init alone (the agent, PID 1 of the sandbox's only
// container), whose end ends the sentry and every process in it, then
// the wait for its exit. containerd's sends SIGKILL to every process of
// the container (`runsc kill --all`), which runsc finds by the container
// id they were started under: in a fork's child restored from its
// parent's memory that is the parent's, so it would kill none and the
// delete would wait for ever (TestGVisorForkMemory). A task with
// nothing to kill — stopped, or created with no process (a restore whose
// runsc failed or was killed: its init never ran, and no exit would ever
// come) — is left to the delete (TestForkMemoryRestoreKilled).
func withInitKill(ctx context.Context, p containerd.Process) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := p.Status(ctx)
	switch {
	case errdefs.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case st.Status == containerd.Stopped, st.Status == containerd.Created && p.Pid() == 0:
		return nil
	}
	exited, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if err := p.Kill(ctx, syscall.SIGKILL); err != nil {
		switch {
		case errdefs.IsFailedPrecondition(err):
			return nil // exited already
		case !errdefs.IsNotFound(err):
			return err
		}
		// NotFound may come with the kill done: wait for the exit.
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-exited:
		return nil
	}
}

// deleteTask kills and deletes the container's task, if any. A task whose
// start is under way when the delete comes can lose its shim during the
// delete ("ttrpc: closed"): the delete is tried again, a few times, until
// containerd no longer has the task.
func (r *Runtime) deleteTask(ctx context.Context, container containerd.Container) error {
	kill := containerd.WithProcessKill
	if labels, err := container.Labels(ctx); err == nil && labels[labelRuntime] == RuntimeGVisor {
		kill = withInitKill
	}
	var err error
	for attempt := range 4 {
		var task containerd.Task
		task, err = container.Task(ctx, nil)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err == nil {
			r.thawForDelete(ctx, task)
		}
		if err != nil {
			err = fmt.Errorf("load task %s: %w", container.ID(), err)
		} else if _, err = task.Delete(ctx, kill); err == nil || errdefs.IsNotFound(err) {
			return nil
		} else {
			err = fmt.Errorf("delete task %s: %w", container.ID(), err)
			if ferr := r.forceDeleteGVisor(ctx, container); ferr != nil {
				err = fmt.Errorf("%w (%v)", err, ferr)
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
	}
	return err
}

// lockHostDir gives sandbox directory dir the owner and mode that let
// only root and the sandbox's own root pass (when it has a user namespace
// of its own, at host id base: runc resolves the root and the run
// directory as that id): 0710 root:base, as containerd's bundle
// directories are. No other host id, another sandbox's included, reaches
// the sandbox's root, run directory or log. It is done once the id is
// known to be this create's (another sandbox of the id keeps its own).
func lockHostDir(dir string, userns bool, base uint32) error {
	gid, mode := 0, os.FileMode(0o700)
	if userns {
		gid, mode = int(base), 0o710
	}
	if err := os.Chown(dir, 0, gid); err != nil {
		return fmt.Errorf("sandbox directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("sandbox directory %s: %w", dir, err)
	}
	return nil
}

// removeSnapshot removes the snapshot of key id, if there is one.
func (r *Runtime) removeSnapshot(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallBudget)
	defer cancel()
	if err := r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", id, err)
	}
	return nil
}

func (r *Runtime) removeHostDir(id string) error {
	r.secrets.drop(id)
	r.standbys.drop(id)
	run := filepath.Join(r.hostDir(id), "run")
	// A create of the same id racing this delete may mount the run
	// directory's tmpfs between the unmount and the removal: unmount again.
	var err error
	for range 3 {
		if err = unmountRunDir(run); err != nil {
			return err
		}
		if err = unmountRoot(r.rootDir(id)); err != nil {
			return err
		}
		if err = unmountRoot(r.standbyRoot(id)); err != nil {
			return err
		}
		if err = r.unmountVolumes(id); err != nil {
			return err
		}
		if err = os.RemoveAll(r.hostDir(id)); !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("remove sandbox directory: %w", err)
	}
	return nil
}

// Kill sends signal to the sandbox's task (its PID 1, the agent).
func (r *Runtime) Kill(ctx context.Context, id string, signal syscall.Signal) (err error) {
	c := r.begin(ctx, "signal the task of sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	c.changes()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return r.containerError(id, err)
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	return task.Kill(ctx, signal)
}

func (r *Runtime) containerError(id string, err error) error {
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
	}
	return fmt.Errorf("load container %s: %w", id, err)
}
