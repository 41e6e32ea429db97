package execsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/wire"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtimes"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
	"github.com/berth-sandbox/berth/server/runtime"
)

const (
	// replacedGrace is how long a broken agent stream waits for
	// containerd's exit event before berthd checks the runtime itself. The
	// event normally arrives within milliseconds of the socket closing:
	// both follow from the agent's death.
	replacedGrace = time.Second
	// afterWait bounds how long a RuntimeReplaced waits for a restarted
	// runtime's agent to answer, to name it in the detail's after.
	afterWait = time.Second
)

// execGuard watches over one exec request, an Exec stream or a Run, from
// before it reaches the agent to its end. It
//
//   - reaches the agent within the connect budget (UNAVAILABLE
//     SANDBOX_UNREACHABLE when it cannot, nothing sent),
//   - refuses an exec id of an earlier runtime (FAILED_PRECONDITION
//     STALE_HANDLE) and records which runtime each started exec id is in,
//   - admits a new exec within capacity (RESOURCE_EXHAUSTED FLEET_BUSY),
//   - ends the agent stream as soon as containerd reports the task's exit
//     and turns the failure into ABORTED RUNTIME_REPLACED,
//   - fails a request the agent does not answer within the connect budget,
//   - and keeps the exec's capacity slot until the exec ends, handing it to
//     a background follower when the caller leaves early.
//
// The handler calls guardExec, streamContext, opened after sending the
// opening message, seen for every agent event, failed to classify an agent
// stream error, and close when done.
type execGuard struct {
	s         *Service
	sandboxID string
	execID    string
	start     bool // a start, not an attach
	began     time.Time
	agent     agentv1.AgentServiceClient
	runtime   apierr.Runtime // the runtime the request went to
	watch     *runtimes.Watch
	fired     <-chan struct{}
	slot      *admit.ExecSlot // nil unless the request starts a new exec
	// recorded is true when this request wrote the exec's write-ahead
	// journal record, to retract when the start did not happen.
	recorded bool

	cancel      context.CancelFunc
	watcherDone chan struct{}
	answeredCh  chan struct{} // closed with answered

	mu       sync.Mutex
	sent     bool // the opening message was sent to the agent
	answered bool // the agent sent its first event
	refused  bool // the agent ended the stream with its own error before any event
	started  bool // ExecStarted came back
	exited   bool // ExecExited came back
	noAnswer bool // the agent sent nothing within the connect budget
	lastSeq  uint64
	timer    *time.Timer
	busy     *agentreach.Watch // set with timer: is a silent agent busy?
}

// guardExec reaches the sandbox's agent for a request about execID (a start
// when start is true, else an attach) and admits it. Errors: as for reach,
// *apierr.StaleHandle when execID was started in an earlier runtime, and
// *apierr.FleetBusy when a new exec does not fit.
func (s *Service) guardExec(ctx context.Context, sandboxID, execID string, start bool) (*execGuard, error) {
	began := time.Now()
	// Watch before reaching: an exit between the two must not go unseen.
	w := s.events.Watch(sandboxID)
	agent, id, err := s.reach.Reach(ctx, sandboxID, execID)
	if err != nil {
		s.events.Unwatch(w)
		return nil, err
	}
	s.events.Expect(w, id.TaskPID, id.StartedAt)
	g := &execGuard{s: s, sandboxID: sandboxID, execID: execID, start: start, began: began,
		agent: agent, runtime: id, watch: w, fired: s.events.Fired(w), answeredCh: make(chan struct{})}
	prev, known := s.ids.ExecRuntime(sandboxID, execID)
	switch {
	case known && prev.BootID != id.BootID:
		s.events.Unwatch(w)
		return nil, &apierr.StaleHandle{SandboxID: sandboxID, ExecID: execID, Handle: prev, Current: id}
	case start && !known:
		// A start of a known id attaches to the running exec: it takes no
		// new place.
		slot, err := s.capacity.AdmitExec(sandboxID)
		if err != nil {
			s.events.Unwatch(w)
			return nil, err
		}
		// Fail closed: an exec the journal cannot record is not started.
		added, err := s.ids.RecordExec(sandboxID, execID, id.BootID)
		if err != nil {
			slot.Release()
			s.events.Unwatch(w)
			return nil, &apierr.Journal{SandboxID: sandboxID, ExecID: execID, Err: err}
		}
		g.slot, g.recorded = slot, added
	}
	return g, nil
}

// streamContext returns the context for the agent stream. It ends when the
// sandbox's task exits, when the agent does not answer the opening message
// within the connect budget unless it is busy (opened), on g.cancel, and
// when ctx ends, with one exception: a start whose caller leaves before
// the agent's first answer keeps its stream until that answer, bounded as
// the answer is (opened: the connect budget, renewed while the agent works,
// up to AgentBusyLimit), so that berthd learns whether the exec runs,
// keeps counting it if it does, and hangs it up for a caller that asked
// (hangup_on_disconnect). Ending the stream at once would leave a process
// running that no one counts, or hangs up: a caller could then start any
// number of execs past the capacity limits by canceling each start early.
// (It ended one connect budget after the caller left, even while the agent
// was busy starting the process: a slow start then ran on unhung, issue
// 21.)
func (g *execGuard) streamContext(ctx context.Context) context.Context {
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.cancel = cancel
	g.watcherDone = make(chan struct{})
	go func() {
		defer close(g.watcherDone)
		select {
		case <-g.fired:
			cancel()
			return
		case <-actx.Done():
			return
		case <-ctx.Done():
		}
		if g.start {
			select {
			case <-g.answeredCh:
			case <-g.fired:
			case <-actx.Done(): // opened's budget, or the handler returned
			}
		}
		cancel()
	}()
	return actx
}

// opened notes that the opening message was sent and starts the budget for
// the agent's first answer. A budget that runs out while the agent works
// (agentWatch) is renewed: a busy agent is not an unreachable one.
func (g *execGuard) opened() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent = true
	g.busy = g.s.reach.NewWatch(g.sandboxID, g.runtime.TaskPID)
	g.timer = time.AfterFunc(g.s.cfg.ConnectBudget, func() {
		g.mu.Lock()
		silent := !g.answered
		if silent && g.busy.Busy() {
			g.timer.Reset(g.s.cfg.ConnectBudget)
			g.mu.Unlock()
			return
		}
		g.noAnswer = silent
		g.mu.Unlock()
		if silent && g.cancel != nil {
			g.cancel()
		}
	})
}

// seenOutput notes an output event numbered seq of stream with n bytes of
// data, relayed undecoded to the handler's caller.
func (g *execGuard) seenOutput(seq uint64, stream berthv1.Stream, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answer()
	g.lastSeq = max(g.lastSeq, seq)
	g.s.obs.OutputSent(streamName(stream), n)
}

// answer notes that the agent answered. The caller holds g.mu.
func (g *execGuard) answer() {
	if !g.answered {
		g.answered = true
		close(g.answeredCh)
		if g.timer != nil {
			g.timer.Stop()
		}
	}
}

// seen notes an agent event.
func (g *execGuard) seen(msg *agentv1.ExecResponse) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answer()
	switch ev := msg.GetEvent().(type) {
	case *agentv1.ExecResponse_Started:
		if !g.started {
			g.started = true
			if g.start {
				// Recorded before the start was sent; this only restores a
				// record a refused concurrent start of the same id retracted.
				g.s.recordRunning(g.sandboxID, g.execID, g.runtime.BootID)
			}
			if g.slot != nil {
				g.slot.Start()
			}
		}
	case *agentv1.ExecResponse_Output:
		g.lastSeq = max(g.lastSeq, ev.Output.GetSeq())
		g.s.obs.OutputSent(streamName(ev.Output.GetStream()), len(ev.Output.GetData()))
	case *agentv1.ExecResponse_Dropped:
		g.lastSeq = max(g.lastSeq, ev.Dropped.GetLastSeq())
		g.s.obs.OutputDropped(ev.Dropped.GetLostBytes())
	case *agentv1.ExecResponse_Exited:
		g.exited = true
		if g.slot != nil {
			g.slot.End(outcome(ev.Exited.GetResult()))
		}
	}
}

// admitted says whether the request took effect so far.
func (g *execGuard) admitted() berthv1.Admitted {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.started:
		return berthv1.Admitted_ADMITTED_STARTED
	case g.sent:
		return berthv1.Admitted_ADMITTED_UNKNOWN
	}
	return berthv1.Admitted_ADMITTED_NOT_STARTED
}

// failed classifies err, which ended the agent stream (io.EOF when it ended
// without ExecExited), for a caller whose context is ctx.
func (g *execGuard) failed(ctx context.Context, err error) error {
	if ev, decision, ok := g.s.events.Result(g.watch); ok {
		return g.replaced(ctx, ev, decision)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	g.mu.Lock()
	noAnswer := g.noAnswer
	var cause berthv1.UnreachableCause
	var what string
	if noAnswer {
		cause, what = g.busy.Verdict("took the request but sent nothing")
	}
	g.mu.Unlock()
	if noAnswer {
		return g.unreachable(cause, what)
	}
	if reason := rpcstatus.Reason(err); reason != "" {
		if reason == rpcstatus.ReasonUnreachable {
			return g.unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_STOPPING, "the agent is shutting down: "+agentreach.GRPCMessage(err))
		}
		g.mu.Lock()
		g.refused = !g.answered
		g.mu.Unlock()
		return err // the agent's own verdict: EXEC_NOT_FOUND, INVALID_ARGUMENT, ...
	}
	// A transport failure, or an end without a result: find out whether the
	// runtime went away. containerd's event normally says so first.
	t := time.NewTimer(replacedGrace)
	defer t.Stop()
	select {
	case <-g.fired:
		ev, decision, _ := g.s.events.Result(g.watch)
		return g.replaced(ctx, ev, decision)
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return g.probe(ctx, err)
}

// probe checks the sandbox's runtime itself after its agent stream broke
// without containerd reporting an exit.
func (g *execGuard) probe(ctx context.Context, cause error) error {
	if errors.Is(cause, io.EOF) {
		cause = errors.New("the agent ended the exec stream without a result")
	}
	sb, err := g.s.rt.Get(ctx, g.sandboxID)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return g.replaced(ctx, runtime.TaskEvent{Kind: runtime.TaskDeleted}, runtimes.ExitDeleting)
	case err != nil:
		err = fmt.Errorf("check sandbox %s after its agent stream failed (%v): %w", g.sandboxID, cause, err)
		// A dependency failure (see server/status) says whether the exec
		// may have started.
		return &apierr.Attempt{Err: err, Admitted: g.admitted()}
	case sb.HibernationMark != "" && (!sb.Running || sb.TaskPID == g.runtime.TaskPID):
		// Hibernated, or a gVisor sandbox's agent closed its
		// connections for the memory checkpoint of a hibernation under
		// way (its task may have exited, saved, already).
		return g.replaced(ctx, runtime.TaskEvent{Kind: runtime.TaskExited}, runtimes.ExitHibernating)
	case !sb.Running || sb.TaskPID != g.runtime.TaskPID:
		return g.replaced(ctx, runtime.TaskEvent{Kind: runtime.TaskExited}, runtimes.ExitLeftStopped)
	}
	infoCtx, cancel := context.WithTimeout(ctx, g.s.cfg.ConnectBudget)
	info, err := g.agent.Info(infoCtx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
	cancel()
	switch {
	case err != nil:
		return g.unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT,
			fmt.Sprintf("the exec stream broke (%v) and the agent did not answer again within the connect budget of %v", agentreach.GRPCMessage(cause), g.s.cfg.ConnectBudget))
	case info.GetBootId() != g.runtime.BootID:
		after := apierr.Runtime{BootID: info.GetBootId(), TaskPID: sb.TaskPID, AgentVersion: info.GetVersion(), StartedAt: g.runtime.StartedAt}
		g.s.ids.Observe(g.sandboxID, after)
		e := g.replacedError(berthv1.ReplacedCause_REPLACED_CAUSE_AGENT_RESTARTED)
		e.After = after
		return e
	}
	return g.unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECTION_LOST,
		fmt.Sprintf("the exec stream to the agent broke: %v", agentreach.GRPCMessage(cause)))
}

func (g *execGuard) unreachable(cause berthv1.UnreachableCause, what string) error {
	admitted := g.admitted()
	if admitted == berthv1.Admitted_ADMITTED_UNKNOWN && g.start {
		// A retry with the same exec id must attach, not run it again.
		g.s.recordRunning(g.sandboxID, g.execID, g.runtime.BootID)
	}
	return &apierr.Unreachable{SandboxID: g.sandboxID, ExecID: g.execID, Cause: cause, TaskRunning: true,
		Runtime: g.runtime, Waited: time.Since(g.began), Admitted: admitted, What: what}
}

func (g *execGuard) replacedError(cause berthv1.ReplacedCause) *apierr.RuntimeReplaced {
	admitted := g.admitted()
	if admitted == berthv1.Admitted_ADMITTED_UNKNOWN && g.start {
		// A retry with the same exec id gets STALE_HANDLE: it may have run.
		g.s.recordRunning(g.sandboxID, g.execID, g.runtime.BootID)
	}
	return &apierr.RuntimeReplaced{SandboxID: g.sandboxID, ExecID: g.execID, Cause: cause, Before: g.runtime,
		Elapsed: time.Since(g.began), Admitted: admitted}
}

// replaced builds the RUNTIME_REPLACED error for the task event ev. When
// berthd is restarting the task it waits, at most afterWait, for the new
// runtime to name it.
func (g *execGuard) replaced(ctx context.Context, ev runtime.TaskEvent, decision runtimes.ExitDecision) error {
	cause := berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED
	switch decision {
	case runtimes.ExitDeleting:
		cause = berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED
	case runtimes.ExitHibernating:
		cause = berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_HIBERNATED
	}
	e := g.replacedError(cause)
	if g.slot != nil {
		g.slot.End(metrics.OutcomeRuntimeReplaced)
	}
	e.ExitStatus = ev.ExitStatus
	e.ExitedAt = ev.At
	// 137 is 128+SIGKILL, what the OOM killer sends.
	e.OOMKilled = ev.ExitStatus == 137 && g.s.events.OOMNear(g.sandboxID, g.runtime.StartedAt, ev.At)
	if decision == runtimes.ExitRestarting {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), afterWait)
		e.After, e.Restarting = g.s.ids.AwaitReplacement(wctx, g.sandboxID, g.runtime.BootID)
		cancel()
	}
	return e
}

// close ends the guard: it stops the stream's watcher, and releases the
// exec's capacity slot, or hands it to a follower when the exec runs on
// without its caller.
func (g *execGuard) close() {
	if g.cancel != nil {
		g.cancel()
		<-g.watcherDone
	}
	g.mu.Lock()
	if g.timer != nil {
		g.timer.Stop()
	}
	// A start sent without an answer may run: the follower finds out, and
	// frees the place when the agent does not know the exec.
	maybeRuns := g.start && g.sent && !g.answered && !g.refused
	runsOn := (g.started || maybeRuns) && !g.exited
	since := g.lastSeq
	// Nothing ran when the start was never sent or the agent refused it.
	notRun := g.recorded && !g.started && (!g.sent || g.refused)
	g.mu.Unlock()
	if notRun {
		g.s.ids.RetractExec(g.sandboxID, g.execID, g.runtime.BootID)
	}
	_, _, gone := g.s.events.Result(g.watch)
	g.s.events.Unwatch(g.watch)
	if g.slot == nil {
		return
	}
	if runsOn && !gone {
		g.s.followDetached(g.sandboxID, g.execID, g.runtime, since, g.agent, g.slot)
		return
	}
	g.slot.Release()
}

// followDetached holds slot until the exec, which runs on after its caller
// left, exits: it attaches to it after sequence number since and reads until
// ExecExited, the exec is unknown to the agent, the sandbox's runtime
// changes, or berthd stops. Lost connections are retried with backoff.
func (s *Service) followDetached(sandboxID, execID string, rt apierr.Runtime, since uint64, agent agentv1.AgentServiceClient, slot *admit.ExecSlot) {
	bgCtx, done := s.life.Context()
	go func() {
		defer done()
		defer slot.Release()
		w := s.events.Watch(sandboxID)
		defer s.events.Unwatch(w)
		if !s.events.Expect(w, rt.TaskPID, rt.StartedAt) {
			return
		}
		ctx, cancel := context.WithCancel(bgCtx)
		fired := s.events.Fired(w)
		watcherDone := make(chan struct{})
		go func() {
			defer close(watcherDone)
			select {
			case <-fired:
				cancel()
			case <-ctx.Done():
			}
		}()
		defer func() { cancel(); <-watcherDone }()
		backoff := 100 * time.Millisecond
		for {
			res, err := followToExit(ctx, agent, execID, &since)
			if err == nil {
				slot.End(outcome(res))
				return
			}
			if _, _, gone := s.events.Result(w); gone || s.ids.Current(sandboxID).BootID != rt.BootID {
				slot.End(metrics.OutcomeRuntimeReplaced)
				return
			}
			if ctx.Err() != nil || rpcstatus.Reason(err) != "" || status.Code(err) == codes.NotFound {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}()
}

// followToExit attaches to execID after *since and reads until ExecExited,
// advancing *since, and returns the exec's result.
func followToExit(ctx context.Context, agent agentv1.AgentServiceClient, execID string, since *uint64) (*berthv1.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := agent.Exec(ctx)
	if err != nil {
		return nil, err
	}
	// exit_only: the agent sends no output and the follower never holds
	// the process back (agents before it send output, which is skipped).
	attach := &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: execID, SinceSeq: *since, ExitOnly: true}}}
	if err := stream.Send(attach); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// Closing the send side does not close the process's stdin: the agent
	// keeps following.
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("agent ended the stream without a result")
		}
		if err != nil {
			return nil, err
		}
		switch ev := msg.GetEvent().(type) {
		case *agentv1.ExecResponse_Output:
			*since = max(*since, ev.Output.GetSeq())
		case *agentv1.ExecResponse_Dropped:
			*since = max(*since, ev.Dropped.GetLastSeq())
		case *agentv1.ExecResponse_Exited:
			return ev.Exited.GetResult(), nil
		}
	}
}

// recordRunning records an exec that runs, or may, in the runtime with
// bootID. Its write-ahead record exists already unless a refused concurrent
// start of the same id retracted it; if the journal cannot take it again,
// the loss is logged: the exec runs already.
func (s *Service) recordRunning(sandboxID, execID, bootID string) {
	if _, err := s.ids.RecordExec(sandboxID, execID, bootID); err != nil {
		s.log.Error("journal an exec that runs", slog.String("sandbox_id", sandboxID), slog.String("exec_id", execID), slog.Any("error", err))
	}
}

// openAgentExec reaches the sandbox's agent (guardExec), opens its exec
// stream and sends opening; the guard's stream context ends the stream
// (streamContext). The caller closes the guard.
//
// A sandbox whose task berthd is restarting (its agent killed, an OOM of
// PID 1) is waited for: when containerd reports its task stopped, the
// stream cannot be opened, or the task is seen gone before opening is
// sent, because the task exited and berthd is starting a new one, nothing
// was sent, and the request is sent again to the new agent once it
// answers, until ctx ends. Then, or when berthd does not restart the
// task, the error is the one the old runtime gave: ABORTED
// RUNTIME_REPLACED or UNAVAILABLE SANDBOX_UNREACHABLE (TASK_STOPPED), with
// admitted NOT_STARTED (a retry is safe). A stream that breaks after
// opening was sent is not retried: the old agent may have started the
// exec (ADMITTED_UNKNOWN).
func (s *Service) openAgentExec(ctx context.Context, sandboxID, execID string, start bool, opening *agentv1.ExecRequest) (*execGuard, agentv1.AgentService_ExecClient, error) {
	for {
		guard, err := s.guardExec(ctx, sandboxID, execID, start)
		var unreachable *apierr.Unreachable
		if errors.As(err, &unreachable) && unreachable.Admitted == berthv1.Admitted_ADMITTED_NOT_STARTED &&
			(unreachable.Cause == berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED || unreachable.Cause == berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING) &&
			s.awaitRestart(ctx, sandboxID, unreachable.Runtime.BootID) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		upstream, err := guard.agent.Exec(guard.streamContext(ctx), wire.CallOption())
		if err == nil && procfs.Exited(guard.runtime.TaskPID) {
			err = errTaskGone
		}
		if err == nil {
			if err = upstream.Send(opening); err == nil || errors.Is(err, io.EOF) {
				guard.opened()
				return guard, upstream, nil
			}
		}
		err = guard.failed(ctx, err)
		old := guard.runtime.BootID
		guard.close()
		var replaced *apierr.RuntimeReplaced
		if !errors.As(err, &replaced) || replaced.Admitted != berthv1.Admitted_ADMITTED_NOT_STARTED ||
			replaced.Cause != berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED || !(replaced.Restarting || replaced.After.BootID != "") {
			return nil, nil, err
		}
		if !s.awaitRestart(ctx, sandboxID, old) {
			return nil, nil, err // ctx ended first, or no restart came
		}
	}
}

// errTaskGone fails an exec stream opened to a runtime whose task has
// exited already: its opening is not sent.
var errTaskGone = errors.New("the sandbox's task exited before the request was sent")

// awaitRestart waits for a runtime of the sandbox other than the one with
// boot id old, which berthd is restarting (or about to: containerd's exit
// event may reach berthd's decision up to replacedGrace after the task
// is seen stopped), until ctx ends. It reports whether one came; false at
// once when old is unknown.
func (s *Service) awaitRestart(ctx context.Context, sandboxID, old string) bool {
	if old == "" {
		return false
	}
	grace := time.NewTimer(replacedGrace)
	defer grace.Stop()
	for {
		if next, _ := s.ids.AwaitReplacement(ctx, sandboxID, old); next.BootID != "" {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-grace.C:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}
