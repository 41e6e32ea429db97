package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Fork standby members (runtime.SandboxSpec.Standby; docs/state.md#fork)
// are the Pool's second kind of member: after a fork of parent P the pool
// keeps Config.ForkStandby children of P's next fork made ahead, their
// containers and agents running on a placeholder root, and a fork of one
// child that one can serve takes it (fromStandby) instead of creating one.

// standbyStore is what standby members need of the store beyond the
// rest (*runtime.Runtime).
type standbyStore interface {
	Standby(id string) bool
	CanStandby(spec runtime.SandboxSpec) error
	TakeStandby(ctx context.Context, spec runtime.SandboxSpec) (recorded func() error, err error)
}

// errStandbyUnfit means a standby member cannot serve a fork: its spec is
// no longer the fork's child's, or this berthd does not hold it waiting.
var errStandbyUnfit = errors.New("standby member unfit")

// standbyServes reports whether a fork of req may be served by standby
// members: no memory (gVisor), no request_id (whose child ids derive from
// the request, while a member's id is fixed at its creation).
func (m *Manager) standbyServes(req ForkRequest) bool {
	_, ok := m.rt.(standbyStore)
	return ok && m.cfg.ForkStandby > 0 && !req.Memory && req.RequestID == ""
}

// standbySpec returns the spec of a standby member of sandbox parent — its
// fork's child's (forkSpec) for no one yet, pooled, a fork of one — and
// the parent's owner, for whom it is made.
func (m *Manager) standbySpec(ctx context.Context, parent string) (spec runtime.SandboxSpec, owner string, err error) {
	st, err := m.snapshotStore()
	if err != nil {
		return runtime.SandboxSpec{}, "", err
	}
	unlock, err := m.lifecycle.Lock(ctx, parent)
	if err != nil {
		return runtime.SandboxSpec{}, "", fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", parent, err)
	}
	defer unlock()
	sb, err := m.rt.Get(ctx, parent)
	if err != nil {
		return runtime.SandboxSpec{}, "", err
	}
	spec, err = m.forkSpec(ctx, st, parent, auth.Principal{}, ForkRequest{Count: 1})
	if err != nil {
		return runtime.SandboxSpec{}, "", err
	}
	spec.ID, spec.Owner, spec.Pooled, spec.Standby = sandboxid.New("sb-", 10), "", true, true
	return spec, sb.Owner, nil
}

// MakeStandby creates a standby member of parent (Maker): admitted as
// its parent's owner's sandbox (admit.Held.Standby: within that owner's
// caps and the server's limits, a *apierr.FleetBusy past them), its
// network attached, its container and task made (runtime.Runtime.Create);
// it returns once its agent waits.
func (mk maker) MakeStandby(ctx context.Context, parent string) (string, error) {
	m := mk.m
	ctx, cancel := context.WithTimeout(ctx, m.createTimeout())
	defer cancel()
	spec, owner, err := m.standbySpec(ctx, parent)
	if err != nil {
		return "", err
	}
	unlock, err := m.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return "", err
	}
	defer unlock()
	want := held(spec)
	want.Owner, want.Pooled, want.Standby = owner, false, true
	admitted, err := m.capacity.AdmitSandbox(ctx, spec.ID, want)
	if err != nil {
		return "", err
	}
	defer admitted()
	if err := m.attachNetwork(ctx, &spec); err != nil {
		return "", err
	}
	if err := m.rt.Create(ctx, spec); err != nil {
		m.detachNetwork(context.WithoutCancel(ctx), spec.ID)
		return "", err
	}
	return spec.ID, nil
}

// giveWay runs admit (an admission of a sandbox, a claim, a wake or a
// stored copy: AdmitStored) and, while it refuses with a
// *apierr.FleetBusy, removes a ready standby member holding room in the
// limit the refusal names — one of the refused principal's own for its
// caps (members count for their parent's owner), any for the server's
// limits; one that holds some of the refused resource — and runs admit
// again. Members are made ahead for forks that may not come: they never
// keep a sandbox out. A member still being made for such a parent gives
// way too: its making is canceled (Pool.YieldStandby). When all such
// members together hold less than the refusal lacks, none is removed:
// the refusal stands either way, and a caller must not make berthd
// remove members with requests that never fit.
func (m *Manager) giveWay(ctx context.Context, admit func() (func(), error)) (func(), error) {
	for {
		release, err := admit()
		var busy *apierr.FleetBusy
		if err == nil || !errors.As(err, &busy) {
			return release, err
		}
		holds := m.standbyHolds(ctx, busy)
		if !standbyCovers(busy, holds, m.pool.Yieldable()) {
			return nil, err
		}
		id, ok := m.pool.YieldStandby(ctx, func(parent string) bool { return holds[parent] > 0 })
		switch {
		case !ok:
			return nil, err
		case id == "":
			continue // a member being made gave way
		}
		m.log.InfoContext(ctx, "standby member gives way to a sandbox refused for room", slog.String("member_id", id),
			slog.String("refused", busy.SandboxID), slog.String("resource", busy.Resource.String()), slog.String("principal", busy.Principal))
		m.pool.Remove(ctx, id)
	}
}

// endAdmission releases an admission (giveWay's release) once the work
// it admitted ended. Work that did not keep the room — a create, a claim
// or a fork that failed or gave up — tells the pool it came back
// (Pool.Freed), after the release so that the retry finds it free: a
// standby member that gave way to it, or was refused for the room it
// held, is made again now instead of after some later delete.
func (m *Manager) endAdmission(release func(), kept bool) {
	release()
	if !kept {
		m.pool.Freed()
	}
}

// standbyHolds returns, for each parent with standby members that busy's
// limit counts (the refused principal's, or any for the server's
// limits), what one of its members holds of busy's resource: one sandbox,
// or the parent's memory cap or disk quota in bytes, which its members
// were made with. Parents whose members hold none of it are left out.
func (m *Manager) standbyHolds(ctx context.Context, busy *apierr.FleetBusy) map[string]uint64 {
	holds := make(map[string]uint64)
	for parent := range m.pool.Yieldable() {
		sb, err := m.rt.Get(ctx, parent)
		if err != nil || busy.Principal != "" && sb.Owner != busy.Principal {
			continue
		}
		var h uint64
		switch busy.Resource {
		case berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES:
			h = 1
		case berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY:
			h = sb.MemoryBytes
		case berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK:
			h = sb.DiskBytes
		}
		if h > 0 {
			holds[parent] = h
		}
	}
	return holds
}

// standbyCovers reports whether the members counts lists (parent -> how
// many), each holding holds[parent] of busy's resource, together hold at
// least what busy lacks (InUse + Requested - Limit, at least 1).
func standbyCovers(busy *apierr.FleetBusy, holds map[string]uint64, counts map[string]int) bool {
	need, ok := bounds.Add(busy.InUse, busy.Requested)
	if !ok {
		return false // no limit holds it
	}
	lack := uint64(1)
	if need > busy.Limit {
		lack = need - busy.Limit
	}
	var have uint64
	for parent, h := range holds {
		for range counts[parent] {
			if have, _ = bounds.Add(have, h); have >= lack {
				return true
			}
		}
	}
	return false
}

// Discard removes a pool member the pool no longer wants (Maker).
func (mk maker) Discard(ctx context.Context, id string) error {
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	return mk.m.deleteSandbox(cleanup, id)
}

// forgetStandby removes the standby members of sandbox parent (being
// deleted); ones being made are removed once made.
func (m *Manager) forgetStandby(ctx context.Context, parent string) {
	for _, id := range m.pool.Forget(parent) {
		m.pool.Remove(ctx, id)
	}
}

// returnStandby puts standby member id of parent back in the pool after
// a fork that did not reach it, or removes it when the pool has no room.
func (m *Manager) returnStandby(ctx context.Context, parent, id string) {
	if !m.pool.ReturnStandby(parent, id) {
		m.pool.Remove(ctx, id)
	}
}

// fromStandby makes the fork child of spec (spec.ID a standby member's
// id) out of that member for p: under the member's lifecycle lock it
// checks that the member is still the child the fork makes (its spec but
// for the labels the fork adds and the copy it is made from), switches it
// onto the fork's copy (runtime.Runtime.TakeStandby) and waits for its
// agent; the child is then tracked as a created one. errStandbyUnfit
// when the member cannot serve; any failure removes the member, and the
// caller creates the child the cold way.
func (m *Manager) fromStandby(ctx context.Context, spec runtime.SandboxSpec, p auth.Principal, ph *runtime.Phases) (Created, error) {
	ss := m.rt.(standbyStore)
	began := time.Now()
	unlock, err := m.lifecycle.Lock(ctx, spec.ID)
	if err != nil {
		return Created{}, err
	}
	defer unlock()
	fail := func(err error) (Created, error) {
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := m.deleteLocked(cleanup, spec.ID); derr != nil {
			m.log.Error("remove an unusable standby member", slog.String("sandbox_id", spec.ID), slog.Any("error", derr))
		}
		return Created{}, err
	}
	member, err := m.rt.Get(ctx, spec.ID)
	if err != nil {
		return fail(err)
	}
	if why := standbyMismatch(member, spec); why != "" || !ss.Standby(spec.ID) {
		if why == "" {
			why = "this berthd does not hold it waiting"
		}
		return fail(fmt.Errorf("%w: %s: %s", errStandbyUnfit, spec.ID, why))
	}
	if err := m.claim(ctx, spec.ID, spec.Owner); err != nil {
		return fail(err)
	}
	m.ids.SetOwner(spec.ID, "", "") // it changes now
	recorded, err := ss.TakeStandby(runtime.WithPhases(ctx, ph), spec)
	if err != nil {
		return fail(err)
	}
	info, err := m.waitAgent(ctx, spec.ID)
	ph.Done("agent")
	if rerr := recorded(); err == nil {
		err = rerr
	}
	if err != nil {
		return fail(err)
	}
	m.sandboxCreated(spec.ID, info.GetBootId(), info.GetVersion())
	m.ids.SetOwner(spec.ID, info.GetBootId(), spec.Owner)
	sb, err := m.rt.Get(ctx, spec.ID)
	if err != nil {
		return fail(err)
	}
	m.track(sb)
	// Counted as a creation served ahead, as a warm-pool claim is.
	m.obs.SandboxCreated(true, time.Since(began))
	return Created{Sandbox: sb, Info: info}, nil
}

// standbyMismatch names why standby member sb is not the child of spec
// ("" when it is): a member stays the spec its parent had when it was
// made, so a parent changed since (labels, env) makes it unfit.
func standbyMismatch(sb runtime.Sandbox, spec runtime.SandboxSpec) string {
	if !sb.Pooled || sb.Fork.Parent != spec.Fork.Parent {
		return "not a standby member of " + spec.Fork.Parent
	}
	have := sb.Spec()
	for k, v := range have.Labels {
		if got, ok := spec.Labels[k]; !ok || got != v {
			return "label " + k + " differs"
		}
	}
	want := spec
	want.Labels, want.FromSnapshot = have.Labels, have.FromSnapshot
	if fields := specDiff(have, sb.EnvHash, want); len(fields) > 0 {
		return fmt.Sprintf("spec differs in %v", fields)
	}
	return ""
}
