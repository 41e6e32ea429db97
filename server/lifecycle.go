package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/fleet"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/protobuf/types/known/timestamppb"
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
func (s *Service) Adopt(ctx context.Context) error {
	sbs, err := s.rt.List(ctx, nil)
	if err != nil {
		return fmt.Errorf("re-adopt sandboxes: %w", err)
	}
	known := make(map[string]bool, len(sbs))
	adopted := 0
	for _, sb := range sbs {
		known[sb.ID] = true
		log := s.log.With(slog.String("sandbox_id", sb.ID))
		var why string
		switch {
		case sb.Expired != "":
			why = "it expired (" + sb.Expired + ") before berthd stopped"
		case !sb.Running:
			why = "orphan: container without a running task"
		case sb.Pooled && !s.pool.Adopt(sb.Image, sb.ID):
			why = "warm-pool member beyond the pool's size for its image"
		case sb.Pooled:
			log.Info("warm-pool member re-adopted", slog.String("image", sb.Image))
			continue
		default:
			s.track(sb)
			adopted++
			info, err := s.agentInfoErr(ctx, sb)
			if err != nil {
				log.Warn("sandbox re-adopted; its agent does not answer yet", slog.Any("error", err))
				continue
			}
			log.Info("sandbox re-adopted", slog.String("agent_boot_id", info.GetBootId()), slog.Uint64("running_execs", uint64(info.GetRunningExecs())))
			continue
		}
		if err := s.deleteSandbox(ctx, sb.ID); err != nil {
			log.Error("remove sandbox at start-up", slog.String("why", why), slog.Any("error", err))
			continue
		}
		log.Warn("removed sandbox at start-up", slog.String("why", why))
	}
	dirs, err := s.rt.HostDirs()
	if err != nil {
		return fmt.Errorf("re-adopt sandboxes: %w", err)
	}
	for _, id := range dirs {
		if known[id] {
			continue
		}
		// Re-check: a sandbox created since the listing has a directory
		// before its container.
		if _, err := s.rt.Get(ctx, id); !errors.Is(err, runtime.ErrSandboxNotFound) {
			continue
		}
		if err := s.rt.RemoveHostDir(id); err != nil {
			s.log.Error("remove orphaned sandbox directory", slog.String("sandbox_id", id), slog.Any("error", err))
			continue
		}
		s.log.Warn("removed sandbox directory at start-up", slog.String("sandbox_id", id), slog.String("why", "orphan: host directory without a container"))
	}
	s.log.Info("sandboxes re-adopted", slog.Int("sandboxes", adopted), slog.Int("warm_pool", len(s.pool.Members())))
	return nil
}

// KeepAlive records activity in the sandbox and, with hold_for, holds off
// its idle timeout; the hold is stored in its labels so that a restarted
// berthd keeps it.
func (s *Service) KeepAlive(ctx context.Context, req *berthv1.KeepAliveRequest) (*berthv1.KeepAliveResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	var hold time.Duration
	if h := req.GetHoldFor(); h != nil {
		if err := h.CheckValid(); err != nil {
			return nil, rpcstatus.InvalidArgument("hold_for", err.Error())
		}
		hold = h.AsDuration()
		if hold < 0 || hold > s.cfg.MaxIdleTimeout {
			return nil, rpcstatus.InvalidArgument("hold_for", fmt.Sprintf("%v is outside 0 to the server's maximum idle timeout %v", hold, s.cfg.MaxIdleTimeout))
		}
	}
	if _, err := s.visibleSandbox(ctx, id); err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	if hold > 0 {
		until := time.Now().Add(hold)
		if err := s.rt.SetHoldUntil(ctx, id, until); err != nil {
			return nil, s.toStatus(ctx, err, meta)
		}
		s.reaper.Hold(id, until)
	} else {
		s.reaper.Touch(id)
	}
	resp := &berthv1.KeepAliveResponse{}
	if st, ok := s.reaper.Status(id); ok {
		if !st.IdleDeadline.IsZero() {
			resp.IdleExpiresAt = timestamppb.New(st.IdleDeadline)
		}
		if !st.ExpiresAt.IsZero() {
			resp.ExpiresAt = timestamppb.New(st.ExpiresAt)
		}
	}
	return resp, nil
}

// prober answers the reaper's activity questions from the agents.
type prober struct{ s *Service }

func (p prober) Probe(ctx context.Context, id string) (fleet.Activity, error) {
	sb, err := p.s.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return fleet.Activity{}, fleet.ErrGone
	case err != nil:
		return fleet.Activity{}, err
	case !sb.Running:
		return fleet.Activity{}, fleet.ErrNotRunning
	}
	agent, err := p.s.agents.Get(sb.SocketPath)
	if err != nil {
		return fleet.Activity{}, err
	}
	info, err := agent.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return fleet.Activity{}, agentError(id, err)
	}
	act := fleet.Activity{Running: info.GetRunningExecs()}
	if info.GetLastActivity() != nil {
		act.Last = info.GetLastActivity().AsTime()
	}
	return act, nil
}

// stopper removes expired sandboxes for the reaper, recording the reason
// on the container first so that a berthd restarted meanwhile finishes.
type stopper struct{ s *Service }

func (st stopper) Stop(ctx context.Context, id string, reason fleet.Reason) error {
	unlock, err := st.s.lifecycle.Lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := st.s.rt.MarkExpired(ctx, id, reason.String()); err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
		return err
	}
	return st.s.deleteLocked(ctx, id)
}
