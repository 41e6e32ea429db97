package server

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/berth-sandbox/berth/server/runtime"
)

// watchRuntimes sets up what detects the runtime conditions of errors.go —
// the runtime identities (and their journal), the capacity accounting, the
// task restarter — and starts following containerd's task events.
func (s *Service) watchRuntimes() {
	if s.cfg.JournalDir != "" {
		if err := os.MkdirAll(s.cfg.JournalDir, 0o700); err != nil {
			s.log.Error("runtime journal unavailable; exec ids of earlier runtimes are remembered in memory only",
				slog.String("dir", s.cfg.JournalDir), slog.Any("error", err))
			s.cfg.JournalDir = ""
		}
	}
	s.ids = newIdentities(s.cfg.JournalDir, s.log)
	s.capacity = newCapacity(s.cfg, s.rt.MemoryPromised)
	s.restarts = newRestarter(s)
	s.events = newTaskEvents(s.rt, s.log)
	s.events.onGone = func(ev runtime.TaskEvent) { s.ids.taskGone(ev.SandboxID, ev.Pid) }
	s.events.onExit = s.restarts.onExit
	s.bg.Add(2)
	go func() {
		defer s.bg.Done()
		s.events.run(s.bgCtx)
	}()
	go func() {
		defer s.bg.Done()
		// Journals of sandboxes deleted while berthd was down.
		if live, err := s.rt.MemoryPromised(s.bgCtx); err == nil {
			s.ids.pruneJournals(live)
		}
	}()
}

// sandboxCreated records the runtime of a sandbox whose agent just answered
// for the first time: from then on berthd restarts its task when it dies.
func (s *Service) sandboxCreated(id string, boot, version string) {
	s.restarts.created(id)
	sb, err := s.rt.Get(s.bgCtx, id)
	if err != nil || !sb.Running {
		return
	}
	rt := identity{BootID: boot, TaskPID: sb.TaskPID, AgentVersion: version}
	rt.StartedAt, _ = procStartTime(sb.TaskPID)
	s.ids.observe(id, rt)
}

// deletingSandbox is called before berthd removes a sandbox: its task is not
// restarted from now on. Call done when the removal returned: when the
// sandbox is gone, what berthd remembers of its runtimes is dropped, and
// late exit events of its task are still known as the deletion's.
//
// pid is the host pid of the sandbox's task being removed (0: none known):
// its exit is the deletion's, whenever containerd reports it.
func (s *Service) deletingSandbox(id string, pid uint32) (done func()) {
	release := s.restarts.hold(id)
	return func() {
		ctx, cancel := context.WithTimeout(s.bgCtx, s.cfg.ConnectBudget)
		defer cancel()
		if _, err := s.rt.Get(ctx, id); errors.Is(err, runtime.ErrSandboxNotFound) {
			s.ids.forget(id)
			s.events.forget(id)
			s.restarts.deleted(id, pid)
		}
		release()
	}
}
