package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
)

// restarter starts a new task for a sandbox whose task exited without
// berthd asking: the agent is the task's PID 1, so the agent crashing, being
// killed, or being OOM-killed ends the whole task (the kernel kills every
// process of a pid namespace whose init dies). The new task runs on the same
// container and snapshot: files in the sandbox survive, processes and
// memory do not, and the new agent has a new boot id, which makes exec ids
// of the old runtime stale (STALE_HANDLE).
//
// It restarts only runtimes berthd has seen answer (a task that dies while
// CreateSandbox waits for it is CreateSandbox's to report), never a sandbox
// being deleted, and at most Config.TaskRestartLimit times per sandbox within
// Config.TaskRestartWindow, so a sandbox whose agent cannot run stays
// stopped instead of looping.
type restarter struct {
	m      *Manager
	limit  int // restarts per window; < 0 disables restarting
	window time.Duration

	mu       sync.Mutex
	held     map[string]int                // sandboxes being deleted or stopped by berthd
	gone     map[string]tombstone          // sandboxes deleted recently, for late exit events
	running  map[string]context.CancelFunc // a restart is under way; the func aborts it
	restarts map[string][]time.Time        // recent restart times per sandbox
	// asleep holds, per hibernated sandbox, the host pid of the task its
	// hibernation ended (0: any): its exit is the hibernation's.
	asleep map[string]uint32
}

// tombstone is a deleted sandbox's last task: its late exit event is the
// deletion's, and no other task's exit is (a new sandbox of the same id
// has another task).
type tombstone struct {
	at  time.Time
	pid uint32 // the task's host pid; 0 when it had none known
}

func newRestarter(m *Manager) *restarter {
	return &restarter{
		m:        m,
		limit:    m.cfg.TaskRestartLimit,
		window:   m.cfg.TaskRestartWindow,
		held:     make(map[string]int),
		gone:     make(map[string]tombstone),
		running:  make(map[string]context.CancelFunc),
		restarts: make(map[string][]time.Time),
		asleep:   make(map[string]uint32),
	}
}

// hibernating notes that sandbox id is being hibernated, ending its task
// with host pid pid (0: whichever): that task's exit is not restarted.
func (r *restarter) hibernating(id string, pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asleep[id] = pid
}

// woken notes that sandbox id is no longer hibernated (woken, deleted).
func (r *restarter) woken(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.asleep, id)
}

// hold keeps the sandbox's task from being restarted until release is
// called: berthd is about to stop it on purpose.
func (r *restarter) hold(sandboxID string) (release func()) {
	r.mu.Lock()
	r.held[sandboxID]++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.held[sandboxID]--; r.held[sandboxID] <= 0 {
				delete(r.held, sandboxID)
			}
		})
	}
}

// tombstoneTTL is how long a deleted sandbox's exit events are still
// attributed to its deletion: containerd delivers events asynchronously.
const tombstoneTTL = time.Minute

// deleted notes that the sandbox, whose task had host pid pid (0: none
// known), was deleted.
func (r *restarter) deleted(sandboxID string, pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for id, tomb := range r.gone {
		if now.Sub(tomb.at) > tombstoneTTL {
			delete(r.gone, id)
		}
	}
	r.gone[sandboxID] = tombstone{at: now, pid: pid}
	delete(r.restarts, sandboxID)
}

// abort cancels a restart of the sandbox under way, as its deletion does:
// the restart holds the sandbox's lifecycle lock while it waits for the new
// agent, and the delete need not wait for that.
func (r *restarter) abort(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cancel := r.running[sandboxID]; cancel != nil {
		cancel()
	}
}

// created notes that a sandbox of this id was (re)created: exits of its
// tasks are no longer the old deletion's.
func (r *restarter) created(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gone, sandboxID)
}

// onExit decides about a task exit and, when the task is to be restarted,
// marks the restart as under way before returning (exec streams that see
// the exit next wait for the new runtime) and starts it in the background.
// It never blocks.
func (r *restarter) onExit(ev runtime.TaskEvent) runtimes.ExitDecision {
	r.mu.Lock()
	defer r.mu.Unlock()
	if tomb, ok := r.gone[ev.SandboxID]; r.held[ev.SandboxID] > 0 ||
		(ok && time.Since(tomb.at) < tombstoneTTL && (tomb.pid == 0 || ev.Pid == 0 || tomb.pid == ev.Pid)) {
		return runtimes.ExitDeleting
	}
	if pid, ok := r.asleep[ev.SandboxID]; ok && (pid == 0 || ev.Pid == 0 || pid == ev.Pid) {
		return runtimes.ExitHibernating
	}
	if _, restarting := r.running[ev.SandboxID]; r.limit < 0 || restarting {
		if restarting {
			return runtimes.ExitRestarting
		}
		return runtimes.ExitLeftStopped
	}
	cur := r.m.ids.Current(ev.SandboxID)
	if cur.BootID == "" || cur.TaskPID != ev.Pid {
		return runtimes.ExitLeftStopped
	}
	now := time.Now()
	recent := r.restarts[ev.SandboxID][:0]
	for _, at := range r.restarts[ev.SandboxID] {
		if now.Sub(at) < r.window {
			recent = append(recent, at)
		}
	}
	if len(recent) >= r.limit {
		r.restarts[ev.SandboxID] = recent
		r.m.log.Warn("sandbox task exited again; not restarting it",
			slog.String("sandbox_id", ev.SandboxID), slog.Int("restarts", len(recent)), slog.Duration("window", r.window),
			slog.Uint64("exit_status", uint64(ev.ExitStatus)))
		return runtimes.ExitLeftStopped
	}
	r.restarts[ev.SandboxID] = append(recent, now)
	// Back off within a burst of exits: 0, 200 ms, 400 ms, ...
	delay := time.Duration(len(recent)) * 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(r.m.bgCtx, r.m.cfg.AgentReadyTimeout+delay)
	r.running[ev.SandboxID] = cancel
	r.m.ids.SetRestarting(ev.SandboxID, true)
	r.m.bg.Add(1)
	go func() {
		defer r.m.bg.Done()
		defer cancel()
		r.restart(ctx, ev, cur, delay)
	}()
	return runtimes.ExitRestarting
}

// restart starts the new task and waits for its agent to answer.
func (r *restarter) restart(ctx context.Context, ev runtime.TaskEvent, old apierr.Runtime, delay time.Duration) {
	id := ev.SandboxID
	defer func() {
		r.mu.Lock()
		delete(r.running, id)
		r.mu.Unlock()
		r.m.ids.SetRestarting(id, false)
	}()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return
	}
	// Deletes of the sandbox, and creations of a new one of its id, run
	// under its lifecycle lock: never beside a restart.
	unlock, err := r.m.lifecycle.Lock(ctx, id)
	if err != nil {
		return
	}
	defer unlock()
	r.mu.Lock()
	held := r.held[id] > 0
	r.mu.Unlock()
	if held {
		return
	}
	began := time.Now()
	next, err := r.start(ctx, id, ev.Pid, ev.At)
	if err != nil {
		if errors.Is(err, runtime.ErrSandboxNotFound) || errors.Is(err, runtime.ErrTaskReplaced) {
			return // deleted, and maybe made anew, meanwhile
		}
		r.m.log.Error("restart sandbox task", slog.String("sandbox_id", id), slog.Any("error", err))
		return
	}
	r.m.obs.AgentRestarted()
	r.m.log.Info("sandbox task restarted",
		slog.String("sandbox_id", id),
		slog.Uint64("exit_status", uint64(ev.ExitStatus)),
		slog.String("old_agent_boot_id", old.BootID), slog.String("agent_boot_id", next.BootID),
		slog.Uint64("task_pid", uint64(next.TaskPID)), slog.Duration("took", time.Since(began)))
}

// start starts a new task for the sandbox in place of the one with host pid
// dead, which exited at deadAt (zero when unknown), and returns its runtime
// once the agent answers.
func (r *restarter) start(ctx context.Context, id string, dead uint32, deadAt time.Time) (apierr.Runtime, error) {
	exited := r.m.events.Watch(id)
	defer r.m.events.Unwatch(exited)
	pid, err := r.m.rt.RestartTask(ctx, id, dead)
	if err != nil {
		return apierr.Runtime{}, err
	}
	started, _ := procfs.StartTime(pid)
	r.m.events.Expect(exited, pid, started)
	socket := r.m.rt.SocketPath(id)
	// The old connection is in backoff after the old agent died; dial the
	// new one now.
	r.m.agents.ResetBackoff(socket)
	agent, err := r.m.agents.Get(socket)
	if err != nil {
		return apierr.Runtime{}, err
	}
	type answer struct {
		info *agentv1.InfoResponse
		err  error
	}
	answered := make(chan answer, 1)
	infoCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		info, err := agent.Info(infoCtx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		answered <- answer{info, err}
	}()
	select {
	case a := <-answered:
		if a.err != nil {
			return apierr.Runtime{}, fmt.Errorf("agent of restarted sandbox %s did not answer: %w%s", id, a.err, r.m.logTail(id))
		}
		next := apierr.Runtime{BootID: a.info.GetBootId(), TaskPID: pid, AgentVersion: a.info.GetVersion()}
		next.StartedAt, _ = procfs.StartTime(pid)
		if !next.StartedAt.IsZero() && next.StartedAt.Before(deadAt) {
			// It was made after the old task's exit was seen: the clock
			// tick the kernel counts in rounded it down past that.
			next.StartedAt = deadAt
		}
		r.m.ids.Observe(id, next)
		return next, nil
	case <-r.m.events.Fired(exited):
		cancel()
		<-answered
		ev, _, _ := r.m.events.Result(exited)
		return apierr.Runtime{}, fmt.Errorf("restarted task of sandbox %s exited with status %d before its agent answered%s", id, ev.ExitStatus, r.m.logTail(id))
	}
}
