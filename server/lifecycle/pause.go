package lifecycle

import (
	"context"
	"fmt"

	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// Pause freezes every process of sandbox id for caller p (PauseSandbox);
// see agentreach.Reacher.Pause. It runs under the sandbox's lifecycle
// lock: a pause never freezes a sandbox whose creation, restart or removal
// is under way. A sandbox p may not see is runtime.ErrSandboxNotFound.
func (m *Manager) Pause(ctx context.Context, id string, p auth.Principal) error {
	return m.freeze(ctx, id, p, true)
}

// Resume thaws sandbox id for caller p (ResumeSandbox), as Pause.
func (m *Manager) Resume(ctx context.Context, id string, p auth.Principal) error {
	return m.freeze(ctx, id, p, false)
}

func (m *Manager) freeze(ctx context.Context, id string, p auth.Principal, pause bool) error {
	unlock, err := m.lockSeen(ctx, id, p)
	if err != nil {
		return err
	}
	defer unlock()
	switch {
	case m.reach.Hibernated(id) && pause:
		return nil // holds less than a paused sandbox: left hibernated
	case m.reach.Hibernated(id):
		return m.wakeLocked(ctx, id)
	}
	return m.pause(ctx, id, pause)
}

// lockSeen takes sandbox id's lifecycle lock for caller p and returns the
// function that releases it; a sandbox p may not see is
// runtime.ErrSandboxNotFound (the lock released).
func (m *Manager) lockSeen(ctx context.Context, id string, p auth.Principal) (func(), error) {
	unlock, err := m.lifecycle.Lock(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", id, err)
	}
	if seen, err := m.sees(ctx, id, p); !seen {
		unlock()
		if err == nil {
			err = fmt.Errorf("%w: %s", runtime.ErrSandboxNotFound, id)
		}
		return nil, err
	}
	return unlock, nil
}

// pause pauses or resumes sandbox id; the caller holds its lifecycle lock.
func (m *Manager) pause(ctx context.Context, id string, pause bool) error {
	if pause {
		return m.reach.Pause(ctx, id)
	}
	return m.reach.Resume(ctx, id)
}
