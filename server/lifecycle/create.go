package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
)

// Created is what Create returns: the sandbox's record, its agent's
// answer (nil when its task is not running) and whether it came from the
// warm pool.
type Created struct {
	Sandbox  runtime.Sandbox
	Info     *agentv1.InfoResponse
	FromPool bool
}

// Create returns the sandbox of spec for caller p: a warm-pool member when
// fromPool and spec is the pool's default, else the existing sandbox of the
// same id and spec (waiting while it starts), else a new one. Concurrent
// requests for one id share one creation, which runs on even when its
// callers go away, so that a retry finds its result. A sandbox whose agent
// does not answer within Config.AgentReadyTimeout, or whose task exits
// first, is removed and reported as apierr.ErrUnreachable with the tail of
// the agent's log.
//
// Sandbox ids are one namespace for all principals: an id that another
// principal's sandbox holds is ALREADY_EXISTS (takenError) without a word
// about that sandbox; another spec for the id is ALREADY_EXISTS naming the
// differing fields (conflictError).
func (m *Manager) Create(ctx context.Context, spec runtime.SandboxSpec, p auth.Principal, fromPool bool) (Created, error) {
	if fromPool && m.poolable(spec) {
		began := time.Now()
		if c, ok := m.fromPool(ctx, spec); ok {
			m.obs.SandboxCreated(true, time.Since(began))
			return c, nil
		}
	}
	c, err := m.joinCreation(trace.SpanContextFromContext(ctx), spec, p)
	if err != nil {
		return Created{}, err
	}
	select {
	case <-c.done:
		return c.created, c.err
	case <-ctx.Done():
		return Created{}, ctx.Err()
	}
}

// creation is one Create in progress for an id. Requests for the
// same id and spec wait for it instead of creating again.
type creation struct {
	spec    runtime.SandboxSpec
	cancel  context.CancelFunc // ends the creation, as a delete of the id does
	done    chan struct{}      // closed when created or err is set
	created Created
	err     error
	// deleted is set when a DeleteSandbox for the id ran during the
	// creation: a failure is then reported as the sandbox being gone.
	deleted atomic.Bool
}

// joinCreation returns the creation in progress for spec.ID when its spec
// is the same, or starts one for caller p. A creation in progress with
// another spec is a conflict, and one for an owner p may not see is
// takenError. A new creation is traced as a child of parent, the first
// caller's span.
func (m *Manager) joinCreation(parent trace.SpanContext, spec runtime.SandboxSpec, p auth.Principal) (*creation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.creating[spec.ID]; ok {
		if !p.Sees(c.spec.Owner) {
			return nil, takenError(spec.ID)
		}
		if fields := specDiff(c.spec, runtime.EnvDigest(c.spec.Env), spec); len(fields) > 0 {
			return nil, conflictError(spec.ID, fields)
		}
		return c, nil
	}
	if err := m.bgCtx.Err(); err != nil {
		return nil, fmt.Errorf("%w: berthd is shutting down", apierr.ErrUnreachable)
	}
	// It runs under the Service's background context, bounded by the
	// agent-ready timeout plus a minute for containerd and the runtime's
	// limit for a create's long work, and outlives its callers (a retry
	// joins it): its span is a child of the first caller's.
	ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(m.bgCtx, parent), m.createTimeout())
	c := &creation{spec: spec, cancel: cancel, done: make(chan struct{})}
	m.creating[spec.ID] = c
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		defer cancel()
		c.created, c.err = m.createOrGet(ctx, spec, p)
		if c.err != nil && c.deleted.Load() {
			// The delete pulled the container or the agent connection
			// out from under the start; what failed next is its echo.
			c.err = fmt.Errorf("%w: %s was deleted while it was being created (the start then failed: %v)", runtime.ErrSandboxNotFound, spec.ID, c.err)
		}
		m.mu.Lock()
		delete(m.creating, spec.ID)
		m.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// createOrGet returns the existing sandbox of spec.ID when its spec is the
// same and caller p may see it, or creates it, under the sandbox's
// lifecycle lock. Its span (sandbox.create) is a child of ctx's.
func (m *Manager) createOrGet(ctx context.Context, spec runtime.SandboxSpec, p auth.Principal) (created Created, err error) {
	ctx, span := tracer.Start(ctx, "sandbox.create",
		trace.WithAttributes(attribute.String("berth.sandbox.id", spec.ID), attribute.String("berth.image", spec.Image)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(otelcodes.Error, "create failed")
		}
		span.End()
	}()
	unlock, err := m.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return Created{}, fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", spec.ID, err)
	}
	defer unlock()
	existing, err := m.rt.Get(ctx, spec.ID)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		// In a fleet the id must be this node's before anything is
		// made: a concurrent create of it elsewhere wins or loses here.
		if err := m.claim(ctx, spec.ID, spec.Owner); err != nil {
			return Created{}, err
		}
		created, err := m.create(ctx, spec)
		if err != nil {
			// Nothing of the sandbox is left (start removes what it
			// made): neither is its record.
			m.release(context.WithoutCancel(ctx), spec.ID)
		}
		return created, err
	case err != nil:
		m.health.created(time.Now(), false, err)
		return Created{}, err
	case !p.Sees(existing.Owner):
		// Before anything else about it: its state, its spec.
		return Created{}, takenError(spec.ID)
	}
	if r := m.reaper.Stopping(spec.ID); r != ReasonNone || existing.Expired != "" {
		why := existing.Expired
		if r != ReasonNone {
			why = r.String()
		}
		return Created{}, fmt.Errorf("%w: sandbox %s expired (%s) and is being removed; retry to create it anew", apierr.ErrUnreachable, spec.ID, why)
	}
	if existing.Pooled {
		// Minted pool ids are random: a caller naming one is a conflict.
		return Created{}, conflictError(spec.ID, []string{"sandbox_id"})
	}
	if fields := specDiff(existing.Spec(), existing.EnvHash, spec); len(fields) > 0 {
		return Created{}, conflictError(spec.ID, fields)
	}
	var info *agentv1.InfoResponse
	if existing.Running {
		if info, err = m.waitAgent(ctx, spec.ID); err != nil {
			return Created{}, err
		}
	}
	m.log.Info("sandbox exists with the same spec; returning it", slog.String("sandbox_id", spec.ID))
	return Created{Sandbox: existing, Info: info}, nil
}

// create makes a new sandbox of spec and starts tracking it.
func (m *Manager) create(ctx context.Context, spec runtime.SandboxSpec) (Created, error) {
	began := time.Now()
	ph := runtime.NewPhases()
	sb, info, err := m.start(ctx, spec, ph)
	if err != nil {
		return Created{}, err
	}
	m.track(sb)
	m.obs.SandboxCreated(false, time.Since(began))
	m.log.Info("sandbox created", slog.String("sandbox_id", spec.ID), slog.String("image", spec.Image),
		slog.String("agent_boot_id", info.GetBootId()), slog.String("user", fmt.Sprintf("%d:%d", spec.UID, spec.GID)),
		slog.Any("env_keys", sb.EnvKeys), slog.Duration("idle_timeout", spec.IdleTimeout), slog.Duration("max_lifetime", spec.MaxLifetime),
		slog.Any("took", ph))
	return Created{Sandbox: sb, Info: info}, nil
}

// start creates the container and task of spec and waits for the agent,
// recording its steps in ph (nil for none). On failure it removes what it
// created. The caller holds the sandbox's lifecycle lock.
func (m *Manager) start(ctx context.Context, spec runtime.SandboxSpec, ph *runtime.Phases) (runtime.Sandbox, *agentv1.InfoResponse, error) {
	admitted, err := m.giveWay(ctx, func() (func(), error) { return m.capacity.AdmitSandbox(ctx, spec.ID, held(spec)) })
	if err != nil {
		return runtime.Sandbox{}, nil, err
	}
	made := false
	defer func() { m.endAdmission(admitted, made) }()
	if err := m.attachNetwork(ctx, &spec); err != nil {
		return runtime.Sandbox{}, nil, err
	}
	ph.Done("network")
	if err := m.rt.Create(runtime.WithPhases(ctx, ph), spec); err != nil {
		m.health.created(time.Now(), false, err)
		m.detachNetwork(context.WithoutCancel(ctx), spec.ID)
		return runtime.Sandbox{}, nil, err
	}
	info, err := m.waitAgent(ctx, spec.ID)
	ph.Done("agent")
	if ctx.Err() == nil {
		m.health.created(time.Now(), true, err)
	}
	if err != nil {
		// The container exists, and its removal below may fail as well:
		// a dependency failure (see server/status) may have left a part.
		err = &apierr.Attempt{Err: err, Admitted: berthv1.Admitted_ADMITTED_UNKNOWN}
	}
	if err == nil {
		m.sandboxCreated(spec.ID, info.GetBootId(), info.GetVersion())
		m.ids.SetOwner(spec.ID, info.GetBootId(), spec.Owner)
		var sb runtime.Sandbox
		if sb, err = m.rt.Get(ctx, spec.ID); err == nil {
			made = true
			return sb, info, nil
		}
	}
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if derr := m.deleteLocked(cleanup, spec.ID); derr != nil {
		m.log.Error("remove sandbox after failed start", slog.String("sandbox_id", spec.ID), slog.Any("error", derr))
	}
	return runtime.Sandbox{}, nil, err
}

// track hands a running sandbox to the reaper, with its limits from its
// record.
func (m *Manager) track(sb runtime.Sandbox) {
	idle, life := sb.IdleTimeout, sb.MaxLifetime
	if idle == 0 {
		idle = m.cfg.Defaults.IdleTimeout // recorded by a berthd without idle timeouts
	}
	if life == 0 {
		life = m.cfg.Defaults.MaxLifetime
	}
	m.reaper.Track(sb.ID, Limits{CreatedAt: sb.CreatedAt, IdleTimeout: idle, MaxLifetime: life, HoldUntil: sb.HoldUntil,
		PauseOnIdle: sb.IdleAction == runtime.IdlePause || sb.IdleAction == runtime.IdleHibernate})
	if sb.Paused || sb.Hibernated {
		m.reaper.SetPaused(sb.ID, true)
	}
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
	shmDefaults := have.ShmBytes == DefaultShm(have.MemoryBytes) && want.ShmBytes == DefaultShm(want.MemoryBytes)
	add(have.ShmBytes != want.ShmBytes && !shmDefaults, "resources.shm_bytes")
	add(have.UID != want.UID || have.GID != want.GID, "user")
	add(have.WorkDir != want.WorkDir, "workdir")
	add(have.IdleTimeout != want.IdleTimeout, "idle_timeout")
	add(have.MaxLifetime != want.MaxLifetime, "max_lifetime")
	add(!have.Network.Equal(want.Network), "network")
	add(idleAction(have.IdleAction) != idleAction(want.IdleAction), "idle_action")
	add(have.FromSnapshot != want.FromSnapshot, "from_snapshot")
	add(!slices.Equal(have.Volumes, want.Volumes), "volumes")
	return fields
}

// idleAction is a spec's idle action, runtime.IdleDelete for "".
func idleAction(a string) string {
	if a == "" {
		return runtime.IdleDelete
	}
	return a
}

// conflictError is ALREADY_EXISTS naming the differing fields, in the
// message and in the ErrorInfo metadata "fields" (comma-separated).
func conflictError(id string, fields []string) error {
	return apierr.New(codes.AlreadyExists, rpcstatus.ReasonSandboxExists,
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
func (m *Manager) poolable(spec runtime.SandboxSpec) bool {
	def := m.pooledSpec(spec.Image, spec.ID)
	return m.pool.Enabled(spec.Image) && len(spec.Env) == 0 && spec.UID == 0 && spec.GID == 0 &&
		spec.WorkDir == def.WorkDir && spec.PidsLimit == def.PidsLimit && spec.CPUMillis == def.CPUMillis &&
		spec.MemoryBytes == def.MemoryBytes && spec.OpenFiles == def.OpenFiles && spec.HostUsers == def.HostUsers && spec.Runtime == def.Runtime &&
		spec.ShmBytes == def.ShmBytes && spec.DiskBytes == def.DiskBytes && !spec.Network.Egress && spec.FromSnapshot == "" && len(spec.Volumes) == 0
}

// MinShmBytes is the smallest /dev/shm, in bytes: a semaphore or a small
// shared buffer needs a few pages.
const MinShmBytes = 64 << 10

// DefaultShm is the size of /dev/shm for a sandbox that asks for none:
// runtime.DefaultShmBytes (docker's 64 MiB), but at most a quarter of a
// memory limit (memory bytes; zero: none), rounded down to KiB, and never
// under MinShmBytes.
func DefaultShm(memory uint64) uint64 {
	if memory == 0 {
		return runtime.DefaultShmBytes
	}
	return max(min(runtime.DefaultShmBytes, memory/4/1024*1024), MinShmBytes)
}

// pooledSpec is the spec of a warm-pool member of image.
func (m *Manager) pooledSpec(image, id string) runtime.SandboxSpec {
	d := m.cfg.Defaults
	spec := runtime.SandboxSpec{ID: id, Image: image, WorkDir: runtime.DefaultWorkDir, Runtime: runtime.RuntimeRunc, DiskBytes: d.DiskBytes,
		IdleTimeout: d.IdleTimeout, MaxLifetime: d.MaxLifetime, Pooled: true,
		PidsLimit: d.PidsLimit, CPUMillis: d.CPUMillis, MemoryBytes: d.MemoryBytes, OpenFiles: d.OpenFiles}
	spec.ShmBytes = DefaultShm(spec.MemoryBytes)
	return spec
}

// fromPool claims a ready warm-pool member for spec. It reports false when
// none is ready or the claim failed (the member is then removed), and the
// caller creates a sandbox the usual way.
func (m *Manager) fromPool(ctx context.Context, spec runtime.SandboxSpec) (Created, bool) {
	id, ok := m.pool.Take(spec.Image)
	if !ok {
		return Created{}, false
	}
	unlock, err := m.lifecycle.Lock(ctx, id)
	if err != nil {
		return Created{}, false
	}
	defer unlock()
	drop := func(err error) (Created, bool) {
		m.log.Warn("warm pool: member unusable; removing it and creating anew", slog.String("sandbox_id", id), slog.Any("error", err))
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := m.deleteLocked(cleanup, id); err != nil {
			m.log.Error("warm pool: remove member", slog.String("sandbox_id", id), slog.Any("error", err))
		}
		return Created{}, false
	}
	// The member counts against the server's limits since it was made;
	// from the claim on it counts for its owner too.
	admitted, err := m.giveWay(ctx, func() (func(), error) {
		return m.capacity.AdmitClaim(ctx, id, spec.Owner, held(m.pooledSpec(spec.Image, id)))
	})
	if err != nil {
		// The member goes back (or, when a refill took its place, away);
		// the usual creation is refused the same way.
		if !m.pool.Adopt(spec.Image, id) {
			return drop(err)
		}
		return Created{}, false
	}
	claimed := false
	defer func() { m.endAdmission(admitted, claimed) }()
	if err := m.claim(ctx, id, spec.Owner); err != nil {
		return drop(err)
	}
	m.ids.SetOwner(id, "", "") // it changes now
	if err := m.rt.Claim(ctx, id, spec); err != nil {
		return drop(err)
	}
	sb, err := m.rt.Get(ctx, id)
	if err != nil {
		return drop(err)
	}
	info, err := m.reach.Info(ctx, sb)
	if err != nil {
		return drop(err)
	}
	m.ids.SetOwner(id, info.GetBootId(), sb.Owner)
	m.track(sb)
	claimed = true
	m.log.Info("sandbox created from the warm pool", slog.String("sandbox_id", id), slog.String("image", spec.Image),
		slog.String("agent_boot_id", info.GetBootId()), slog.Duration("idle_timeout", spec.IdleTimeout), slog.Duration("max_lifetime", spec.MaxLifetime))
	return Created{Sandbox: sb, Info: info, FromPool: true}, true
}

// held is what a sandbox of spec holds against admission's limits.
func held(spec runtime.SandboxSpec) admit.Held {
	return admit.Held{Owner: spec.Owner, Pooled: spec.Pooled, MemoryBytes: spec.MemoryBytes, DiskBytes: spec.DiskBytes}
}

// createTimeout bounds a sandbox's creation: the runtime's long work
// (runtime.Config.CreateWorkLimit), a minute for containerd's quick calls
// and the agent-ready timeout.
func (m *Manager) createTimeout() time.Duration {
	return m.rt.CreateWorkLimit() + time.Minute + m.cfg.AgentReadyTimeout
}

// maker creates warm-pool members for Pool.
type maker struct{ m *Manager }

func (mk maker) MakePooled(ctx context.Context, image string) (string, error) {
	m := mk.m
	spec := m.pooledSpec(image, sandboxid.New("sb-", 10))
	ctx, cancel := context.WithTimeout(ctx, m.createTimeout())
	defer cancel()
	unlock, err := m.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return "", err
	}
	defer unlock()
	_, info, err := m.start(ctx, spec, nil)
	if err != nil {
		return "", err
	}
	m.reach.CheckSkew(spec.ID, info)
	return spec.ID, nil
}

// attachNetwork gives an EGRESS sandbox its network and points spec at
// it (a no-op for NONE).
func (m *Manager) attachNetwork(ctx context.Context, spec *runtime.SandboxSpec) error {
	if !spec.Network.Egress {
		return nil
	}
	if m.cfg.Network == nil {
		return fmt.Errorf("%w: the sandbox network stopped", network.ErrUnavailable)
	}
	p, err := network.ParsePolicy("network.allow", spec.Network.Allow, spec.Network.MaxConnections, m.cfg.Network.Subnet())
	if err != nil {
		return err
	}
	p.EgressBytesPerSecond, p.IngressBytesPerSecond = spec.Network.EgressBytesPerSecond, spec.Network.IngressBytesPerSecond
	att, err := m.cfg.Network.Attach(ctx, spec.ID, p)
	if err != nil {
		return err
	}
	spec.Network.NetNS, spec.Network.ResolvConf = att.NetNS, att.ResolvConf
	return nil
}
