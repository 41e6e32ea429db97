package agentreach

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
)

// A paused sandbox's processes are frozen (runtime.Pause: the cgroup
// freezer under runc, runsc pause under gVisor): its agent cannot answer,
// yet it is neither unreachable nor busy. The Reacher keeps which
// sandboxes are paused, so that Reach resumes one before it asks its agent
// anything (or refuses with SANDBOX_PAUSED when the caller asked not to,
// resume.Header), and Watches wait for a paused agent rather than call it
// unreachable. A task stays paused across a berthd restart (its cgroup stays
// frozen): the lifecycle engine tells the Reacher what it found at adoption
// (SetPaused).

// freezer is what pausing needs of the runtime (*runtime.Runtime).
type freezer interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	Hibernate(ctx context.Context, id string, keep runtime.KeepMemory) (runtime.Hibernation, error)
}

// pauses holds the paused sandboxes and serializes pauses and resumes of
// one sandbox.
type pauses struct {
	mu     sync.Mutex
	paused map[string]bool
	locks  map[string]*idLock
	// changed holds, for a sandbox someone watches (watch), the channel
	// closed at the next set of its state.
	changed map[string]chan struct{}
	// asleep holds the hibernated sandboxes (hibernate.go).
	asleep map[string]bool
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock takes sandbox id's pause lock; call the returned function to
// release it.
func (p *pauses) lock(id string) func() {
	p.mu.Lock()
	if p.locks == nil {
		p.locks = make(map[string]*idLock)
	}
	l := p.locks[id]
	if l == nil {
		l = &idLock{}
		p.locks[id] = l
	}
	l.refs++
	p.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		p.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(p.locks, id)
		}
		p.mu.Unlock()
	}
}

func (p *pauses) set(id string, paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(map[string]bool)
	}
	if paused {
		p.paused[id] = true
	} else {
		delete(p.paused, id)
	}
	// Every set wakes the watchers, who read the state again; a removed
	// sandbox's set (not paused) so leaves no channel behind.
	if ch, ok := p.changed[id]; ok {
		close(ch)
		delete(p.changed, id)
	}
}

// watch returns whether sandbox id is paused and a channel closed when
// its state is next set.
func (p *pauses) watch(id string) (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(map[string]chan struct{})
	}
	ch, ok := p.changed[id]
	if !ok {
		ch = make(chan struct{})
		p.changed[id] = ch
	}
	return p.paused[id], ch
}

func (p *pauses) get(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused[id]
}

// settled returns whether sandbox id is paused once a pause or resume of
// it under way (holding its lock) has finished: containerd may have frozen
// the task already while the pause is not yet recorded.
func (p *pauses) settled(id string) bool {
	p.mu.Lock()
	_, busy := p.locks[id]
	paused := p.paused[id]
	p.mu.Unlock()
	if !busy {
		return paused
	}
	p.lock(id)()
	return p.get(id)
}

// Pause freezes every process of sandbox id and returns once they are
// frozen; a paused sandbox stays paused (no error). The caller decided
// that its caller may see the sandbox. Errors: runtime.ErrSandboxNotFound,
// runtime.ErrTaskNotRunning, containerd's.
func (r *Reacher) Pause(ctx context.Context, id string) error {
	return r.freeze(ctx, id, true)
}

// Resume thaws sandbox id; a running sandbox stays running (no error).
// Errors as for Pause.
func (r *Reacher) Resume(ctx context.Context, id string) error {
	return r.freeze(ctx, id, false)
}

// PauseIf pauses sandbox id as Pause does when ok, asked under the lock
// that a call reaching the sandbox waits on (wake), still reports true:
// the idle reaper's verdict, checked again where no request can slip in
// between the check and the freeze and then find its agent frozen. It
// reports whether it paused.
func (r *Reacher) PauseIf(ctx context.Context, id string, ok func() bool) (bool, error) {
	unlock := r.pauses.lock(id)
	defer unlock()
	if !ok() {
		return false, nil
	}
	return true, r.freezeLocked(ctx, id, true)
}

func (r *Reacher) freeze(ctx context.Context, id string, pause bool) error {
	unlock := r.pauses.lock(id)
	defer unlock()
	return r.freezeLocked(ctx, id, pause)
}

// freezeLocked is freeze under sandbox id's pause lock.
func (r *Reacher) freezeLocked(ctx context.Context, id string, pause bool) error {
	began := time.Now()
	var err error
	if pause {
		err = r.freezer.Pause(ctx, id)
	} else {
		err = r.freezer.Resume(ctx, id)
	}
	if err != nil {
		if errors.Is(err, runtime.ErrSandboxNotFound) || errors.Is(err, runtime.ErrTaskNotRunning) {
			r.pauses.set(id, false)
		}
		return err
	}
	was := r.pauses.get(id)
	r.pauses.set(id, pause)
	if r.OnPause != nil {
		r.OnPause(id, pause)
	}
	if was != pause {
		what := "sandbox resumed"
		if pause {
			what = "sandbox paused"
		}
		r.log.InfoContext(ctx, what, slog.String("sandbox_id", id), slog.Duration("took", time.Since(began)))
	}
	return nil
}

// Paused reports whether sandbox id is paused, as berthd paused it or
// found it at adoption.
func (r *Reacher) Paused(id string) bool { return r.pauses.get(id) }

// PauseWatch returns whether sandbox id is paused and a channel closed
// when berthd next pauses, resumes or forgets it, so that a waiter learns
// of a change without polling.
func (r *Reacher) PauseWatch(id string) (paused bool, changed <-chan struct{}) {
	return r.pauses.watch(id)
}

// SetPaused records what the runtime says of sandbox id's task: paused or
// not (adoption, removal).
func (r *Reacher) SetPaused(id string, paused bool) { r.pauses.set(id, paused) }

// wake resumes sandbox id before a call that needs its agent, when it is
// paused (as berthd knows once a pause under way has finished, or as
// containerd's record says: recorded). A
// caller that asked not to (resume.Header) gets FAILED_PRECONDITION
// SANDBOX_PAUSED, and the sandbox stays paused. The caller of Reach may
// see the sandbox: that was decided before.
func (r *Reacher) wake(ctx context.Context, id, execID string, recorded bool) error {
	if !recorded && !r.pauses.settled(id) {
		return nil
	}
	if resume.Refused(ctx) {
		meta := map[string]string{"sandbox_id": id}
		if execID != "" {
			meta["exec_id"] = execID
		}
		return apierr.New(codes.FailedPrecondition, rpcstatus.ReasonSandboxPaused,
			fmt.Sprintf("sandbox %s is paused and the call asked not to resume it (metadata %s: true); ResumeSandbox resumes it", id, resume.Header), meta)
	}
	err := r.Resume(ctx, id)
	if errors.Is(err, runtime.ErrTaskNotRunning) {
		return &apierr.Unreachable{SandboxID: id, ExecID: execID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED,
			Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, What: "the sandbox was paused and its task is no longer running: " + err.Error()}
	}
	return err
}
