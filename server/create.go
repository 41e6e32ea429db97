package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/textsafe"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/fleet"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Bounds of the create request beyond Config's.
const (
	maxEnvEntries   = 1024
	maxEnvBytes     = 256 << 10 // keys and values together
	maxRequestIDLen = 128
	maxPathBytes    = 4096
	minTimeout      = time.Second
)

// creation is one CreateSandbox in progress for an id. Requests for the
// same id and spec wait for it instead of creating again.
type creation struct {
	spec   runtime.SandboxSpec
	cancel context.CancelFunc // ends the creation, as a delete of the id does
	done   chan struct{}      // closed when resp or err is set
	resp   *berthv1.CreateSandboxResponse
	err    error
	// deleted is set when a DeleteSandbox for the id ran during the
	// creation: a failure is then reported as the sandbox being gone.
	deleted atomic.Bool
}

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
	spec, err := s.sandboxSpec(req, p.Name)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"sandbox_id": spec.ID}
	// "berth.dev/base" means "berth.dev/base:latest", as for docker. An
	// image not stored keeps its name: an existing sandbox of the same
	// spec is still returned, a new one fails with IMAGE_NOT_FOUND.
	switch name, err := s.rt.ResolveImage(ctx, spec.Image); {
	case err == nil:
		spec.Image = name
	case !errors.Is(err, runtime.ErrImageNotFound):
		return nil, s.toStatus(ctx, err, meta)
	}
	if req.GetSandboxId() == "" && req.GetRequestId() == "" && s.poolable(spec) {
		began := time.Now()
		if resp, ok := s.fromPool(ctx, spec); ok {
			s.obs.SandboxCreated(true, time.Since(began))
			return resp, nil
		}
	}
	c, err := s.joinCreation(trace.SpanContextFromContext(ctx), spec, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	select {
	case <-c.done:
		if c.err != nil {
			return nil, s.toStatus(ctx, c.err, meta)
		}
		return c.resp, nil
	case <-ctx.Done():
		return nil, s.toStatus(ctx, ctx.Err(), meta)
	}
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
		if err := validateSandboxID("sandbox_id", spec.ID); err != nil {
			return spec, err
		}
	case req.GetRequestId() != "":
		spec.ID = sandboxid.FromRequest(owner, req.GetRequestId())
	default:
		spec.ID = newID("sb-", 10)
	}
	if err := validateImageRef("image", spec.Image); err != nil {
		return spec, err
	}
	if err := validateLabels("labels", spec.Labels); err != nil {
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
		spec.ShmBytes = defaultShm(spec.MemoryBytes)
	case spec.MemoryBytes > 0 && (spec.MemoryBytes < shmMemoryReserve || shm > spec.MemoryBytes-shmMemoryReserve):
		return spec, rpcstatus.InvalidArgument("resources.shm_bytes", fmt.Sprintf("%d leaves less than %d of memory_bytes %d outside /dev/shm: its pages count against the memory limit, and a full /dev/shm would leave the OOM killer only the agent and the workload's processes to take", shm, shmMemoryReserve, spec.MemoryBytes))
	case shm > min(s.cfg.MaxMemoryBytes, maxShmBytes):
		return spec, rpcstatus.InvalidArgument("resources.shm_bytes", fmt.Sprintf("%d exceeds the server's maximum memory cap of %d: /dev/shm pages are memory", shm, min(s.cfg.MaxMemoryBytes, maxShmBytes)))
	case shm < minShmBytes:
		return spec, bounds.Uint("resources.shm_bytes", shm, minShmBytes, 0, "bytes", minShmWhy)
	default:
		spec.ShmBytes = (shm + 1023) / 1024 * 1024
	}

	var err error
	if spec.DiskBytes, err = s.diskBytes(res.GetDiskBytes()); err != nil {
		return spec, err
	}
	if spec.UID, spec.GID, err = parseUser("user", req.GetUser()); err != nil {
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
	return spec, nil
}

// resources fills spec's limits from res, the server's defaults standing in
// for zero fields, and checks them against the server's maximums.
func (s *Service) resources(spec *runtime.SandboxSpec, res *berthv1.Resources) error {
	spec.PidsLimit, spec.CPUMillis, spec.MemoryBytes = res.GetPidsLimit(), res.GetCpuMillis(), res.GetMemoryBytes()
	spec.OpenFiles = res.GetOpenFilesLimit()
	s.defaultResources(spec)
	if spec.PidsLimit > s.cfg.MaxPidsLimit {
		return rpcstatus.InvalidArgument("resources.pids_limit", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.PidsLimit, s.cfg.MaxPidsLimit))
	}
	if spec.CPUMillis > s.cfg.MaxCPUMillis {
		return rpcstatus.InvalidArgument("resources.cpu_millis", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.CPUMillis, s.cfg.MaxCPUMillis))
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
		return rpcstatus.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.MemoryBytes, max))
	}
	if m := spec.MemoryBytes; m > 0 && m < minMemoryBytes {
		return rpcstatus.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d is below the minimum of %d (4 MiB)", m, minMemoryBytes))
	}
	if spec.OpenFiles > s.cfg.MaxOpenFiles {
		return rpcstatus.InvalidArgument("resources.open_files_limit", fmt.Sprintf("%d exceeds the server's maximum of %d", spec.OpenFiles, s.cfg.MaxOpenFiles))
	}
	if spec.OpenFiles < minOpenFiles {
		return rpcstatus.InvalidArgument("resources.open_files_limit", fmt.Sprintf("%d is below the minimum of %d", spec.OpenFiles, minOpenFiles))
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
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("pids_limit %d × open_files_limit %d may hold %d open files; the server's maximum per sandbox is %d: lower either",
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
			return rpcstatus.InvalidArgument("runtime", `"gvisor" is not enabled on this server (berthd --gvisor-binary)`)
		}
		// gVisor's sentry runs as an unprivileged host user in a user
		// namespace of its own: host_users changes nothing there.
		spec.HostUsers = false
	default:
		return rpcstatus.InvalidArgument("runtime", fmt.Sprintf("%q must be %q or %q", spec.Runtime, runtime.RuntimeRunc, runtime.RuntimeGVisor))
	}
	if spec.HostUsers && !s.cfg.AllowHostUsers {
		return rpcstatus.InvalidArgument("host_users", "this server runs every sandbox in a user namespace of its own (berthd --allow-host-users permits the host's)")
	}
	if !spec.HostUsers && spec.Runtime == runtime.RuntimeRunc && (spec.UID >= runtime.IDRangeSize || spec.GID >= runtime.IDRangeSize) {
		return rpcstatus.InvalidArgument("user", fmt.Sprintf("%d:%d: ids in a sandbox's user namespace are 0 to %d", spec.UID, spec.GID, runtime.IDRangeSize-1))
	}
	return nil
}

// minOpenFiles is the smallest RLIMIT_NOFILE accepted: the agent needs
// descriptors of its own for its socket, pipes and files.
const minOpenFiles = 64

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

// networkSpec validates a request's network: NONE (the default) takes no
// allow-list; EGRESS needs the server's network and a valid allow-list,
// which comes back normalized (package network).
func (s *Service) networkSpec(np *berthv1.NetworkPolicy) (runtime.NetworkSpec, error) {
	switch np.GetMode() {
	case berthv1.NetworkMode_NETWORK_MODE_UNSPECIFIED, berthv1.NetworkMode_NETWORK_MODE_NONE:
		if len(np.GetAllow()) > 0 {
			return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.allow", "is only for network mode NETWORK_MODE_EGRESS; a sandbox of mode NONE reaches nothing")
		}
		if np.GetMaxConnections() > 0 {
			return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.max_connections", "is only for network mode NETWORK_MODE_EGRESS")
		}
		if np.GetEgressBytesPerSecond() > 0 || np.GetIngressBytesPerSecond() > 0 {
			return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.egress_bytes_per_second", "bandwidth caps are only for network mode NETWORK_MODE_EGRESS")
		}
		return runtime.NetworkSpec{}, nil
	case berthv1.NetworkMode_NETWORK_MODE_EGRESS:
	default:
		return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.mode", fmt.Sprintf("%d is not a network mode (NONE or EGRESS)", np.GetMode()))
	}
	if s.cfg.Network == nil {
		why := s.cfg.NetworkUnavailable
		if why == "" {
			why = "berthd runs without one"
		}
		return runtime.NetworkSpec{}, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNetworkUnavailable,
			"network.mode: EGRESS needs berthd's sandbox network, which is unavailable: "+why, map[string]string{"field": "network.mode"})
	}
	p, err := network.ParsePolicy("network.allow", np.GetAllow(), np.GetMaxConnections(), s.cfg.Network.Subnet())
	if err != nil {
		var fe *network.FieldError
		if errors.As(err, &fe) {
			return runtime.NetworkSpec{}, rpcstatus.InvalidArgument(fe.Field, fe.Err.Error())
		}
		return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.allow", err.Error())
	}
	for _, rate := range []struct {
		field string
		v     uint64
	}{{"network.egress_bytes_per_second", np.GetEgressBytesPerSecond()}, {"network.ingress_bytes_per_second", np.GetIngressBytesPerSecond()}} {
		if rate.v > network.MaxBytesPerSecond {
			return runtime.NetworkSpec{}, rpcstatus.InvalidArgument(rate.field, fmt.Sprintf("%d exceeds the maximum of %d", rate.v, uint64(network.MaxBytesPerSecond)))
		}
	}
	spec := runtime.NetworkSpec{Egress: true, Allow: p.Entries(), MaxConnections: p.MaxConnections,
		EgressBytesPerSecond: np.GetEgressBytesPerSecond(), IngressBytesPerSecond: np.GetIngressBytesPerSecond()}
	if n := len(runtime.AllowJSON(spec.Allow)); n > runtime.MaxNetworkAllowLabelBytes {
		return runtime.NetworkSpec{}, rpcstatus.InvalidArgument("network.allow", fmt.Sprintf("takes %d bytes as JSON; the limit is %d", n, runtime.MaxNetworkAllowLabelBytes))
	}
	return spec, nil
}

// attachNetwork gives an EGRESS sandbox its network and points spec at
// it (a no-op for NONE).
func (s *Service) attachNetwork(ctx context.Context, spec *runtime.SandboxSpec) error {
	if !spec.Network.Egress {
		return nil
	}
	if s.cfg.Network == nil {
		return fmt.Errorf("%w: the sandbox network stopped", network.ErrUnavailable)
	}
	p, err := network.ParsePolicy("network.allow", spec.Network.Allow, spec.Network.MaxConnections, s.cfg.Network.Subnet())
	if err != nil {
		return err
	}
	p.EgressBytesPerSecond, p.IngressBytesPerSecond = spec.Network.EgressBytesPerSecond, spec.Network.IngressBytesPerSecond
	att, err := s.cfg.Network.Attach(ctx, spec.ID, p)
	if err != nil {
		return err
	}
	spec.Network.NetNS, spec.Network.ResolvConf = att.NetNS, att.ResolvConf
	return nil
}

func validateRequestID(field, id string) error {
	if len(id) > maxRequestIDLen {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d", len(id), maxRequestIDLen))
	}
	for i := 0; i < len(id); i++ {
		if r := id[i]; r < 0x21 || r > 0x7e {
			return rpcstatus.InvalidArgument(field, "must be printable ASCII without spaces")
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
	// minShmBytes is the smallest /dev/shm: a semaphore or a small
	// shared buffer (32 KiB) must fit.
	minShmBytes = 64 << 10
	minShmWhy   = "/dev/shm must hold a few pages for semaphores and shared buffers"
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
		return 0, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonDiskQuotaUnsupported,
			fmt.Sprintf("%s: this server cannot enforce disk quotas: %v", field, err), map[string]string{"field": field})
	}
	if max := s.cfg.MaxDiskBytes; max > 0 && req > max {
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%d exceeds the server's maximum of %d", req, max))
	}
	return req, nil
}

func validateEnv(field string, env map[string]string) error {
	if len(env) > maxEnvEntries {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("has %d entries; the limit is %d", len(env), maxEnvEntries))
	}
	total := 0
	for k, v := range env {
		if err := envText.String(field, k); err != nil {
			return err
		}
		if err := envText.String(field, v); err != nil {
			return err
		}
		switch {
		case k == "":
			return rpcstatus.InvalidArgument(field, "a key is empty")
		case strings.ContainsAny(k, "=\x00"):
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("key %s contains '=' or NUL", textsafe.Quote(k)))
		case strings.ContainsRune(v, 0):
			// The value is never echoed: it may be a secret.
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("the value of %s contains NUL", textsafe.Quote(k)))
		}
		total += len(k) + len(v) + 2
	}
	if total > maxEnvBytes {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("is %d bytes; the limit is %d", total, maxEnvBytes))
	}
	if n := len(runtime.EnvKeysJSON(env)); len(env) > 0 && n > runtime.MaxEnvKeysLabelBytes {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("its key names take %d bytes as JSON; the limit is %d", n, runtime.MaxEnvKeysLabelBytes))
	}
	return nil
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
		return 0, 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%s must be \"uid\" or \"uid:gid\", numbers from 0 to 4294967294", textsafe.Quote(v)))
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
	if err := pathText.String(field, dir); err != nil {
		return "", err
	}
	switch {
	case !filepath.IsAbs(dir) || filepath.Clean(dir) != dir:
		return "", rpcstatus.InvalidArgument(field, fmt.Sprintf("%s must be an absolute, clean path (like %s)", textsafe.Quote(dir), textsafe.Quote(filepath.Clean("/"+dir))))
	}
	if p := reservedDir(dir, true); p != "" {
		return "", rpcstatus.InvalidArgument(field, fmt.Sprintf("%s is inside %s", textsafe.Quote(dir), p))
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

// joinCreation returns the creation in progress for spec.ID when its spec
// is the same, or starts one for caller p. A creation in progress with
// another spec is a conflict, and one for an owner p may not see is
// takenError. A new creation is traced as a child of parent, the first
// caller's span.
func (s *Service) joinCreation(parent trace.SpanContext, spec runtime.SandboxSpec, p auth.Principal) (*creation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.creating[spec.ID]; ok {
		if !p.Sees(c.spec.Owner) {
			return nil, takenError(spec.ID)
		}
		if fields := specDiff(c.spec, runtime.EnvDigest(c.spec.Env), spec); len(fields) > 0 {
			return nil, conflictError(spec.ID, fields)
		}
		return c, nil
	}
	if err := s.bgCtx.Err(); err != nil {
		return nil, fmt.Errorf("%w: berthd is shutting down", errAgentUnreachable)
	}
	// It runs under the Service's background context, bounded by the
	// agent-ready timeout plus a minute for containerd and the runtime's
	// limit for a create's long work, and outlives its callers (a retry
	// joins it): its span is a child of the first caller's.
	ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(s.bgCtx, parent), s.createTimeout())
	c := &creation{spec: spec, cancel: cancel, done: make(chan struct{})}
	s.creating[spec.ID] = c
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer cancel()
		c.resp, c.err = s.createOrGet(ctx, spec, p)
		if c.err != nil && c.deleted.Load() {
			// The delete pulled the container or the agent connection
			// out from under the start; what failed next is its echo.
			c.err = fmt.Errorf("%w: %s was deleted while it was being created (the start then failed: %v)", runtime.ErrSandboxNotFound, spec.ID, c.err)
		}
		s.mu.Lock()
		delete(s.creating, spec.ID)
		s.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// createOrGet returns the existing sandbox of spec.ID when its spec is the
// same and caller p may see it, or creates it, under the sandbox's
// lifecycle lock. Its span (sandbox.create) is a child of ctx's.
func (s *Service) createOrGet(ctx context.Context, spec runtime.SandboxSpec, p auth.Principal) (resp *berthv1.CreateSandboxResponse, err error) {
	ctx, span := tracer.Start(ctx, "sandbox.create",
		trace.WithAttributes(attribute.String("berth.sandbox.id", spec.ID), attribute.String("berth.image", spec.Image)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(otelcodes.Error, "create failed")
		}
		span.End()
	}()
	unlock, err := s.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return nil, fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", spec.ID, err)
	}
	defer unlock()
	existing, err := s.rt.Get(ctx, spec.ID)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		// In a fleet the id must be this node's before anything is
		// made: a concurrent create of it elsewhere wins or loses here.
		if err := s.claim(ctx, spec.ID, spec.Owner); err != nil {
			return nil, err
		}
		resp, err := s.create(ctx, spec)
		if err != nil {
			// Nothing of the sandbox is left (start removes what it
			// made): neither is its record.
			s.release(context.WithoutCancel(ctx), spec.ID)
		}
		return resp, err
	case err != nil:
		return nil, err
	case !p.Sees(existing.Owner):
		// Before anything else about it: its state, its spec.
		return nil, takenError(spec.ID)
	}
	if r := s.reaper.Stopping(spec.ID); r != fleet.ReasonNone || existing.Expired != "" {
		why := existing.Expired
		if r != fleet.ReasonNone {
			why = r.String()
		}
		return nil, fmt.Errorf("%w: sandbox %s expired (%s) and is being removed; retry to create it anew", errAgentUnreachable, spec.ID, why)
	}
	if existing.Pooled {
		// Minted pool ids are random: a caller naming one is a conflict.
		return nil, conflictError(spec.ID, []string{"sandbox_id"})
	}
	if fields := specDiff(existing.Spec(), existing.EnvHash, spec); len(fields) > 0 {
		return nil, conflictError(spec.ID, fields)
	}
	var info *agentv1.InfoResponse
	if existing.Running {
		if info, err = s.waitAgent(ctx, spec.ID); err != nil {
			return nil, err
		}
	}
	s.log.Info("sandbox exists with the same spec; returning it", slog.String("sandbox_id", spec.ID))
	return &berthv1.CreateSandboxResponse{Sandbox: s.sandboxProto(existing, info, nil)}, nil
}

// create makes a new sandbox of spec and starts tracking it.
func (s *Service) create(ctx context.Context, spec runtime.SandboxSpec) (*berthv1.CreateSandboxResponse, error) {
	began := time.Now()
	sb, info, err := s.start(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.track(sb)
	s.obs.SandboxCreated(false, time.Since(began))
	s.log.Info("sandbox created", slog.String("sandbox_id", spec.ID), slog.String("image", spec.Image),
		slog.String("agent_boot_id", info.GetBootId()), slog.String("user", fmt.Sprintf("%d:%d", spec.UID, spec.GID)),
		slog.Any("env_keys", sb.EnvKeys), slog.Duration("idle_timeout", spec.IdleTimeout), slog.Duration("max_lifetime", spec.MaxLifetime))
	return &berthv1.CreateSandboxResponse{Sandbox: s.sandboxProto(sb, info, nil)}, nil
}

// start creates the container and task of spec and waits for the agent. On
// failure it removes what it created. The caller holds the sandbox's
// lifecycle lock.
func (s *Service) start(ctx context.Context, spec runtime.SandboxSpec) (runtime.Sandbox, *agentv1.InfoResponse, error) {
	admitted, err := s.capacity.admitSandbox(ctx, spec.ID, spec.MemoryBytes)
	if err != nil {
		return runtime.Sandbox{}, nil, err
	}
	defer admitted()
	if err := s.attachNetwork(ctx, &spec); err != nil {
		return runtime.Sandbox{}, nil, err
	}
	if err := s.rt.Create(ctx, spec); err != nil {
		s.detachNetwork(context.WithoutCancel(ctx), spec.ID)
		return runtime.Sandbox{}, nil, err
	}
	info, err := s.waitAgent(ctx, spec.ID)
	if d, ok := dependencyOf(err, spec.ID); ok {
		// The container exists, and its removal below may fail as well.
		d.admitted = berthv1.Admitted_ADMITTED_UNKNOWN
		err = d
	}
	if err == nil {
		s.sandboxCreated(spec.ID, info.GetBootId(), info.GetVersion())
		s.ids.setOwner(spec.ID, info.GetBootId(), spec.Owner)
		var sb runtime.Sandbox
		if sb, err = s.rt.Get(ctx, spec.ID); err == nil {
			return sb, info, nil
		}
	}
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if derr := s.deleteLocked(cleanup, spec.ID); derr != nil {
		s.log.Error("remove sandbox after failed start", slog.String("sandbox_id", spec.ID), slog.Any("error", derr))
	}
	return runtime.Sandbox{}, nil, err
}

// track hands a running sandbox to the reaper, with its limits from its
// record.
func (s *Service) track(sb runtime.Sandbox) {
	idle, life := sb.IdleTimeout, sb.MaxLifetime
	if idle == 0 {
		idle = s.cfg.DefaultIdleTimeout // recorded by a berthd without idle timeouts
	}
	if life == 0 {
		life = s.cfg.DefaultMaxLifetime
	}
	s.reaper.Track(sb.ID, fleet.Limits{CreatedAt: sb.CreatedAt, IdleTimeout: idle, MaxLifetime: life, HoldUntil: sb.HoldUntil})
}

// specDiff names the request fields in which the spec of an existing or
// starting sandbox (have, whose env is known by its digest haveEnv) differs
// from want, all with defaults filled in.
func specDiff(have runtime.SandboxSpec, haveEnv string, want runtime.SandboxSpec) []string {
	var fields []string
	add := func(differ bool, field string) {
		if differ {
			fields = append(fields, field)
		}
	}
	add(have.Image != want.Image, "image")
	add(!maps.Equal(have.Labels, want.Labels), "labels")
	add(haveEnv != runtime.EnvDigest(want.Env), "env")
	add(have.PidsLimit != want.PidsLimit, "resources.pids_limit")
	add(have.CPUMillis != want.CPUMillis, "resources.cpu_millis")
	add(have.MemoryBytes != want.MemoryBytes, "resources.memory_bytes")
	add(have.OpenFiles != want.OpenFiles, "resources.open_files_limit")
	add(have.HostUsers != want.HostUsers, "host_users")
	add(have.Runtime != want.Runtime, "runtime")
	add(have.DiskBytes != want.DiskBytes, "resources.disk_bytes")
	// Both the default of their memory limits: a difference that follows
	// from memory_bytes's, which is named already.
	shmDefaults := have.ShmBytes == defaultShm(have.MemoryBytes) && want.ShmBytes == defaultShm(want.MemoryBytes)
	add(have.ShmBytes != want.ShmBytes && !shmDefaults, "resources.shm_bytes")
	add(have.UID != want.UID || have.GID != want.GID, "user")
	add(have.WorkDir != want.WorkDir, "workdir")
	add(have.IdleTimeout != want.IdleTimeout, "idle_timeout")
	add(have.MaxLifetime != want.MaxLifetime, "max_lifetime")
	add(!have.Network.Equal(want.Network), "network")
	return fields
}

// conflictError is ALREADY_EXISTS naming the differing fields, in the
// message and in the ErrorInfo metadata "fields" (comma-separated).
func conflictError(id string, fields []string) error {
	return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSandboxExists,
		fmt.Sprintf("sandbox %s exists with another spec; differing fields: %s", id, strings.Join(fields, ", ")),
		map[string]string{"sandbox_id": id, "fields": strings.Join(fields, ",")})
}

// takenError is ALREADY_EXISTS for an id that a sandbox the caller may not
// see holds: ids are one namespace, so the create cannot go ahead, but the
// answer says nothing of that sandbox (no spec, no differing fields, not
// even whether it is running).
func takenError(id string) error { return rpcstatus.SandboxTaken(id) }

// poolable reports whether a request's spec is what warm-pool members are
// made with: no env, user 0:0, the default working directory and limits.
// Labels, idle timeout and maximum lifetime are applied at the claim.
func (s *Service) poolable(spec runtime.SandboxSpec) bool {
	def := s.pooledSpec(spec.Image, spec.ID)
	return s.pool.Enabled(spec.Image) && len(spec.Env) == 0 && spec.UID == 0 && spec.GID == 0 &&
		spec.WorkDir == def.WorkDir && spec.PidsLimit == def.PidsLimit && spec.CPUMillis == def.CPUMillis &&
		spec.MemoryBytes == def.MemoryBytes && spec.OpenFiles == def.OpenFiles && spec.HostUsers == def.HostUsers && spec.Runtime == def.Runtime &&
		spec.ShmBytes == def.ShmBytes && spec.DiskBytes == def.DiskBytes && !spec.Network.Egress
}

// defaultShm is the size of /dev/shm for a sandbox that asks for none:
// runtime.DefaultShmBytes (docker's 64 MiB), but at most a quarter of a
// memory limit (memory bytes; zero: none), rounded down to KiB, and never
// under minShmBytes.
func defaultShm(memory uint64) uint64 {
	if memory == 0 {
		return runtime.DefaultShmBytes
	}
	return max(min(runtime.DefaultShmBytes, memory/4/1024*1024), minShmBytes)
}

// pooledSpec is the spec of a warm-pool member of image.
func (s *Service) pooledSpec(image, id string) runtime.SandboxSpec {
	spec := runtime.SandboxSpec{ID: id, Image: image, WorkDir: runtime.DefaultWorkDir, Runtime: runtime.RuntimeRunc, DiskBytes: s.cfg.DefaultDiskBytes,
		IdleTimeout: s.cfg.DefaultIdleTimeout, MaxLifetime: s.cfg.DefaultMaxLifetime, Pooled: true}
	s.defaultResources(&spec)
	spec.ShmBytes = defaultShm(spec.MemoryBytes)
	return spec
}

// fromPool claims a ready warm-pool member for spec. It reports false when
// none is ready or the claim failed (the member is then removed), and the
// caller creates a sandbox the usual way.
func (s *Service) fromPool(ctx context.Context, spec runtime.SandboxSpec) (*berthv1.CreateSandboxResponse, bool) {
	id, ok := s.pool.Take(spec.Image)
	if !ok {
		return nil, false
	}
	unlock, err := s.lifecycle.Lock(ctx, id)
	if err != nil {
		return nil, false
	}
	defer unlock()
	drop := func(err error) (*berthv1.CreateSandboxResponse, bool) {
		s.log.Warn("warm pool: member unusable; removing it and creating anew", slog.String("sandbox_id", id), slog.Any("error", err))
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := s.deleteLocked(cleanup, id); err != nil {
			s.log.Error("warm pool: remove member", slog.String("sandbox_id", id), slog.Any("error", err))
		}
		return nil, false
	}
	if err := s.claim(ctx, id, spec.Owner); err != nil {
		return drop(err)
	}
	s.ids.setOwner(id, "", "") // it changes now
	if err := s.rt.Claim(ctx, id, spec); err != nil {
		return drop(err)
	}
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		return drop(err)
	}
	info, err := s.agentInfoErr(ctx, sb)
	if err != nil {
		return drop(err)
	}
	s.ids.setOwner(id, info.GetBootId(), sb.Owner)
	s.track(sb)
	s.log.Info("sandbox created from the warm pool", slog.String("sandbox_id", id), slog.String("image", spec.Image),
		slog.String("agent_boot_id", info.GetBootId()), slog.Duration("idle_timeout", spec.IdleTimeout), slog.Duration("max_lifetime", spec.MaxLifetime))
	return &berthv1.CreateSandboxResponse{Sandbox: s.sandboxProto(sb, info, nil), FromWarmPool: true}, true
}

// createTimeout bounds a sandbox's creation: the runtime's long work
// (runtime.Config.CreateWorkLimit), a minute for containerd's quick calls
// and the agent-ready timeout.
func (s *Service) createTimeout() time.Duration {
	return s.rt.CreateWorkLimit() + time.Minute + s.cfg.AgentReadyTimeout
}

// maker creates warm-pool members for fleet.Pool.
type maker struct{ s *Service }

func (m maker) MakePooled(ctx context.Context, image string) (string, error) {
	spec := m.s.pooledSpec(image, newID("sb-", 10))
	ctx, cancel := context.WithTimeout(ctx, m.s.createTimeout())
	defer cancel()
	unlock, err := m.s.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return "", err
	}
	defer unlock()
	_, info, err := m.s.start(ctx, spec)
	if err != nil {
		return "", err
	}
	m.s.checkSkew(spec.ID, info)
	return spec.ID, nil
}
