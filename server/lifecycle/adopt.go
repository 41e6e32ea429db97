package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Adopt takes over the sandboxes in berthd's containerd namespace, as after
// a restart: every sandbox whose task runs is tracked again from its labels
// (idle timeout, maximum lifetime from its creation time, KeepAlive hold;
// its idle clock restarts now), unclaimed warm-pool members go back to the
// pool, and its agent connection is made on first use — the agent kept its
// exec records, so clients re-attach to execs that ran on meanwhile. It
// removes, and logs, what no sandbox owns any more: containers without a
// running task, sandboxes that had expired, pool members beyond the pool's
// size, and host directories without a container.
func (m *Manager) Adopt(ctx context.Context) error {
	sbs, err := m.rt.List(ctx, nil)
	if err != nil {
		return fmt.Errorf("re-adopt sandboxes: %w", err)
	}
	known := make(map[string]bool, len(sbs))
	adopted := 0
	for _, sb := range sbs {
		known[sb.ID] = true
		log := m.log.With(slog.String("sandbox_id", sb.ID))
		// No fork runs yet: a memory image of one is what a berthd that
		// stopped during a fork with memory left.
		if n, err := m.rt.ReclaimForkMemory(sb.ID); err != nil {
			log.Error("remove memory images of forks left by an earlier berthd", slog.Any("error", err))
		} else if n > 0 {
			log.Warn("removed memory images of forks left by an earlier berthd", slog.Int("images", n))
		}
		var why string
		switch {
		case sb.Expired != "":
			why = "it expired (" + sb.Expired + ") before berthd stopped"
		case sb.Hibernated && !sb.Pooled:
			// Its task was removed on purpose: it waits for a call.
			m.reach.SetHibernated(sb.ID, true)
			m.track(sb)
			adopted++
			log.Info("sandbox re-adopted hibernated")
			continue
		case sb.Pooled && sb.Fork.Parent != "":
			// Its agent stopped, or stops, when the FIFO end of the
			// berthd that made it closed.
			why = "fork standby member of an earlier berthd"
		case !sb.Running && !sb.Paused:
			why = "orphan: container without a running task (nor hibernated)"
		case sb.Pooled && !m.pool.Adopt(sb.Image, sb.ID):
			why = "warm-pool member beyond the pool's size for its image"
		case sb.Pooled:
			log.Info("warm-pool member re-adopted", slog.String("image", sb.Image))
			continue
		case sb.Paused:
			// containerd kept the task paused: it stays paused, and its
			// agent is not asked anything until a call resumes it.
			m.reach.SetPaused(sb.ID, true)
			m.track(sb)
			adopted++
			log.Info("sandbox re-adopted paused")
			continue
		default:
			m.track(sb)
			adopted++
			info, err := m.reach.Info(ctx, sb)
			if err != nil {
				log.Warn("sandbox re-adopted; its agent does not answer yet", slog.Any("error", err))
				continue
			}
			log.Info("sandbox re-adopted", slog.String("agent_boot_id", info.GetBootId()), slog.Uint64("running_execs", uint64(info.GetRunningExecs())))
			continue
		}
		if err := m.deleteSandbox(ctx, sb.ID); err != nil {
			log.Error("remove sandbox at start-up", slog.String("why", why), slog.Any("error", err))
			continue
		}
		log.Warn("removed sandbox at start-up", slog.String("why", why))
	}
	dirs, err := m.rt.HostDirs()
	if err != nil {
		return fmt.Errorf("re-adopt sandboxes: %w", err)
	}
	for _, id := range dirs {
		if known[id] {
			continue
		}
		// Re-check: a sandbox created since the listing has a directory
		// before its container.
		if _, err := m.rt.Get(ctx, id); !errors.Is(err, runtime.ErrSandboxNotFound) {
			continue
		}
		if err := m.rt.RemoveHostDir(id); err != nil {
			m.log.Error("remove orphaned sandbox directory", slog.String("sandbox_id", id), slog.Any("error", err))
			continue
		}
		m.log.Warn("removed sandbox directory at start-up", slog.String("sandbox_id", id), slog.String("why", "orphan: host directory without a container"))
	}
	m.log.Info("sandboxes re-adopted", slog.Int("sandboxes", adopted), slog.Int("warm_pool", len(m.pool.Members())))
	return nil
}

// prober answers the reaper's activity questions from the agents.
type prober struct{ m *Manager }

func (p prober) Probe(ctx context.Context, id string) (Activity, error) {
	sb, err := p.m.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return Activity{}, ErrGone
	case err != nil:
		return Activity{}, err
	case sb.Paused, sb.Hibernated:
		return Activity{}, ErrPaused
	case !sb.Running:
		return Activity{}, ErrNotRunning
	}
	agent, err := p.m.agents.Get(sb.SocketPath)
	if err != nil {
		return Activity{}, err
	}
	info, err := agent.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return Activity{}, agentreach.AgentError(id, err)
	}
	act := Activity{Running: info.GetRunningExecs()}
	if info.GetLastActivity() != nil {
		act.Last = info.GetLastActivity().AsTime()
	}
	return act, nil
}

// stopper removes expired sandboxes for the reaper, recording the reason
// on the container first so that a berthd restarted meanwhile finishes.
type stopper struct{ m *Manager }

func (st stopper) Stop(ctx context.Context, id string, reason Reason) error {
	unlock, err := st.m.lifecycle.Lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := st.m.rt.MarkExpired(ctx, id, reason.String()); err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
		return err
	}
	return st.m.deleteLocked(ctx, id)
}

// Pause pauses an idle sandbox whose idle action is to pause it, or
// hibernates one whose idle action is to hibernate it, when stillIdle:
// for a pause, asked under the lock a call reaching the sandbox waits on
// (agentreach.Reacher.PauseIf); a hibernation ends the calls in flight
// with a typed error rather than freezing them.
func (st stopper) Pause(ctx context.Context, id string, stillIdle func() bool) (bool, error) {
	unlock, err := st.m.lifecycle.Lock(ctx, id)
	if err != nil {
		return false, err
	}
	defer unlock()
	if sb, err := st.m.rt.Get(ctx, id); err == nil && sb.IdleAction == runtime.IdleHibernate {
		if !stillIdle() {
			return false, nil
		}
		_, err := st.m.hibernate(ctx, id, false)
		return err == nil, err
	}
	return st.m.reach.PauseIf(ctx, id, stillIdle)
}
