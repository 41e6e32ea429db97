package runtimes

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/server/runtime"
)

// TaskEvents follows containerd's task events in berthd's namespace and
// tells whoever watches a sandbox when its task exits: exec streams end
// with RUNTIME_REPLACED within milliseconds of the exit instead of waiting
// for a timeout, and the restarter starts a new task.
//
// containerd does not replay events to a late subscriber. After the
// subscription breaks, run resubscribes and re-checks every watched
// sandbox's task, so that an exit missed in between still fires.
type TaskEvents struct {
	rt  taskSource
	log *slog.Logger
	// OnGone is called for every task exit and delete, first.
	OnGone func(runtime.TaskEvent)
	// OnExit is called for every task exit before any watch fires, and
	// returns what berthd does about it; see ExitDecision.
	OnExit func(runtime.TaskEvent) ExitDecision

	mu      sync.Mutex
	watches map[string]map[*Watch]struct{}
	// oom records the last OOM kill seen per sandbox.
	oom map[string]time.Time
}

// ExitDecision is what berthd does about a task exit.
type ExitDecision int

const (
	// ExitLeftStopped: the sandbox stays stopped (restarts disabled, the
	// crash-loop bound reached, or a runtime berthd never saw answer).
	ExitLeftStopped ExitDecision = iota
	// ExitRestarting: berthd is starting a new task for the sandbox.
	ExitRestarting
	// ExitDeleting: the sandbox is being deleted.
	ExitDeleting
	// ExitHibernating: the sandbox is being hibernated (its processes end,
	// its container is kept; a later call starts a new task).
	ExitHibernating
)

// Watch is one watcher's interest in a sandbox's task. fired is closed
// once the watched task exited (or the sandbox's task was deleted); event
// then says how.
type Watch struct {
	sandboxID string
	fired     chan struct{}

	// Guarded by TaskEvents.mu.
	pid      uint32    // the task pid watched; 0 watches any
	started  time.Time // when the watched task started; zero when unknown
	done     bool
	event    runtime.TaskEvent
	decision ExitDecision
}

// taskSource is what TaskEvents needs of containerd (runtime.Runtime).
type taskSource interface {
	TaskEvents(ctx context.Context) (<-chan runtime.TaskEvent, <-chan error)
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
}

func NewTaskEvents(rt taskSource, log *slog.Logger) *TaskEvents {
	return &TaskEvents{
		rt:      rt,
		log:     log,
		OnGone:  func(runtime.TaskEvent) {},
		OnExit:  func(runtime.TaskEvent) ExitDecision { return ExitLeftStopped },
		watches: make(map[string]map[*Watch]struct{}),
		oom:     make(map[string]time.Time),
	}
}

// Watch starts watching the sandbox's task. Call expect once the task's pid
// is known, and unwatch when done.
func (t *TaskEvents) Watch(sandboxID string) *Watch {
	w := &Watch{sandboxID: sandboxID, fired: make(chan struct{})}
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.watches[sandboxID]
	if ws == nil {
		ws = make(map[*Watch]struct{})
		t.watches[sandboxID] = ws
	}
	ws[w] = struct{}{}
	return w
}

// Expect narrows w to the task with host pid pid that started at started
// (zero when unknown): a task is known by its identity, never by its
// sandbox id alone. It reports false when w already fired for that task
// (or for an unknown one): the task is gone. An exit of another task seen
// before — a runtime older than the one just reached, or an earlier
// process that had the same pid — is forgotten.
func (t *TaskEvents) Expect(w *Watch, pid uint32, started time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w.pid, w.started = pid, started
	if w.done && w.event.Pid != 0 && !w.matches(w.event) {
		// The exit was of an older task; re-arm.
		w.done = false
		w.event = runtime.TaskEvent{}
		w.fired = make(chan struct{})
		return true
	}
	return !w.done
}

// matches reports whether ev can be the exit of w's task: the same pid,
// and not before the task started. The caller holds TaskEvents.mu.
func (w *Watch) matches(ev runtime.TaskEvent) bool {
	if w.pid == 0 || ev.Pid == 0 {
		return true
	}
	if w.pid != ev.Pid {
		return false
	}
	return w.started.IsZero() || ev.At.IsZero() || !ev.At.Before(w.started)
}

// Fired returns the channel closed when w fires.
func (t *TaskEvents) Fired(w *Watch) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return w.fired
}

// Result returns how w's task ended and what berthd does about it; ok is
// false while w has not fired.
func (t *TaskEvents) Result(w *Watch) (ev runtime.TaskEvent, decision ExitDecision, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return w.event, w.decision, w.done
}

func (t *TaskEvents) Unwatch(w *Watch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ws := t.watches[w.sandboxID]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(t.watches, w.sandboxID)
		}
	}
}

// oomWindow is how close to a task's exit an OOM kill must be seen for the
// exit to be blamed on it: when the agent (PID 1) is the victim, containerd
// reports the OOM about 15 ms before the exit (RUNTIME-NOTES.md).
const oomWindow = time.Second

// OOMNear reports whether an OOM kill was seen in the sandbox within
// oomWindow of exitAt, and not before the task that exited started at
// started (zero when unknown): containerd's OOM event names only the
// container, and an earlier sandbox of the same id is not this one.
func (t *TaskEvents) OOMNear(sandboxID string, started, exitAt time.Time) bool {
	if exitAt.IsZero() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.oom[sandboxID]
	return ok && !at.Before(exitAt.Add(-oomWindow)) && !at.After(exitAt.Add(oomWindow)) &&
		(started.IsZero() || !at.Before(started))
}

// Forget drops the OOM record of a deleted sandbox.
func (t *TaskEvents) Forget(sandboxID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.oom, sandboxID)
}

// Run follows containerd's events until ctx ends, resubscribing with a
// bounded backoff when the subscription breaks.
func (t *TaskEvents) Run(ctx context.Context) {
	const (
		minBackoff = 100 * time.Millisecond
		maxBackoff = 5 * time.Second
	)
	backoff := minBackoff
	for first := true; ; first = false {
		began := time.Now()
		// Exits may have been missed while unsubscribed.
		err := t.follow(ctx, !first)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("containerd task events interrupted; resubscribing", slog.Any("error", err), slog.Duration("backoff", backoff))
		if time.Since(began) > time.Minute {
			backoff = minBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// follow dispatches events from one subscription until it ends. With
// resync, it first checks every watched task once the subscription is made
// (events from then on are queued, not lost), and again every resyncRetry
// while containerd cannot answer that check.
func (t *TaskEvents) follow(ctx context.Context, resync bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, errs := t.rt.TaskEvents(ctx)
	var retry <-chan time.Time
	if resync && !t.resync(ctx) {
		retry = time.After(resyncRetry)
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return <-errs
			}
			t.dispatch(ev)
		case <-retry:
			retry = nil
			if !t.resync(ctx) {
				retry = time.After(resyncRetry)
			}
		}
	}
}

// resyncRetry is how soon a resync that containerd could not answer is
// tried again.
const resyncRetry = time.Second

// dispatch acts on one event: records OOM kills, lets OnExit decide about
// exits, then fires the watches of the exited task.
func (t *TaskEvents) dispatch(ev runtime.TaskEvent) {
	switch ev.Kind {
	case runtime.TaskOOM:
		t.mu.Lock()
		t.oom[ev.SandboxID] = ev.At
		t.mu.Unlock()
	case runtime.TaskExited:
		t.OnGone(ev)
		decision := t.OnExit(ev)
		t.fire(ev, decision)
	case runtime.TaskDeleted:
		t.OnGone(ev)
		// A delete follows the exit; it fires only watches that missed it.
		t.fire(ev, ExitDeleting)
	}
}

// fire closes the watches of ev's sandbox that watch ev's task.
func (t *TaskEvents) fire(ev runtime.TaskEvent, decision ExitDecision) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for w := range t.watches[ev.SandboxID] {
		if w.done || !w.matches(ev) {
			continue
		}
		w.done = true
		w.event = ev
		w.decision = decision
		close(w.fired)
	}
}

// resync fires the watches whose task is no longer the sandbox's running
// task, for exits missed while unsubscribed. Only containerd's word that a
// task is gone fires a watch: when it cannot answer (it is down, or slow)
// the sandbox is left for the next resync, and resync reports false.
func (t *TaskEvents) resync(ctx context.Context) (complete bool) {
	t.mu.Lock()
	pids := make(map[string][]uint32)
	for id, ws := range t.watches {
		for w := range ws {
			pids[id] = append(pids[id], w.pid)
		}
	}
	t.mu.Unlock()
	complete = true
	for id, watched := range pids {
		sb, err := t.rt.Get(ctx, id)
		if ctx.Err() != nil {
			return false
		}
		if err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
			complete = false
			continue
		}
		for _, pid := range watched {
			if err == nil && sb.Running && (pid == 0 || pid == sb.TaskPID) {
				continue
			}
			// The exit status and time were lost with the event.
			ev := runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: id, Pid: pid}
			t.OnGone(ev)
			t.fire(ev, ExitLeftStopped)
		}
	}
	return complete
}
