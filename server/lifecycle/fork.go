package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/validate"
)

// MaxForkCount is the most children one Fork makes.
const MaxForkCount = 16

// forkParallel is how many children of one Fork under gVisor are created
// at once: each has a shim and a sandbox of its own. All ten of a fork of
// 10 at once, on 2 cores at load 40-48, made one child's NewTask outlast
// containerd's call budget of 10 s, and the fork failed (BENCHMARKS.md,
// 2026-12-05; then under runc, whose children queued in their shim).
// Under runc every child's create begins at once (forkLimit): each
// prepares its network, snapshot, mounts and container while others are
// in their shim or their agent's start, and their task creates, which a
// shim runs one at a time, wait in the runtime (enterShim) instead of in
// the shim, not against the call budget (BENCHMARKS.md, session 8).
const forkParallel = 4

// forkLimit is how many children of spec are created at once (errgroup's
// limit: -1 for all).
func forkLimit(spec runtime.SandboxSpec) int {
	if spec.Runtime == runtime.RuntimeGVisor {
		return forkParallel
	}
	return -1
}

// shimLane returns the runtime.ForkOrigin.ShimGroup of child i of a fork
// whose children are ids: a shim runs the `runc create`s of the children
// under runc one at a time, under its service lock (the runtime queues
// them for it: enterShim), so they are spread over two shims — the
// parent's (even i, "") and the second child's (odd i), which that child
// starts. Two creates then run at once on a host of 2 cores or more
// (BENCHMARKS.md, session 7; four shims were slower: session 8).
func shimLane(ids []string, i int) string {
	if i%2 == 0 {
		return ""
	}
	return ids[1]
}

// ForkRequest is what Fork makes.
type ForkRequest struct {
	// Count is how many children, 1 to MaxForkCount.
	Count int
	// RequestID makes the call idempotent ("" for none).
	RequestID string
	// Labels are added to the parent's on every child.
	Labels map[string]string
	// Memory restores every child from a checkpoint of the parent's
	// memory too (gVisor; memoryFreezer).
	Memory bool
}

// Fork makes req.Count new sandboxes for caller p from the files of
// sandbox id as of one point in time. Under the parent's lifecycle lock
// its root is copied once (runtime.Runtime.ForkSnapshot: the parent
// paused only around the sync and the btrfs snapshot; a paused one stays
// paused); each child is created as by Create, from that copy, with
// the parent's spec (env values included), owned by p, req.Labels added
// to its labels: its create begins beside the copy (forkLimit at once)
// and waits for it only where it needs its files, and ends while the
// parent resumes (Fork returns once it has, with
// the lock held until then). All or nothing: when one child fails, every
// child of the call is deleted and the first error returned. The copy is
// deleted when the call ends. With req.RequestID the child ids derive
// from p, the request id and the index, and a repeated call returns the
// existing children (forkAgain). A sandbox p may not see is
// runtime.ErrSandboxNotFound.
//
// A fork that standby members can serve (standbyServes: no memory, no
// request id) takes up to req.Count of the parent's ready members: the
// first children are those members, each switched onto the copy
// (fromStandby) instead of created, the rest are created; a member that
// turns out unusable is removed and its child created the cold way under
// an id of its own. After such a fork the pool is asked for as many
// members as the fork had children, up to Config.ForkStandby
// (Pool.Want).
func (m *Manager) Fork(ctx context.Context, id string, p auth.Principal, req ForkRequest) ([]Created, error) {
	if _, err := m.snapshotStore(); err != nil {
		return nil, err
	}
	ids := make([]string, req.Count)
	for i := range ids {
		ids[i] = sandboxid.New("sb-", 10)
		if req.RequestID != "" {
			ids[i] = sandboxid.FromRequest(p.Name, "fork\x00"+req.RequestID+"\x00"+strconv.Itoa(i))
		}
	}
	// The parent's ready standby members are the first children
	// (fromStandby): their ids are the children's. One the fork did not
	// reach (the copy failed before, or the call ended before its child
	// was begun) goes back to the pool, untouched: not to be left running
	// unowned, which no Delete of the caller's could name.
	standby := map[string]bool{}
	var reachedMu sync.Mutex
	reached := map[string]bool{}
	wasReached := func(sid string) bool {
		reachedMu.Lock()
		defer reachedMu.Unlock()
		return reached[sid]
	}
	if m.standbyServes(req) {
		for i := range ids {
			sid, ok := m.pool.TakeStandby(id)
			if !ok {
				break
			}
			standby[sid], ids[i] = true, sid
		}
		defer func() {
			for sid := range standby {
				if wasReached(sid) {
					m.pool.StandbyUsed(id)
					continue
				}
				m.returnStandby(ctx, id, sid)
			}
		}()
	}
	// The children created the cold way share shims in pairs
	// (shimLane) among themselves: a member has its task already.
	cold := ids[len(standby):]
	if req.RequestID != "" {
		// One fork of a principal's request ids at a time: a repeat waits
		// for the first call and then finds its children.
		l := m.snapshotLock("fork\x00" + p.Name)
		l.Lock()
		defer l.Unlock()
		if children, err := m.forkAgain(ctx, id, p, req, ids); children != nil || err != nil {
			return children, err
		}
	}
	ph := runtime.NewPhases()
	created := make([]Created, req.Count)
	g, gctx := errgroup.WithContext(ctx)
	// The children's creates begin as soon as the copy's id is known,
	// beside the copy: each waits for it only where it needs its files
	// (runtime's fillRoot), after its image, id range, CPUs and snapshot.
	launched := make(chan struct{})
	launch := func(children runtime.SandboxSpec) {
		defer close(launched)
		g.SetLimit(forkLimit(children))
		for i := range ids {
			if gctx.Err() != nil {
				break // a child failed: the rest are not begun
			}
			spec := children
			spec.ID = ids[i]
			if i >= len(standby) {
				spec.Fork.ShimGroup = shimLane(cold, i-len(standby))
			}
			g.Go(func() error {
				if standby[spec.ID] {
					reachedMu.Lock()
					reached[spec.ID] = true
					reachedMu.Unlock()
					c, err := m.fromStandby(gctx, spec, p, ph)
					if err == nil {
						created[i] = c
						return nil
					}
					if gctx.Err() != nil {
						return fmt.Errorf("fork sandbox %s: child %d of %d (%s): %w", id, i+1, req.Count, spec.ID, err)
					}
					// The member is removed: the child is made the cold way,
					// under an id of its own.
					member := spec.ID
					spec.ID = sandboxid.New("sb-", 10)
					ids[i] = spec.ID
					m.log.WarnContext(gctx, "fork: standby member unusable; creating the child anew", slog.String("sandbox_id", id),
						slog.String("member", member), slog.String("child", spec.ID), slog.Any("error", err))
				}
				c, err := m.Create(gctx, spec, p, false)
				if err != nil {
					return fmt.Errorf("fork sandbox %s: child %d of %d (%s): %w", id, i+1, req.Count, spec.ID, err)
				}
				created[i] = c
				return nil
			})
		}
	}
	failed := func(err error) ([]Created, error) {
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, child := range ids {
			if standby[child] && !wasReached(child) {
				continue
			}
			if derr := m.Delete(cleanup, child, p); derr != nil {
				m.log.Error("remove a child of a failed fork", slog.String("sandbox_id", child), slog.Any("error", derr))
			}
		}
		return nil, err
	}
	c, err := m.forkCopy(ctx, id, p, req, ids, standby, func(spec runtime.SandboxSpec) { go launch(spec) }, ph)
	if err != nil {
		if c.launched {
			<-launched
			_ = g.Wait() // each child fails with the copy's error
			return failed(err)
		}
		return nil, err
	}
	forked := false
	defer func() { m.endAdmission(c.admitted, forked) }()
	defer func() {
		if err := c.release(); err != nil {
			m.log.Error("delete a fork's copy; it stays until berthd's next start", slog.String("sandbox_id", id), slog.Any("error", err))
		}
	}()
	defer c.resumed()
	<-launched
	if err := g.Wait(); err != nil {
		return failed(err)
	}
	ph.Done("children")
	m.log.InfoContext(ctx, "sandbox forked", slog.String("sandbox_id", id), slog.String("fork_copy", c.spec.FromSnapshot),
		slog.Any("children", ids), slog.Int("standby", servedBy(ids, standby)), slog.Any("took", ph))
	if m.standbyServes(req) && m.rt.(standbyStore).CanStandby(c.spec) == nil {
		// A caller that forked tends to fork again alike (tree search,
		// best-of-N): the next fork's children may be ready.
		m.pool.Want(id, req.Count)
	}
	forked = true
	return created, nil
}

// servedBy counts the children ids that are standby members (standby):
// those a member served.
func servedBy(ids []string, standby map[string]bool) int {
	n := 0
	for _, id := range ids {
		if standby[id] {
			n++
		}
	}
	return n
}

// forkCopying is a fork's copy of its parent's root (forkCopy).
type forkCopying struct {
	// spec is the children's spec, without their ids.
	spec runtime.SandboxSpec
	// resumed waits until the parent runs again (or stays paused, as it
	// was) and releases its lifecycle lock.
	resumed func()
	// release deletes the copy.
	release func() error
	// admitted releases the children's admission (admitChildren), once
	// their creates are done.
	admitted func()
	// launched is set when the children's creates were begun (also when
	// forkCopy then failed: they fail with the copy's error).
	launched bool
}

// forkCopy copies sandbox id's root for a fork under its lifecycle lock,
// recording its steps in ph, and returns the children's spec and the
// functions that end the copy (forkCopying). It calls launch with the
// children's spec (without ids) once the children are admitted and the
// copy's id is known, before the copy is taken; the creates it begins
// wait for the copy. The parent is resumed in the background once the
// copy is taken: its lock is held until it is.
func (m *Manager) forkCopy(ctx context.Context, id string, p auth.Principal, req ForkRequest, ids []string, standby map[string]bool, launch func(runtime.SandboxSpec), ph *runtime.Phases) (forkCopying, error) {
	st, _ := m.snapshotStore()
	unlock, err := m.lockSeen(ctx, id, p)
	if err != nil {
		return forkCopying{}, err
	}
	if req.Memory {
		// A call that needs the sandbox's processes wakes it.
		if err := m.wakeLocked(ctx, id); err != nil {
			unlock()
			return forkCopying{}, err
		}
	}
	var thawing sync.WaitGroup
	resumed := func() {
		thawing.Wait()
		unlock()
	}
	spec, err := m.forkSpec(ctx, st, id, p, req)
	if err == nil && req.Memory && spec.Runtime != runtime.RuntimeGVisor {
		err = fmt.Errorf("%w: sandbox %s runs under %s: a fork with memory needs gVisor (memory checkpoints under runc need CRIU, which does not work on the kernels berth is tested on)", runtime.ErrSnapshotUnsupported, id, runtimeName(spec.Runtime))
	}
	if err != nil {
		resumed()
		return forkCopying{}, err
	}
	admitted, err := m.admitChildren(ctx, id, spec, ids, standby)
	if err != nil {
		resumed()
		return forkCopying{}, err
	}
	ph.Done("parent")
	freeze := m.freezer(id, "fork")
	var releaseMemory func() error
	if req.Memory {
		freeze = m.memoryFreezer(st, id, func() string { return spec.FromSnapshot }, &releaseMemory)
	}
	launched := false
	forkID, releaseCopy, err := st.ForkSnapshot(ctx, id, func(ctx context.Context) (func(), error) {
		thaw, err := freeze(ctx)
		if err != nil {
			return nil, err
		}
		thawing.Add(1)
		return func() {
			go func() {
				defer thawing.Done()
				thaw()
			}()
		}, nil
	}, func(forkID string) {
		spec.FromSnapshot = forkID
		if req.Memory {
			spec.Fork.MemoryImage = st.ForkMemoryDir(id, forkID)
		}
		launched = true
		launch(spec)
	}, ph)
	release := func() error {
		var err error
		if releaseCopy != nil {
			err = releaseCopy()
		}
		if releaseMemory != nil {
			err = errors.Join(err, releaseMemory())
		}
		return err
	}
	if err != nil {
		if rerr := release(); rerr != nil {
			m.log.Error("delete a failed fork's memory image; it stays until the parent's deletion or berthd's next start", slog.String("sandbox_id", id), slog.Any("error", rerr))
		}
		m.endAdmission(admitted, false)
		resumed()
		return forkCopying{launched: launched}, err
	}
	spec.FromSnapshot = forkID
	if !launched {
		launched = true
		launch(spec)
	}
	return forkCopying{spec: spec, resumed: resumed, release: release, admitted: admitted, launched: launched}, nil
}

// memoryFreezer is the freeze of a fork with memory (ForkSnapshot's):
// instead of pausing sandbox id it hibernates it with its memory
// (hibernate, mustKeepMemory: a checkpoint that fails leaves it running
// and fails the fork) and gives the fork hard links of the checkpoint
// image (runtime.Runtime.ForkMemory, for the fork of id forkID(); their
// release is put in *release). The thaw it returns wakes the parent
// (runsc restore of its own image) and pauses it again when it was
// paused. The caller holds id's lifecycle lock.
func (m *Manager) memoryFreezer(st snapshots, id string, forkID func() string, release *func() error) func(context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		paused := m.reach.Paused(id)
		if _, err := m.hibernate(ctx, id, true); err != nil {
			return nil, fmt.Errorf("checkpoint sandbox %s's memory for its fork: %w", id, err)
		}
		wake := func() {
			ctx := context.WithoutCancel(ctx)
			if err := m.wakeLocked(ctx, id); err != nil {
				m.log.Error("wake after a fork with memory failed; the sandbox stays hibernated (any call naming it wakes it)", slog.String("sandbox_id", id), slog.Any("error", err))
				return
			}
			if paused {
				if err := m.pause(ctx, id, true); err != nil {
					m.log.Error("pause again after a fork with memory failed; the sandbox runs", slog.String("sandbox_id", id), slog.Any("error", err))
				}
			}
		}
		r, err := st.ForkMemory(id, forkID())
		if err != nil {
			wake()
			return nil, err
		}
		*release = r
		return wake, nil
	}
}

// runtimeName is the name of runtime r, "runc" for the default ("").
func runtimeName(r string) string {
	if r == "" {
		return runtime.RuntimeRunc
	}
	return r
}

// admitChildren admits the children ids of a fork of sandbox id, each with
// spec as its CreateSandbox would be (admit.Capacity.AdmitSandbox; the
// child's Create then finds it admitted), before the fork's copy is taken:
// a fork past a limit is refused with the *apierr.FleetBusy a create gets
// and makes nothing — no copy whose deleted extents btrfs frees only later
// (the btrfs cleaner), while the sandbox's exclusive bytes, which its
// next snapshot is counted by, would read them as shared. release must be
// called once the children's creates are done. A standby member child
// (in standby) was counted against the server's limits when it was made:
// it is admitted as a warm-pool member's claim (admit.Capacity.AdmitClaim).
func (m *Manager) admitChildren(ctx context.Context, id string, spec runtime.SandboxSpec, ids []string, standby map[string]bool) (release func(), err error) {
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for i, child := range ids {
		spec.ID = child
		admitOne := m.capacity.AdmitSandbox
		if standby[child] {
			admitOne = func(ctx context.Context, id string, h admit.Held) (func(), error) {
				return m.capacity.AdmitClaim(ctx, id, h.Owner, h)
			}
		}
		r, err := m.giveWay(ctx, func() (func(), error) { return admitOne(ctx, child, held(spec)) })
		if err != nil {
			release()
			return nil, fmt.Errorf("fork sandbox %s: child %d of %d (%s): %w", id, i+1, len(ids), child, err)
		}
		releases = append(releases, r)
	}
	return release, nil
}

// forkSpec returns the spec of the children of a fork of sandbox id by p
// (without their ids and copy). The caller holds id's lifecycle lock.
func (m *Manager) forkSpec(ctx context.Context, st snapshots, id string, p auth.Principal, req ForkRequest) (runtime.SandboxSpec, error) {
	parent, err := m.rt.Get(ctx, id)
	if err != nil {
		return runtime.SandboxSpec{}, err
	}
	spec := parent.Spec()
	spec.Labels = maps.Clone(parent.Labels)
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	maps.Copy(spec.Labels, req.Labels)
	if err := validate.Labels("labels", spec.Labels); err != nil {
		return runtime.SandboxSpec{}, err
	}
	if spec.Env, err = st.SandboxEnv(ctx, id); err != nil {
		return runtime.SandboxSpec{}, err
	}
	spec.Owner, spec.Pooled = p.Name, false
	spec.Fork = runtime.ForkOrigin{Parent: id, RequestID: req.RequestID, Count: req.Count, Memory: req.Memory}
	return spec, nil
}

// forkAgain looks for the children of an earlier Fork with req.RequestID
// (ids). It returns nil and no error when there are none; the children when
// every one is there and was made by a call with the same parent, count
// and labels; else ALREADY_EXISTS SANDBOX_EXISTS naming the differing
// fields, or saying the set is incomplete (berthd stopped during that
// call, or some were deleted since).
func (m *Manager) forkAgain(ctx context.Context, id string, p auth.Principal, req ForkRequest, ids []string) ([]Created, error) {
	var out []Created
	var missing []string
	for _, child := range ids {
		sb, err := m.rt.Get(ctx, child)
		switch {
		case errors.Is(err, runtime.ErrSandboxNotFound):
			missing = append(missing, child)
			continue
		case err != nil:
			return nil, err
		case !p.Sees(sb.Owner):
			return nil, takenError(child)
		}
		var fields []string
		if sb.Fork.Parent != id {
			fields = append(fields, "sandbox_id")
		}
		if sb.Fork.Count != req.Count {
			fields = append(fields, "count")
		}
		for k, v := range req.Labels {
			if got, ok := sb.Labels[k]; !ok || got != v {
				fields = append(fields, "labels")
				break
			}
		}
		if sb.Fork.Memory != req.Memory {
			fields = append(fields, "memory")
		}
		if sb.Fork.RequestID != req.RequestID {
			fields = append(fields, "request_id")
		}
		if len(fields) > 0 {
			return nil, apierr.New(codes.AlreadyExists, rpcstatus.ReasonSandboxExists,
				fmt.Sprintf("request_id %q named an earlier fork with other parameters (its child %s differs in %s): use another request_id", req.RequestID, child, strings.Join(fields, ", ")),
				map[string]string{"sandbox_id": child, "fields": strings.Join(fields, ",")})
		}
		c := Created{Sandbox: sb}
		if sb.Running {
			if c.Info, err = m.waitAgent(ctx, child); err != nil {
				return nil, err
			}
		}
		out = append(out, c)
	}
	switch {
	case len(missing) == len(ids):
		return nil, nil
	case len(missing) > 0:
		return nil, apierr.New(codes.AlreadyExists, rpcstatus.ReasonSandboxExists,
			fmt.Sprintf("the fork of request_id %q is incomplete: %d of its %d children are gone (%s; berthd stopped during the call, or they were deleted): delete the rest or use another request_id",
				req.RequestID, len(missing), len(ids), strings.Join(missing, ", ")),
			map[string]string{"request_id": req.RequestID})
	}
	m.log.InfoContext(ctx, "fork of the same request_id exists; returning its children", slog.String("sandbox_id", id), slog.Any("children", ids))
	return out, nil
}
