package agentreach

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
)

// A hibernated sandbox has no task (runtime.Hibernate): its processes
// ended, its container and files are kept. The Reacher keeps which
// sandboxes are hibernated, so that Reach wakes one — Waker starts a new
// task and waits for its agent — before it asks its agent anything, or
// refuses with SANDBOX_HIBERNATED when the caller asked not to
// (resume.Header). The lifecycle engine tells it what it found at
// adoption (SetHibernated).

func (p *pauses) setAsleep(id string, asleep bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.asleep == nil {
		p.asleep = make(map[string]bool)
	}
	if asleep {
		p.asleep[id] = true
	} else {
		delete(p.asleep, id)
	}
}

func (p *pauses) isAsleep(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asleep[id]
}

// Hibernate releases sandbox id's memory and CPU (runtime.Hibernate:
// under gVisor its memory is checkpointed, under runc and when that fails
// every process ends; a paused sandbox included) and returns what it did.
// noMemory, when not nil, says why a gVisor sandbox's memory is not to be
// kept (runtime.KeepMemory.Refused).
// A hibernated sandbox stays so (no error). The caller decided that its
// caller may see the sandbox, and holds its lifecycle lock. Errors:
// runtime.ErrSandboxNotFound, runtime.ErrTaskNotRunning, containerd's.
func (r *Reacher) Hibernate(ctx context.Context, id string, noMemory error, mustKeepMemory bool) (runtime.Hibernation, error) {
	unlock := r.pauses.lock(id)
	defer unlock()
	was := r.pauses.isAsleep(id)
	h, err := r.freezer.Hibernate(ctx, id, runtime.KeepMemory{Ask: r.quiescer(id), Refused: noMemory, Must: mustKeepMemory})
	if err != nil {
		if errors.Is(err, runtime.ErrSandboxNotFound) {
			r.pauses.set(id, false)
			r.pauses.setAsleep(id, false)
		}
		return runtime.Hibernation{}, err
	}
	r.pauses.setAsleep(id, true)
	r.pauses.set(id, false) // not paused: wakes the PauseWatch waiters
	if r.OnPause != nil {
		r.OnPause(id, true) // the idle clock stands still, as for a pause
	}
	switch {
	case was:
	case h.Kept == runtime.HibernatedMemoryKept:
		r.log.InfoContext(ctx, "sandbox hibernated: memory checkpointed, task removed", slog.String("sandbox_id", id),
			slog.Uint64("task_pid", uint64(h.TaskPID)), slog.Duration("checkpoint_took", h.Saved), slog.Duration("took", h.Took))
	case h.NotKept != "":
		r.log.WarnContext(ctx, "sandbox hibernated: memory checkpoint failed, processes ended, filesystem kept", slog.String("sandbox_id", id),
			slog.Uint64("task_pid", uint64(h.TaskPID)), slog.String("checkpoint_error", h.NotKept), slog.Duration("took", h.Took))
	default:
		r.log.InfoContext(ctx, "sandbox hibernated: processes ended, filesystem kept", slog.String("sandbox_id", id),
			slog.Uint64("task_pid", uint64(h.TaskPID)), slog.Duration("took", h.Took))
	}
	return h, nil
}

// quiescer returns how runtime.Hibernate asks sandbox id's agent to
// quiesce: its Quiesce RPC on berthd's connection to it, which the agent
// closes as it answers (UNAVAILABLE once sent: taken, the agent's mark
// decides).
func (r *Reacher) quiescer(id string) runtime.Quiescer {
	return func(ctx context.Context, token, proof []byte) error {
		agent, err := r.agents.Get(r.rt.SocketPath(id))
		if err != nil {
			return err
		}
		_, err = agent.Quiesce(ctx, &agentv1.QuiesceRequest{WakeToken: token, Proof: proof}, grpc.WaitForReady(true))
		if status.Code(err) == codes.Unavailable {
			return nil
		}
		return err
	}
}

// Hibernated reports whether sandbox id is hibernated, as berthd
// hibernated it or found it at adoption.
func (r *Reacher) Hibernated(id string) bool { return r.pauses.isAsleep(id) }

// SetHibernated records whether sandbox id is hibernated (adoption, wake,
// removal).
func (r *Reacher) SetHibernated(id string, hibernated bool) { r.pauses.setAsleep(id, hibernated) }

// wakeHibernated wakes sandbox id before a call that needs its agent, when
// it is hibernated (as berthd knows, or as containerd's record says:
// recorded), and reports whether it did. A caller that asked not to
// (resume.Header) gets FAILED_PRECONDITION SANDBOX_HIBERNATED, and the
// sandbox stays hibernated; a wake whose new task did not start is an
// *apierr.Unreachable (TASK_STOPPED, nothing ran).
func (r *Reacher) wakeHibernated(ctx context.Context, id, execID string, recorded bool) (bool, error) {
	if !recorded && !r.pauses.isAsleep(id) {
		return false, nil
	}
	if resume.Refused(ctx) {
		meta := map[string]string{"sandbox_id": id}
		if execID != "" {
			meta["exec_id"] = execID
		}
		return false, apierr.New(codes.FailedPrecondition, rpcstatus.ReasonSandboxHibernated,
			fmt.Sprintf("sandbox %s is hibernated (its processes ended, its files kept) and the call asked not to wake it (metadata %s: true); ResumeSandbox wakes it", id, resume.Header), meta)
	}
	if r.Waker == nil {
		return false, fmt.Errorf("sandbox %s is hibernated and this berthd cannot wake it", id)
	}
	if recorded {
		r.pauses.setAsleep(id, true) // found so in containerd: the Waker wakes what it knows asleep
	}
	if err := r.Waker(ctx, id); err != nil {
		var busy *apierr.FleetBusy
		if errors.Is(err, runtime.ErrSandboxNotFound) || errors.As(err, &busy) || ctx.Err() != nil {
			return false, err // FLEET_BUSY: its memory does not fit; it stays hibernated
		}
		return false, &apierr.Unreachable{SandboxID: id, ExecID: execID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED,
			Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, What: "the sandbox was hibernated and its new task did not start: " + err.Error()}
	}
	return true, nil
}
