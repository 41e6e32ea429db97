package sandboxsvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"github.com/berth-sandbox/berth/server/validate"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/textsafe"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Bounds of the create request beyond Config's.
const (
	maxEnvEntries   = 1024
	maxEnvBytes     = 256 << 10 // keys and values together
	maxRequestIDLen = 128
	minTimeout      = time.Second
)

// CreateSandbox creates a sandbox, or returns the existing one of the same
// id and spec (waiting while it starts). Concurrent requests for one id
// share one creation, which runs on even when its callers go away, so that
// a retry finds its result. A request without sandbox_id and request_id
// whose spec is the pool's default takes a warm-pool member when one is
// ready. A sandbox whose agent does not answer within
// Config.AgentReadyTimeout, or whose task exits first, is removed and
// reported as UNAVAILABLE with the tail of the agent's log.
//
// The sandbox records the caller as its owner. Sandbox ids are one
// namespace for all principals: a caller-chosen id that another principal's
// sandbox holds is ALREADY_EXISTS (takenError) without a word about that
// sandbox. Ids derived from request_id include the caller, so two
// principals' idempotency keys never collide.
func (s *Service) CreateSandbox(ctx context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if snapID := req.GetFromSnapshot(); runtime.ValidSnapshotID(snapID) && req.GetImage() == "" {
		// The snapshot's image, when the caller names none.
		snap, err := s.life.GetSnapshot(ctx, snapID, p)
		if err != nil {
			return nil, apierr.WithMeta(err, map[string]string{"snapshot_id": snapID})
		}
		req = proto.CloneOf(req)
		req.Image = snap.Image
	}
	spec, err := s.sandboxSpec(req, p.Name)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"sandbox_id": spec.ID}
	if spec.FromSnapshot != "" {
		meta["snapshot_id"] = spec.FromSnapshot
		snap, err := s.life.GetSnapshot(ctx, spec.FromSnapshot, p)
		if err != nil {
			return nil, apierr.WithMeta(err, meta)
		}
		// The snapshot's image may have been deleted since: IMAGE_NOT_FOUND
		// (pull it again), not a wrong request.
		if _, err := s.rt.ResolveImage(ctx, snap.Image, imageViewer(p)); err != nil {
			return nil, apierr.WithMeta(fmt.Errorf("snapshot %s's image: %w", snap.ID, err), meta)
		}
		if name, err := s.rt.ResolveImage(ctx, spec.Image, imageViewer(p)); err != nil || name != snap.Image {
			return nil, apierr.InvalidArgument("image", fmt.Sprintf("%s is not snapshot %s's image %s: a sandbox created from a snapshot runs the snapshot's image (leave image empty)", spec.Image, snap.ID, snap.Image))
		}
	}
	// "berth.dev/base" means "berth.dev/base:latest", as for docker. An
	// image not stored keeps its name: an existing sandbox of the same
	// spec is still returned, a new one fails with IMAGE_NOT_FOUND.
	// Another principal's private image is IMAGE_NOT_FOUND now: the
	// runtime, which does not know the caller, would run it.
	switch name, err := s.rt.ResolveImage(ctx, spec.Image, imageViewer(p)); {
	case err == nil:
		spec.Image = name
	case errors.Is(err, runtime.ErrImageHidden):
		return nil, apierr.WithMeta(err, meta)
	case !errors.Is(err, runtime.ErrImageNotFound):
		return nil, apierr.WithMeta(err, meta)
	}
	if namedUser(req.GetUser()) {
		if err := s.resolveUser(ctx, &spec, req.GetUser()); err != nil {
			return nil, apierr.WithMeta(err, meta)
		}
	}
	c, err := s.life.Create(ctx, spec, p, req.GetSandboxId() == "" && req.GetRequestId() == "")
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	return &berthv1.CreateSandboxResponse{Sandbox: s.Describe(c.Sandbox, c.Info, nil), FromWarmPool: c.FromPool}, nil
}

// sandboxSpec validates req and returns the spec it asks for, owned by
// owner, with the server's defaults filled in and the id chosen: the
// caller's, derived from owner and request_id, or minted.
func (s *Service) sandboxSpec(req *berthv1.CreateSandboxRequest, owner string) (runtime.SandboxSpec, error) {
	spec := runtime.SandboxSpec{ID: req.GetSandboxId(), Image: req.GetImage(), Labels: req.GetLabels(), Env: req.GetEnv(), Owner: owner}
	// request_id is checked even beside a sandbox_id, which makes it
	// unused: what is refused does not depend on what else is set.
	if err := validateRequestID("request_id", req.GetRequestId()); err != nil {
		return spec, err
	}
	switch {
	case spec.ID != "":
		if err := validate.SandboxID("sandbox_id", spec.ID); err != nil {
			return spec, err
		}
	case req.GetRequestId() != "":
		spec.ID = sandboxid.FromRequest(owner, req.GetRequestId())
	default:
		spec.ID = sandboxid.New("sb-", 10)
	}
	// from_snapshot first: a malformed one fills no image, which would
	// otherwise be refused as empty, naming the wrong field.
	if snapID := req.GetFromSnapshot(); snapID != "" {
		if !runtime.ValidSnapshotID(snapID) {
			return spec, apierr.InvalidArgument("from_snapshot", fmt.Sprintf("%s is not a snapshot id (snap- and 20 lowercase hex digits)", textsafe.Quote(snapID)))
		}
		spec.FromSnapshot = snapID
	}
	if err := validate.ImageRef("image", spec.Image); err != nil {
		return spec, err
	}
	vols, verr := volumeMounts(req.GetVolumes())
	if verr != nil {
		return spec, verr
	}
	spec.Volumes = vols
	if err := validate.Labels("labels", spec.Labels); err != nil {
		return spec, err
	}
	if err := validateEnv("env", spec.Env); err != nil {
		return spec, err
	}

	res := req.GetResources()
	if err := s.resources(&spec, res); err != nil {
		return spec, err
	}
	// shm_bytes is bounded before it is rounded up to whole KiB, which
	// would otherwise wrap a value near 2^64 to zero, the default.
	switch shm := res.GetShmBytes(); {
	case shm == 0:
		spec.ShmBytes = lifecycle.DefaultShm(spec.MemoryBytes)
	case spec.MemoryBytes > 0 && (spec.MemoryBytes < shmMemoryReserve || shm > spec.MemoryBytes-shmMemoryReserve):
		return spec, apierr.InvalidArgument("resources.shm_bytes", fmt.Sprintf("%d leaves less than %d of memory_bytes %d outside /dev/shm: its pages count against the memory limit, and a full /dev/shm would leave the OOM killer only the agent and the workload's processes to take", shm, shmMemoryReserve, spec.MemoryBytes))
	case shm > min(s.cfg.MaxMemoryBytes, maxShmBytes):
		return spec, apierr.InvalidArgument("resources.shm_bytes", fmt.Sprintf("%d exceeds the server's maximum memory cap of %d: /dev/shm pages are memory", shm, min(s.cfg.MaxMemoryBytes, maxShmBytes)))
	case shm < lifecycle.MinShmBytes:
		return spec, bounds.Uint("resources.shm_bytes", shm, lifecycle.MinShmBytes, 0, "bytes", minShmWhy)
	default:
		spec.ShmBytes = (shm + 1023) / 1024 * 1024
	}

	var err error
	if spec.DiskBytes, err = s.diskBytes(res.GetDiskBytes()); err != nil {
		return spec, err
	}
	// A name is resolved against the image once it is found
	// (resolveUser); ids are checked here.
	if !namedUser(req.GetUser()) {
		if spec.UID, spec.GID, err = parseUser("user", req.GetUser()); err != nil {
			return spec, err
		}
	} else if err := validateUserName("user", req.GetUser()); err != nil {
		return spec, err
	}
	if err := s.isolation(&spec, req); err != nil {
		return spec, err
	}
	if spec.WorkDir, err = validateWorkDir("workdir", req.GetWorkdir()); err != nil {
		return spec, err
	}
	if spec.IdleTimeout, err = boundedDuration("idle_timeout", req.GetIdleTimeout(), s.cfg.DefaultIdleTimeout, s.cfg.MaxIdleTimeout); err != nil {
		return spec, err
	}
	if spec.MaxLifetime, err = boundedDuration("max_lifetime", req.GetMaxLifetime(), s.cfg.DefaultMaxLifetime, s.cfg.MaxLifetime); err != nil {
		return spec, err
	}
	if spec.Network, err = s.networkSpec(req.GetNetwork()); err != nil {
		return spec, err
	}
	switch req.GetIdleAction() {
	case berthv1.IdleAction_IDLE_ACTION_UNSPECIFIED, berthv1.IdleAction_IDLE_ACTION_DELETE:
		spec.IdleAction = runtime.IdleDelete
	case berthv1.IdleAction_IDLE_ACTION_PAUSE:
		spec.IdleAction = runtime.IdlePause
	case berthv1.IdleAction_IDLE_ACTION_HIBERNATE:
		spec.IdleAction = runtime.IdleHibernate
	default:
		return spec, apierr.InvalidArgument("idle_action", fmt.Sprintf("%d is not an IdleAction", req.GetIdleAction()))
	}
	return spec, nil
}

// resources fills spec's limits from res, the server's defaults standing in
// for zero fields, and checks them against the server's maximums.
func (s *Service) resources(spec *runtime.SandboxSpec, res *berthv1.Resources) error {
	spec.PidsLimit, spec.CPUMillis, spec.MemoryBytes = res.GetPidsLimit(), res.GetCpuMillis(), res.GetMemoryBytes()
	spec.OpenFiles = res.GetOpenFilesLimit()
	s.defaultResources(spec)
	if spec.PidsLimit > s.cfg.MaxPidsLimit {
		return apierr.InvalidArgument("resources.pids_limit", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.PidsLimit, s.cfg.MaxPidsLimit))
	}
	if spec.CPUMillis > s.cfg.MaxCPUMillis {
		return apierr.InvalidArgument("resources.cpu_millis", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.CPUMillis, s.cfg.MaxCPUMillis))
	}
	if spec.PidsLimit > 0 {
		if err := bounds.Uint("resources.pids_limit", spec.PidsLimit, minPidsLimit, 0, "pids", minPidsWhy); err != nil {
			return err
		}
	}
	if spec.CPUMillis > 0 {
		if err := bounds.Uint("resources.cpu_millis", spec.CPUMillis, minCPUMillis, 0, "millicpus", minCPUWhy); err != nil {
			return err
		}
	}
	if max := s.cfg.MaxMemoryBytes; max > 0 && spec.MemoryBytes > max {
		return apierr.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.MemoryBytes, max))
	}
	if m := spec.MemoryBytes; m > 0 && m < minMemoryBytes {
		return apierr.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d is below the minimum of %d (4 MiB)", m, minMemoryBytes))
	}
	if spec.OpenFiles > s.cfg.MaxOpenFiles {
		return apierr.InvalidArgument("resources.open_files_limit", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.OpenFiles, s.cfg.MaxOpenFiles))
	}
	if spec.OpenFiles < minOpenFiles {
		return apierr.InvalidArgument("resources.open_files_limit", fmt.Sprintf("%d is below the minimum of %d", spec.OpenFiles, minOpenFiles))
	}
	// Every process may hold OpenFiles descriptors, each its own open file
	// at worst: PidsLimit × OpenFiles bounds what the sandbox can take from
	// the host's file table (fs.file-max).
	if max := s.cfg.MaxSandboxOpenFiles; spec.PidsLimit > max || spec.OpenFiles > max/spec.PidsLimit {
		worst := spec.PidsLimit * spec.OpenFiles // for the message
		field := "resources.open_files_limit"
		if res.GetOpenFilesLimit() == 0 {
			field = "resources.pids_limit"
		}
		return apierr.InvalidArgument(field, fmt.Sprintf("pids_limit %d × open_files_limit %d may hold %d open files; the server's maximum per sandbox is %d: lower either",
			spec.PidsLimit, spec.OpenFiles, worst, s.cfg.MaxSandboxOpenFiles))
	}
	return nil
}

// isolation fills spec's runtime and user namespace from req and checks
// them against what the server allows.
func (s *Service) isolation(spec *runtime.SandboxSpec, req *berthv1.CreateSandboxRequest) error {
	spec.HostUsers = req.GetHostUsers()
	switch spec.Runtime = req.GetRuntime(); spec.Runtime {
	case "", runtime.RuntimeRunc:
		spec.Runtime = runtime.RuntimeRunc
	case runtime.RuntimeGVisor:
		if !s.rt.GVisorEnabled() {
			return apierr.InvalidArgument("runtime", `"gvisor" is not enabled on this server (berthd --gvisor-binary)`)
		}
		// gVisor's sentry runs as an unprivileged host user in a user
		// namespace of its own: host_users changes nothing there.
		spec.HostUsers = false
	default:
		return apierr.InvalidArgument("runtime", fmt.Sprintf("%q must be %q or %q", spec.Runtime, runtime.RuntimeRunc, runtime.RuntimeGVisor))
	}
	if spec.HostUsers && !s.cfg.AllowHostUsers {
		return apierr.InvalidArgument("host_users", "this server runs every sandbox in a user namespace of its own (berthd --allow-host-users permits the host's)")
	}
	return userInRange(*spec, "")
}

// userInRange checks that a runc sandbox in a user namespace of its own
// runs as ids the namespace maps; name is the user name they came from,
// if any.
func userInRange(spec runtime.SandboxSpec, name string) error {
	if !spec.HostUsers && spec.Runtime == runtime.RuntimeRunc && (spec.UID >= runtime.IDRangeSize || spec.GID >= runtime.IDRangeSize) {
		if name != "" {
			name = textsafe.Quote(name) + " is "
		}
		return apierr.InvalidArgument("user", fmt.Sprintf("%s%d:%d: ids in a sandbox's user namespace are 0 to %d", name, spec.UID, spec.GID, runtime.IDRangeSize-1))
	}
	return nil
}

// minOpenFiles is the smallest RLIMIT_NOFILE accepted: the agent needs
// descriptors of its own for its socket, pipes and files.
const minOpenFiles = 64

// networkSpec validates a request's network: NONE (the default) takes no
// allow-list; EGRESS needs the server's network and a valid allow-list,
// which comes back normalized (package network).
func (s *Service) networkSpec(np *berthv1.NetworkPolicy) (runtime.NetworkSpec, error) {
	switch np.GetMode() {
	case berthv1.NetworkMode_NETWORK_MODE_UNSPECIFIED, berthv1.NetworkMode_NETWORK_MODE_NONE:
		if len(np.GetAllow()) > 0 {
			return runtime.NetworkSpec{}, apierr.InvalidArgument("network.allow", "is only for network mode NETWORK_MODE_EGRESS; a sandbox of mode NONE reaches nothing")
		}
		if np.GetMaxConnections() > 0 {
			return runtime.NetworkSpec{}, apierr.InvalidArgument("network.max_connections", "is only for network mode NETWORK_MODE_EGRESS")
		}
		if np.GetEgressBytesPerSecond() > 0 || np.GetIngressBytesPerSecond() > 0 {
			return runtime.NetworkSpec{}, apierr.InvalidArgument("network.egress_bytes_per_second", "bandwidth caps are only for network mode NETWORK_MODE_EGRESS")
		}
		return runtime.NetworkSpec{}, nil
	case berthv1.NetworkMode_NETWORK_MODE_EGRESS:
	default:
		return runtime.NetworkSpec{}, apierr.InvalidArgument("network.mode", fmt.Sprintf("%d is not a network mode (NONE or EGRESS)", np.GetMode()))
	}
	net, why := s.life.Network()
	if net == nil {
		if why == "" {
			why = "berthd runs without one"
		}
		return runtime.NetworkSpec{}, apierr.New(codes.FailedPrecondition, rpcstatus.ReasonNetworkUnavailable,
			"network.mode: EGRESS needs berthd's sandbox network, which is unavailable: "+why, map[string]string{"field": "network.mode"})
	}
	p, err := network.ParsePolicy("network.allow", np.GetAllow(), np.GetMaxConnections(), net.Subnet())
	if err != nil {
		var fe *network.FieldError
		if errors.As(err, &fe) {
			return runtime.NetworkSpec{}, apierr.InvalidArgument(fe.Field, fe.Err.Error())
		}
		return runtime.NetworkSpec{}, apierr.InvalidArgument("network.allow", err.Error())
	}
	for _, rate := range []struct {
		field string
		v     uint64
	}{{"network.egress_bytes_per_second", np.GetEgressBytesPerSecond()}, {"network.ingress_bytes_per_second", np.GetIngressBytesPerSecond()}} {
		if rate.v > network.MaxBytesPerSecond {
			return runtime.NetworkSpec{}, apierr.InvalidArgument(rate.field, fmt.Sprintf("%d exceeds the maximum of %d", rate.v, uint64(network.MaxBytesPerSecond)))
		}
	}
	spec := runtime.NetworkSpec{Egress: true, Allow: p.Entries(), MaxConnections: p.MaxConnections,
		EgressBytesPerSecond: np.GetEgressBytesPerSecond(), IngressBytesPerSecond: np.GetIngressBytesPerSecond()}
	if n := len(runtime.AllowJSON(spec.Allow)); n > runtime.MaxNetworkAllowLabelBytes {
		return runtime.NetworkSpec{}, apierr.InvalidArgument("network.allow", fmt.Sprintf("takes %d bytes as JSON; the limit is %d", n, runtime.MaxNetworkAllowLabelBytes))
	}
	return spec, nil
}

func validateRequestID(field, id string) error {
	if len(id) > maxRequestIDLen {
		return apierr.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d", len(id), maxRequestIDLen))
	}
	for i := 0; i < len(id); i++ {
		if r := id[i]; r < 0x21 || r > 0x7e {
			return apierr.InvalidArgument(field, "must be printable ASCII without spaces")
		}
	}
	return nil
}

// minDiskBytes is the smallest disk quota accepted: btrfs copies a few
// 16 KiB metadata blocks on a snapshot's first writes, and the agent
// creates the working directory.
const minDiskBytes = 1 << 20

// maxDiskBytes bounds any disk quota: the largest file offset (loff_t,
// 2^63-1 bytes), so no file system holds more and btrfs's quota limits,
// which read back (u64)-1 as "none", never see it.
const maxDiskBytes = math.MaxInt64

// Floors of a sandbox's limits below which it exists but cannot run a
// shell pipeline, or the kernel refuses it (measured with berth.dev/base,
// docs/default-limits.md; TestLimitsSandboxAtFloorsRuns runs at all of
// them).
const (
	// minPidsLimit is the smallest pids_limit, the workload's share of
	// the pids cgroup: `sh -c 'ls / | grep -c . | wc -l'` runs 4
	// processes at once. Below it a workload lives on what the agent's
	// thread reserve (runtime.AgentPidsReserve) leaves unused, which is
	// not its to count on.
	minPidsLimit = 8
	minPidsWhy   = "a shell running a pipeline needs that many processes at once"
	// minCPUMillis is the smallest cpu_millis: 1 ms of CPU per 100 ms
	// CFS period, the kernel's smallest quota (cpu.max); below it the
	// task does not start. At 10 that pipeline takes about 5 s.
	minCPUMillis = 10
	minCPUWhy    = "the kernel's smallest CFS quota is 1 ms per 100 ms period"
	// minShmBytes (lifecycle.MinShmBytes) is the smallest /dev/shm: a
	// semaphore or a small shared buffer (32 KiB) must fit.
	minShmWhy = "/dev/shm must hold a few pages for semaphores and shared buffers"
	// shmMemoryReserve is how much of a sandbox's memory limit /dev/shm
	// always leaves to processes: tmpfs pages are charged to the sandbox
	// and cannot be reclaimed by killing, so a full /dev/shm as large as
	// the limit left the agent the only thing the OOM killer could take.
	shmMemoryReserve = 32 << 20
)

// diskBytes returns the disk quota for a request's resources.disk_bytes:
// the server's default for zero. A quota on a server that cannot enforce
// one is FAILED_PRECONDITION DISK_QUOTA_UNSUPPORTED, never ignored.
func (s *Service) diskBytes(req uint64) (uint64, error) {
	const field = "resources.disk_bytes"
	if req == 0 {
		return s.cfg.DefaultDiskBytes, nil
	}
	// The bounds come first: a value no server could take is refused the
	// same way on every server.
	if err := bounds.Uint(field, req, minDiskBytes, maxDiskBytes, "bytes", "btrfs copies metadata blocks on a snapshot's first writes"); err != nil {
		return 0, err
	}
	if err := s.rt.DiskQuota(); err != nil {
		return 0, apierr.New(codes.FailedPrecondition, rpcstatus.ReasonDiskQuotaUnsupported,
			fmt.Sprintf("%s: this server cannot enforce disk quotas: %v", field, err), map[string]string{"field": field})
	}
	if max := s.cfg.MaxDiskBytes; max > 0 && req > max {
		return 0, apierr.InvalidArgument(field, fmt.Sprintf("%d exceeds the server's maximum of %d", req, max))
	}
	return req, nil
}

func validateEnv(field string, env map[string]string) error {
	if len(env) > maxEnvEntries {
		return apierr.InvalidArgument(field, fmt.Sprintf("has %d entries; the limit is %d", len(env), maxEnvEntries))
	}
	total := 0
	for k, v := range env {
		if err := validate.EnvText.String(field, k); err != nil {
			return err
		}
		if err := validate.EnvText.String(field, v); err != nil {
			return err
		}
		switch {
		case k == "":
			return apierr.InvalidArgument(field, "a key is empty")
		case strings.ContainsAny(k, "=\x00"):
			return apierr.InvalidArgument(field, fmt.Sprintf("key %s contains '=' or NUL", textsafe.Quote(k)))
		case strings.ContainsRune(v, 0):
			// The value is never echoed: it may be a secret.
			return apierr.InvalidArgument(field, fmt.Sprintf("the value of %s contains NUL", textsafe.Quote(k)))
		}
		total += len(k) + len(v) + 2
	}
	if total > maxEnvBytes {
		return apierr.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d", total, maxEnvBytes))
	}
	if n := len(runtime.EnvKeysJSON(env)); len(env) > 0 && n > runtime.MaxEnvKeysLabelBytes {
		return apierr.InvalidArgument(field, fmt.Sprintf("its key names take %d bytes as JSON; the limit is %d", n, runtime.MaxEnvKeysLabelBytes))
	}
	return nil
}

// namedUser reports whether a create's user names a user or group
// ("dev", "dev:staff", "1000:staff") rather than giving ids alone.
func namedUser(v string) bool {
	u, g, _ := strings.Cut(v, ":")
	return v != "" && (!allDigits(u) || !allDigits(g))
}

// allDigits reports whether s is empty or only ASCII digits.
func allDigits(s string) bool {
	return strings.Trim(s, "0123456789") == ""
}

// validateUserName checks the text of a user given by name: at most 256
// bytes, no NUL, no "/" (a name of /etc/passwd is a plain word), one ":" at
// most, neither side empty.
func validateUserName(field, v string) error {
	u, g, hasGroup := strings.Cut(v, ":")
	if len(v) > 256 || strings.ContainsAny(v, "\x00/") || u == "" || (hasGroup && (g == "" || strings.Contains(g, ":"))) {
		return apierr.InvalidArgument(field, fmt.Sprintf("%s must be \"uid\", \"uid:gid\", \"name\" or \"name:group\" (names of the image's /etc/passwd and /etc/group, at most 256 bytes)", textsafe.Quote(v)))
	}
	return nil
}

// resolveUser sets spec's ids to those of the user and group names in
// name, read from spec.Image's /etc/passwd and /etc/group (a name's group
// is its passwd entry's unless name gives one): the sandbox records, and
// idempotent creates compare, the ids, so a create by name and one by the
// ids it resolves to are the same spec. A sandbox from a snapshot resolves
// against its image's files, not the snapshot's. An unknown name is
// INVALID_ARGUMENT naming user and the image; an image not stored is
// IMAGE_NOT_FOUND.
func (s *Service) resolveUser(ctx context.Context, spec *runtime.SandboxSpec, name string) error {
	uid, gid, err := s.rt.ImageUser(ctx, spec.Image, name)
	if errors.Is(err, runtime.ErrUnknownUser) {
		return apierr.InvalidArgument("user", textsafe.Escape(err.Error()))
	}
	if err != nil {
		return err
	}
	spec.UID, spec.GID = uid, gid
	return userInRange(*spec, name)
}

// parseUser parses "uid" or "uid:gid" (numeric; gid defaults to uid); empty
// is 0:0. 4294967295 is (uid_t)-1, which setuid(2) cannot take.
func parseUser(field, v string) (uid, gid uint32, err error) {
	if v == "" {
		return 0, 0, nil
	}
	u, g, hasGID := strings.Cut(v, ":")
	if !hasGID {
		g = u
	}
	uid64, err1 := strconv.ParseUint(u, 10, 32)
	gid64, err2 := strconv.ParseUint(g, 10, 32)
	if err1 != nil || err2 != nil || uid64 == 1<<32-1 || gid64 == 1<<32-1 {
		return 0, 0, apierr.InvalidArgument(field, fmt.Sprintf("%s must be \"uid\" or \"uid:gid\", numbers from 0 to 4294967294", textsafe.Quote(v)))
	}
	return uint32(uid64), uint32(gid64), nil
}

// validateWorkDir returns the working directory, runtime.DefaultWorkDir for
// empty. It must be absolute and clean, and not inside the kernel's or the
// agent's own mounts.
func validateWorkDir(field, dir string) (string, error) {
	if dir == "" {
		return runtime.DefaultWorkDir, nil
	}
	if err := validate.PathText.String(field, dir); err != nil {
		return "", err
	}
	switch {
	case !filepath.IsAbs(dir) || filepath.Clean(dir) != dir:
		return "", apierr.InvalidArgument(field, fmt.Sprintf("%s must be an absolute, clean path (like %s)", textsafe.Quote(dir), textsafe.Quote(filepath.Clean("/"+dir))))
	}
	if p := validate.ReservedDir(dir, true); p != "" {
		return "", apierr.InvalidArgument(field, fmt.Sprintf("%s is inside %s", textsafe.Quote(dir), p))
	}
	return dir, nil
}

// boundedDuration returns d, def when d is unset or zero, or an
// INVALID_ARGUMENT naming field when d is invalid, negative, below a second
// or above max.
func boundedDuration(field string, d *durationpb.Duration, def, max time.Duration) (time.Duration, error) {
	v, err := bounds.Duration(field, d, minTimeout, max)
	switch {
	case err != nil:
		return 0, err
	case v == 0:
		return def, nil
	}
	return v, nil
}

// defaultResources puts the server's defaults in spec's zero limits.
func (s *Service) defaultResources(spec *runtime.SandboxSpec) {
	if spec.PidsLimit == 0 {
		spec.PidsLimit = s.cfg.DefaultPidsLimit
	}
	if spec.CPUMillis == 0 && s.cfg.DefaultCPUMillis > 0 {
		spec.CPUMillis = uint64(s.cfg.DefaultCPUMillis)
	}
	if spec.MemoryBytes == 0 && s.cfg.DefaultMemoryBytes > 0 {
		spec.MemoryBytes = uint64(s.cfg.DefaultMemoryBytes)
	}
	if spec.OpenFiles == 0 {
		spec.OpenFiles = s.cfg.DefaultOpenFiles
	}
}

// volumeMounts checks a create's volume mounts: at most
// runtime.MaxVolumeMounts, each a volume name and a path no other mount
// shares or nests in (INVALID_ARGUMENT naming volumes[N].name or
// volumes[N].path).
func volumeMounts(in []*berthv1.VolumeMount) ([]runtime.VolumeMount, error) {
	if len(in) > runtime.MaxVolumeMounts {
		return nil, apierr.InvalidArgument("volumes", fmt.Sprintf("has %d mounts, at most %d", len(in), runtime.MaxVolumeMounts))
	}
	out := make([]runtime.VolumeMount, 0, len(in))
	for i, m := range in {
		if err := runtime.VolumeNameError(m.GetName()); err != nil {
			return nil, apierr.InvalidArgument(fmt.Sprintf("volumes[%d].name", i), err.Error())
		}
		field := fmt.Sprintf("volumes[%d].path", i)
		if err := runtime.VolumeMountPathError(m.GetPath()); err != nil {
			return nil, apierr.InvalidArgument(field, err.Error())
		}
		for j, o := range out {
			if o.Path == m.GetPath() || strings.HasPrefix(m.GetPath(), o.Path+"/") || strings.HasPrefix(o.Path, m.GetPath()+"/") {
				return nil, apierr.InvalidArgument(field, fmt.Sprintf("%s overlaps volumes[%d].path %s: one volume per path, none inside another", textsafe.Quote(m.GetPath()), j, textsafe.Quote(o.Path)))
			}
		}
		out = append(out, runtime.VolumeMount{Name: m.GetName(), Path: m.GetPath(), ReadOnly: m.GetReadOnly()})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
