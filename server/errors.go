package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// errAgentUnreachable means the sandbox's agent did not answer or its task
// does not run; nothing was started. *unreachableError wraps it with the
// facts.
var errAgentUnreachable = errors.New("sandbox agent unreachable")

// unreachableError says the sandbox's agent could not be reached.
type unreachableError struct {
	sandboxID   string
	execID      string
	cause       berthv1.UnreachableCause
	taskRunning bool
	runtime     identity // last known runtime
	waited      time.Duration
	admitted    berthv1.Admitted
	// what says what failed, for the message.
	what string
}

func (e *unreachableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: %s", e.sandboxID, e.what)
	switch e.admitted {
	case berthv1.Admitted_ADMITTED_STARTED:
		b.WriteString("; the exec had started and may still run")
	case berthv1.Admitted_ADMITTED_UNKNOWN:
		if e.execID == "" {
			// A file operation: nothing was started, but it may have
			// been done.
			b.WriteString("; the request reached the agent, whether it took effect is unknown")
		} else {
			b.WriteString("; the start reached the agent, whether it ran is unknown")
		}
	default:
		b.WriteString("; nothing ran")
	}
	return b.String()
}

func (e *unreachableError) Unwrap() error { return errAgentUnreachable }

func (e *unreachableError) detail(budget time.Duration) *berthv1.Unreachable {
	return &berthv1.Unreachable{
		SandboxId:     e.sandboxID,
		ExecId:        e.execID,
		Cause:         e.cause,
		TaskRunning:   e.taskRunning,
		Runtime:       e.runtime.proto(),
		Waited:        durationProto(e.waited),
		ConnectBudget: durationProto(budget),
		AgentVersion:  e.runtime.AgentVersion,
		ServerVersion: Version,
		Admitted:      e.admitted,
	}
}

// runtimeReplacedError says the sandbox's runtime died or changed under an
// exec.
type runtimeReplacedError struct {
	sandboxID  string
	execID     string
	cause      berthv1.ReplacedCause
	before     identity
	after      identity
	restarting bool
	exitStatus uint32
	exitedAt   time.Time
	oomKilled  bool
	elapsed    time.Duration
	admitted   berthv1.Admitted
}

func (e *runtimeReplacedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: ", e.sandboxID)
	switch e.cause {
	case berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED:
		b.WriteString("the sandbox was deleted")
	case berthv1.ReplacedCause_REPLACED_CAUSE_AGENT_RESTARTED:
		b.WriteString("the agent restarted")
	default:
		b.WriteString("the task exited")
		if e.exitStatus != 0 {
			fmt.Fprintf(&b, " with status %d", e.exitStatus)
		}
		if e.oomKilled {
			b.WriteString(" (OOM kill)")
		}
	}
	fmt.Fprintf(&b, " while exec %s was running in it (%s); the exec's processes are gone", e.execID, e.before)
	switch {
	case e.after.BootID != "":
		fmt.Fprintf(&b, "; the sandbox now runs %s", e.after)
	case e.restarting:
		b.WriteString("; berthd is starting a new task")
	case e.cause != berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED:
		b.WriteString("; the sandbox is stopped")
	}
	return b.String()
}

func (e *runtimeReplacedError) detail() *berthv1.RuntimeReplaced {
	d := &berthv1.RuntimeReplaced{
		SandboxId:      e.sandboxID,
		ExecId:         e.execID,
		Cause:          e.cause,
		Before:         e.before.proto(),
		After:          e.after.proto(),
		Restarting:     e.restarting,
		TaskExitStatus: e.exitStatus,
		OomKilled:      e.oomKilled,
		Elapsed:        durationProto(e.elapsed),
		AgentVersion:   e.before.AgentVersion,
		ServerVersion:  Version,
		Admitted:       e.admitted,
	}
	if !e.exitedAt.IsZero() {
		d.TaskExitedAt = timestamppb.New(e.exitedAt)
	}
	return d
}

// journalError says a start was refused because berthd could not record
// the exec id in the sandbox's runtime journal: nothing was sent to the
// agent, nothing ran.
type journalError struct {
	sandboxID string
	execID    string
	err       error
}

func (e *journalError) Error() string {
	cause := e.err
	// The path is berthd's host path: the caller gets the system error.
	var pe *fs.PathError
	if errors.As(e.err, &pe) {
		cause = pe.Err
	}
	return fmt.Sprintf("exec %s not started in sandbox %s: berthd could not record it in its runtime journal (%v); nothing ran; retry once the server's journal directory can be written",
		e.execID, e.sandboxID, cause)
}

func (e *journalError) Unwrap() error { return e.err }

// staleHandleError says a request named an exec of an earlier runtime.
type staleHandleError struct {
	sandboxID string
	execID    string
	handle    identity // the runtime the exec belonged to
	current   identity
}

func (e *staleHandleError) Error() string {
	if e.handle.BootID == "" {
		return fmt.Sprintf("exec %s of sandbox %s is not in berthd's runtime journal of the sandbox, which was found damaged: it may belong to an earlier runtime (now %s), so it is not started again; start a new exec with a new exec id",
			e.execID, e.sandboxID, e.current)
	}
	return fmt.Sprintf("exec %s belongs to an earlier runtime of sandbox %s (%s; now %s): its processes are gone; start a new exec with a new exec id",
		e.execID, e.sandboxID, e.handle, e.current)
}

func (e *staleHandleError) detail() *berthv1.StaleHandle {
	return &berthv1.StaleHandle{
		SandboxId:      e.sandboxID,
		ExecId:         e.execID,
		HandleRuntime:  e.handle.proto(),
		CurrentRuntime: e.current.proto(),
		AgentVersion:   e.current.AgentVersion,
		ServerVersion:  Version,
		Admitted:       berthv1.Admitted_ADMITTED_NOT_STARTED,
	}
}

// dependencyError says a request failed because something berthd depends
// on failed, outside any sandbox: containerd, the disk of berthd's own
// directories, berthd's file descriptors (berthv1.DependencyFailure).
type dependencyError struct {
	sandboxID  string
	dependency berthv1.Dependency
	fault      berthv1.DependencyFault
	op         string
	waited     time.Duration
	budget     time.Duration
	admitted   berthv1.Admitted
	err        error
}

func (e *dependencyError) Error() string { return e.err.Error() }

func (e *dependencyError) Unwrap() error { return e.err }

// dependencyOf classifies err as a dependency failure: containerd not
// answering (runtime.UnavailableError), a host resource running out
// (runtime.HostError, or any error carrying ENOSPC, EDQUOT, EMFILE or
// ENFILE from berthd's own system calls: the agents' and containerd's
// failures arrive as statuses, never as errnos), or a *dependencyError
// built where the failure happened. sandboxID fills the detail when the
// error does not name one.
func dependencyOf(err error, sandboxID string) (*dependencyError, bool) {
	var (
		dep         *dependencyError
		unavailable *runtime.UnavailableError
		host        *runtime.HostError
	)
	switch {
	case errors.As(err, &dep):
		d := *dep
		if d.sandboxID == "" {
			d.sandboxID = sandboxID
		}
		return &d, true
	case errors.As(err, &unavailable):
		d := &dependencyError{sandboxID: sandboxID, dependency: berthv1.Dependency_DEPENDENCY_CONTAINERD, fault: berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE,
			op: unavailable.Op, waited: unavailable.Waited, admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, err: err}
		if unavailable.Slow {
			d.fault, d.budget = berthv1.DependencyFault_DEPENDENCY_FAULT_SLOW, unavailable.Budget
		}
		if unavailable.Changed {
			d.admitted = berthv1.Admitted_ADMITTED_UNKNOWN
		}
		return d, true
	}
	errno, ok := runtime.HostErrno(err)
	if !ok {
		return nil, false
	}
	// Where berthd's own call failed is known only to a runtime
	// operation: anything else may have taken effect in part.
	d := &dependencyError{sandboxID: sandboxID, dependency: berthv1.Dependency_DEPENDENCY_SERVER_DISK, fault: berthv1.DependencyFault_DEPENDENCY_FAULT_FULL,
		admitted: berthv1.Admitted_ADMITTED_UNKNOWN, err: err}
	if errors.As(err, &host) {
		d.op = host.Op
		if !host.Changed {
			d.admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
		}
	}
	if errno == syscall.EMFILE || errno == syscall.ENFILE {
		d.dependency, d.fault = berthv1.Dependency_DEPENDENCY_SERVER_DESCRIPTORS, berthv1.DependencyFault_DEPENDENCY_FAULT_EXHAUSTED
	}
	return d, true
}

// status is the gRPC status of e: UNAVAILABLE CONTAINERD_UNAVAILABLE, or
// RESOURCE_EXHAUSTED SERVER_DISK_FULL or SERVER_DESCRIPTORS_EXHAUSTED, with
// the DependencyFailure detail.
func (e *dependencyError) status(meta map[string]string) error {
	code, reason := codes.Unavailable, rpcstatus.ReasonContainerdUnavailable
	switch e.dependency {
	case berthv1.Dependency_DEPENDENCY_SERVER_DISK:
		code, reason = codes.ResourceExhausted, rpcstatus.ReasonServerDiskFull
	case berthv1.Dependency_DEPENDENCY_SERVER_DESCRIPTORS:
		code, reason = codes.ResourceExhausted, rpcstatus.ReasonServerDescriptors
	}
	msg := e.err.Error()
	switch e.admitted {
	case berthv1.Admitted_ADMITTED_NOT_STARTED:
		msg += "; nothing was changed"
	case berthv1.Admitted_ADMITTED_UNKNOWN:
		msg += "; it may have taken effect in part: retry with the same sandbox_id, which is idempotent"
	}
	d := &berthv1.DependencyFailure{SandboxId: e.sandboxID, Dependency: e.dependency, Fault: e.fault, Operation: e.op,
		Waited: durationProto(e.waited), Budget: durationProto(e.budget), ServerVersion: Version, Admitted: e.admitted}
	return rpcstatus.Error(code, reason, msg, withMeta(meta, "dependency", e.dependency.String()), d)
}

// toStatus converts err to the gRPC status returned to the caller. It is the
// one place where domain errors become codes: statuses that already carry a
// berth ErrorInfo (built by a handler or by the agent) pass unchanged, and
// anything unclassified becomes INTERNAL with its cause logged under an
// incident id that the message names, never passed through. An agent's own
// INTERNAL status is unclassified too: its text is the agent's, not the
// caller's to read. meta names what the request was about, e.g. the
// sandbox id.
func (s *Service) toStatus(ctx context.Context, err error, meta map[string]string) error {
	if err == nil {
		return nil
	}
	if r := rpcstatus.Reason(err); r != "" && r != rpcstatus.ReasonInternal && status.Code(err) != codes.Internal {
		return err
	}
	msg := err.Error()
	var (
		busy        *fleetBusyError
		unreachable *unreachableError
		replaced    *runtimeReplacedError
		stale       *staleHandleError
		journal     *journalError
	)
	switch {
	case errors.As(err, &busy):
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, msg, withMeta(meta, "resource", busy.resource.String()),
			busy.detail(), &errdetails.RetryInfo{RetryDelay: durationProto(busy.retryDelay)})
	case errors.As(err, &replaced):
		return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonRuntimeReplaced, msg, withMeta(meta, "exec_id", replaced.execID), replaced.detail())
	case errors.As(err, &stale):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonStaleHandle, msg, withMeta(meta, "exec_id", stale.execID), stale.detail())
	case errors.As(err, &journal):
		s.log.ErrorContext(ctx, "exec refused: runtime journal write failed", slog.String("sandbox_id", journal.sandboxID), slog.String("exec_id", journal.execID), slog.Any("error", journal.err))
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonJournalUnavailable, msg,
			withMeta(meta, "admitted", berthv1.Admitted_ADMITTED_NOT_STARTED.String()))
	case errors.As(err, &unreachable):
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg, withMeta(meta, "cause", unreachable.cause.String()), unreachable.detail(s.cfg.ConnectBudget))
	case errors.Is(err, errAgentUnreachable):
		// Built without the facts (CreateSandbox's readiness wait): the
		// detail says what is known.
		d := &berthv1.Unreachable{SandboxId: meta["sandbox_id"], ConnectBudget: durationProto(s.cfg.ConnectBudget), ServerVersion: Version, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg, meta, d)
	case errors.Is(err, network.ErrUnavailable):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNetworkUnavailable, msg, withMeta(meta, "field", "network.mode"))
	}
	if d, ok := dependencyOf(err, meta["sandbox_id"]); ok {
		return d.status(meta)
	}
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, msg, meta)
	case errors.Is(err, runtime.ErrSandboxExists):
		return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSandboxExists, msg, meta)
	case errors.Is(err, runtime.ErrImageNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonImageNotFound, msg, meta)
	case errors.Is(err, runtime.ErrDiskQuotaUnsupported):
		// Create could not put the quota in force (the kernel's quota
		// accounting stayed inconsistent); nothing was created.
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonDiskQuotaUnsupported, msg, withMeta(meta, "field", "resources.disk_bytes"))
	case errors.Is(err, runtime.ErrImageUnusable):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, msg, withMeta(meta, "field", "image"))
	case errors.Is(err, runtime.ErrImageArchive):
		return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonImageArchive, msg, meta)
	case errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled:
		return rpcstatus.Error(codes.Canceled, rpcstatus.ReasonCanceled, "request canceled: "+msg, meta)
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return rpcstatus.Error(codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded, "deadline exceeded: "+msg, meta)
	}
	incident := newID("", 10)
	s.log.ErrorContext(ctx, "internal error", slog.String("incident", incident), slog.Any("error", err), slog.Any("meta", meta))
	return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "internal error "+incident+"; the server log has the cause", withMeta(meta, "incident", incident))
}

// withMeta returns a copy of meta with k set to v.
func withMeta(meta map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(meta)+1)
	for mk, mv := range meta {
		out[mk] = mv
	}
	if v != "" {
		out[k] = v
	}
	return out
}

func durationProto(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}
