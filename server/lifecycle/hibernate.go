package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Hibernate ends every process of sandbox id for caller p
// (HibernateSandbox) and keeps its container and files: see
// agentreach.Reacher.Hibernate. It runs under the sandbox's lifecycle
// lock. A sandbox p may not see is runtime.ErrSandboxNotFound.
func (m *Manager) Hibernate(ctx context.Context, id string, p auth.Principal) (runtime.Hibernation, error) {
	unlock, err := m.lockSeen(ctx, id, p)
	if err != nil {
		return runtime.Hibernation{}, err
	}
	defer unlock()
	return m.hibernate(ctx, id, false)
}

// hibernate hibernates sandbox id and returns what it kept; the caller
// holds its lifecycle lock. The exit of its task is the hibernation's (not
// restarted; exec streams see RUNTIME_REPLACED cause SANDBOX_HIBERNATED).
//
// A gVisor sandbox's checkpoint image is admitted first as a stored copy
// of its owner's (Manager.AdmitStored, standby members giving way: the
// server's disk budget, the owner's --max-disk-bytes-per-principal),
// sized as its memory cap:
// an image holds at most the memory the sandbox may hold. When it does
// not fit, the sandbox is hibernated without its memory (its processes
// end, Hibernation.NotKept names the limit) rather than refused: the
// caller asked to release its memory, and that is done. With
// mustKeepMemory (a fork with memory) it is refused instead (the
// *apierr.FleetBusy), and so is any hibernation that would not keep the
// memory (runtime.KeepMemory.Must): the sandbox then runs on.
func (m *Manager) hibernate(ctx context.Context, id string, mustKeepMemory bool) (runtime.Hibernation, error) {
	var (
		pid      uint32
		noMemory error
	)
	if sb, err := m.rt.Get(ctx, id); err == nil {
		pid = sb.TaskPID
		if sb.Runtime == runtime.RuntimeGVisor && !sb.Hibernated {
			release, err := m.AdmitStored(ctx, id, sb.Owner, sb.MemoryBytes)
			var busy *apierr.FleetBusy
			switch {
			case errors.As(err, &busy) && mustKeepMemory:
				return runtime.Hibernation{}, busy
			case errors.As(err, &busy):
				noMemory = busy
			case err != nil:
				return runtime.Hibernation{}, err
			default:
				defer release() // the image counts itself once made (runtime.Promised)
			}
		}
	}
	m.restarts.hibernating(id, pid)
	h, err := m.reach.Hibernate(ctx, id, noMemory, mustKeepMemory)
	if err != nil {
		if !m.reach.Hibernated(id) {
			m.restarts.woken(id)
		}
		return runtime.Hibernation{}, err
	}
	// The old agent's connection goes with its task; the wake dials the
	// new one (or the restored agent, listening again).
	m.agents.Forget(m.rt.SocketPath(id))
	m.RoomFreed() // its memory
	return h, nil
}

// Hibernated reports whether sandbox id is hibernated.
func (m *Manager) Hibernated(id string) bool { return m.reach.Hibernated(id) }

// wake starts a new task for hibernated sandbox id and returns once its
// agent answered (agentreach.Reacher.Waker); a sandbox another call woke
// meanwhile is left as it is. Concurrent wakes of one sandbox are
// serialized by its lifecycle lock: one starts the task, the others find
// it running.
func (m *Manager) wake(ctx context.Context, id string) error {
	unlock, err := m.lifecycle.Lock(ctx, id)
	if err != nil {
		return fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", id, err)
	}
	defer unlock()
	return m.wakeLocked(ctx, id)
}

// wakeLocked is wake; the caller holds the lifecycle lock. The wake, once
// begun, is not cut off by the caller's cancel (other calls wait for it),
// but bounded by Config.AgentReadyTimeout.
func (m *Manager) wakeLocked(ctx context.Context, id string) error {
	if !m.reach.Hibernated(id) {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	getCtx, cancel := context.WithTimeout(ctx, m.cfg.AgentReadyTimeout)
	sb, err := m.rt.Get(getCtx, id)
	cancel()
	if err != nil {
		if errors.Is(err, runtime.ErrSandboxNotFound) {
			m.reach.SetHibernated(id, false)
			m.restarts.woken(id)
		}
		return err
	}
	// Its memory counted for nothing while it slept: the wake is
	// admitted again, and refused (FLEET_BUSY, the sandbox left
	// hibernated) when it does not fit.
	admitted, err := m.giveWay(ctx, func() (func(), error) { return m.capacity.AdmitWake(ctx, id) })
	if err != nil {
		return err
	}
	defer admitted()
	wait := m.cfg.AgentReadyTimeout
	if sb.HibernationMark == runtime.HibernatedMemoryKept {
		wait += runtime.RestoreTimeout
	}
	ctx, cancel = context.WithTimeout(ctx, wait)
	defer cancel()
	before := m.ids.Current(id).BootID
	began := time.Now()
	m.restarts.woken(id)
	how := "new task, files kept"
	if !sb.Running && !sb.Paused {
		// A task left by a wake cut off before its mark was cleared runs
		// already: only the mark is left to clear.
		next, err := m.restarts.start(ctx, id, 0, time.Time{})
		if err != nil {
			m.restarts.hibernating(id, 0)
			return fmt.Errorf("wake hibernated sandbox %s: %w", id, err)
		}
		switch {
		case sb.HibernationMark != runtime.HibernatedMemoryKept:
		case next.BootID == before && before != "":
			how = "memory restored: the same processes and agent"
		default:
			how = "the memory checkpoint was not restored (the sandbox's log says why): new task, files kept"
		}
	}
	if err := m.rt.Woken(ctx, id); err != nil {
		// The task runs: berthd reads the sandbox as running whatever
		// the mark says (runtime.Sandbox.Hibernated).
		m.log.Warn("clear the hibernation mark of a woken sandbox", slog.String("sandbox_id", id), slog.Any("error", err))
	}
	m.reach.SetHibernated(id, false)
	m.reaper.SetPaused(id, false)
	m.log.InfoContext(ctx, "hibernated sandbox woken: "+how, slog.String("sandbox_id", id), slog.Duration("took", time.Since(began)))
	return nil
}
