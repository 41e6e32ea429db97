package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// deleteSandbox removes the sandbox under its lifecycle lock.
func (m *Manager) deleteSandbox(ctx context.Context, id string) error {
	unlock, err := m.lifecycle.Lock(ctx, id)
	if err != nil {
		return fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", id, err)
	}
	defer unlock()
	return m.deleteLocked(ctx, id)
}

// deleteLocked removes the sandbox; the caller holds its lifecycle lock.
func (m *Manager) deleteLocked(ctx context.Context, id string) error {
	var pid uint32
	member := false
	if sb, err := m.rt.Get(ctx, id); err == nil {
		pid, member = sb.TaskPID, sb.Pooled
	}
	done := m.deletingSandbox(id, pid)
	defer done()
	m.agents.Forget(m.rt.SocketPath(id))
	if err := m.rt.Delete(ctx, id); err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
		return err
	}
	m.detachNetwork(ctx, id)
	m.reaper.Forget(id)
	m.reach.SetPaused(id, false)
	m.reach.SetHibernated(id, false)
	m.restarts.woken(id)
	m.release(ctx, id)
	m.forgetStandby(ctx, id)
	if !member {
		// Room freed: standby members refused for it may be made.
		m.pool.Freed()
	}
	return nil
}

// detachNetwork removes sandbox id's network, if it has one. A failure is
// logged: what is left is removed as an orphan at berthd's next start.
func (m *Manager) detachNetwork(ctx context.Context, id string) {
	if m.cfg.Network == nil {
		return
	}
	if err := m.cfg.Network.Detach(ctx, id); err != nil {
		m.log.Error("remove the sandbox's network", slog.String("sandbox_id", id), slog.Any("error", err))
	}
}

// deletingSandbox is called before berthd removes a sandbox: its task is not
// restarted from now on. Call done when the removal returned: when the
// sandbox is gone, what berthd remembers of its runtimes is dropped, and
// late exit events of its task are still known as the deletion's.
//
// pid is the host pid of the sandbox's task being removed (0: none known):
// its exit is the deletion's, whenever containerd reports it.
func (m *Manager) deletingSandbox(id string, pid uint32) (done func()) {
	release := m.restarts.hold(id)
	return func() {
		ctx, cancel := context.WithTimeout(m.bgCtx, m.cfg.ConnectBudget)
		defer cancel()
		if _, err := m.rt.Get(ctx, id); errors.Is(err, runtime.ErrSandboxNotFound) {
			m.ids.Forget(id)
			m.events.Forget(id)
			m.restarts.deleted(id, pid)
		}
		release()
	}
}

// Delete removes sandbox id for caller p. A missing sandbox is not an
// error, and neither is one p may not see, which stays untouched: the
// answer is the same as for a missing one. A creation of the id in
// progress is canceled, and fails with runtime.ErrSandboxNotFound ("deleted
// while it was being created"); so is a task restart under way.
func (m *Manager) Delete(ctx context.Context, id string, p auth.Principal) error {
	m.mu.Lock()
	c := m.creating[id]
	if c != nil && p.Sees(c.spec.Owner) {
		// The creation holds the sandbox's lifecycle lock: cancel it, so
		// that the delete runs now instead of after it.
		c.deleted.Store(true)
		c.cancel()
	}
	m.mu.Unlock()
	if c != nil && !p.Sees(c.spec.Owner) {
		return nil
	}
	if c == nil {
		// A restart holds the lifecycle lock while its agent starts:
		// cancel it too, if the sandbox is the caller's.
		if seen, err := m.sees(ctx, id, p); !seen {
			return err
		}
		m.restarts.abort(id)
	}
	unlock, err := m.lifecycle.Lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	// Whose the sandbox is, under the lock: no other principal's sandbox
	// of the id can appear between this check and the removal. A missing
	// sandbox (or one a canceled creation removed) leaves nothing to do.
	if seen, err := m.sees(ctx, id, p); !seen {
		return err
	}
	if err := m.deleteLocked(ctx, id); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "sandbox deleted", slog.String("sandbox_id", id), slog.String("principal", p.String()))
	return nil
}

// sees reports whether containerd holds sandbox id and p may see it; the
// error is containerd's failure to say (a missing sandbox is no error).
func (m *Manager) sees(ctx context.Context, id string, p auth.Principal) (bool, error) {
	sb, err := m.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return p.Sees(sb.Owner), nil
}
