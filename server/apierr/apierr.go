// Package apierr holds berthd's domain errors as plain data: which sandbox
// and exec a failure concerns, what failed, and whether anything ran
// (berthv1.Admitted). Engines and services return them, wrapped with
// context as any error; server/status turns them into gRPC statuses with
// their typed details at one boundary (errors.proto names the details and
// the reasons). The package imports no other server package.
package apierr

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ErrUnreachable means a sandbox's agent did not answer or its task does
// not run; nothing was started. *Unreachable wraps it with the facts; an
// error that wraps only ErrUnreachable (CreateSandbox's readiness wait)
// becomes an Unreachable detail with what the boundary knows.
var ErrUnreachable = errors.New("sandbox agent unreachable")

// Runtime is one runtime of a sandbox: a containerd task and the agent
// running as its PID 1. A new task, or a new agent in the same task, is a
// new runtime; the agent's boot id (random per agent start) tells runtimes
// apart.
type Runtime struct {
	BootID  string
	TaskPID uint32
	// StartedAt is when the task's process started, from /proc; zero when
	// unknown.
	StartedAt    time.Time
	AgentVersion string
}

// Proto returns r as a RuntimeIdentity, or nil for the zero Runtime.
func (r Runtime) Proto() *berthv1.RuntimeIdentity {
	if r.BootID == "" && r.TaskPID == 0 {
		return nil
	}
	out := &berthv1.RuntimeIdentity{AgentBootId: r.BootID, TaskPid: r.TaskPID}
	if !r.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(r.StartedAt)
	}
	return out
}

// String names the runtime for messages: "agent boot 1a2b3c4d, task pid 42".
func (r Runtime) String() string {
	if r.BootID == "" {
		if r.TaskPID == 0 {
			return "no runtime"
		}
		return fmt.Sprintf("task pid %d", r.TaskPID)
	}
	return fmt.Sprintf("agent boot %s, task pid %d", shortBoot(r.BootID), r.TaskPID)
}

// shortBoot abbreviates a boot id for messages; details carry it whole.
func shortBoot(boot string) string {
	if len(boot) > 8 {
		return boot[:8]
	}
	return boot
}

// Unreachable says a sandbox's agent could not be reached
// (UNAVAILABLE SANDBOX_UNREACHABLE, detail berthv1.Unreachable).
type Unreachable struct {
	SandboxID   string
	ExecID      string
	Cause       berthv1.UnreachableCause
	TaskRunning bool
	Runtime     Runtime // last known runtime
	Waited      time.Duration
	Admitted    berthv1.Admitted
	// What says what failed, for the message.
	What string
}

func (e *Unreachable) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: %s", e.SandboxID, e.What)
	switch e.Admitted {
	case berthv1.Admitted_ADMITTED_STARTED:
		b.WriteString("; the exec had started and may still run")
	case berthv1.Admitted_ADMITTED_UNKNOWN:
		if e.ExecID == "" {
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

func (e *Unreachable) Unwrap() error { return ErrUnreachable }

// RuntimeReplaced says a sandbox's runtime died or changed under an exec
// (ABORTED RUNTIME_REPLACED, detail berthv1.RuntimeReplaced).
type RuntimeReplaced struct {
	SandboxID  string
	ExecID     string
	Cause      berthv1.ReplacedCause
	Before     Runtime
	After      Runtime
	Restarting bool
	ExitStatus uint32
	ExitedAt   time.Time
	OOMKilled  bool
	Elapsed    time.Duration
	Admitted   berthv1.Admitted
}

func (e *RuntimeReplaced) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: ", e.SandboxID)
	switch e.Cause {
	case berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED:
		b.WriteString("the sandbox was deleted")
	case berthv1.ReplacedCause_REPLACED_CAUSE_AGENT_RESTARTED:
		b.WriteString("the agent restarted")
	default:
		b.WriteString("the task exited")
		if e.ExitStatus != 0 {
			fmt.Fprintf(&b, " with status %d", e.ExitStatus)
		}
		if e.OOMKilled {
			b.WriteString(" (OOM kill)")
		}
	}
	fmt.Fprintf(&b, " while exec %s was running in it (%s); the exec's processes are gone", e.ExecID, e.Before)
	switch {
	case e.After.BootID != "":
		fmt.Fprintf(&b, "; the sandbox now runs %s", e.After)
	case e.Restarting:
		b.WriteString("; berthd is starting a new task")
	case e.Cause != berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_DELETED:
		b.WriteString("; the sandbox is stopped")
	}
	return b.String()
}

// Journal says a start was refused because berthd could not record the
// exec id in the sandbox's runtime journal: nothing was sent to the agent,
// nothing ran (UNAVAILABLE JOURNAL_UNAVAILABLE).
type Journal struct {
	SandboxID string
	ExecID    string
	Err       error
}

func (e *Journal) Error() string {
	cause := e.Err
	// The path is berthd's host path: the caller gets the system error.
	var pe *fs.PathError
	if errors.As(e.Err, &pe) {
		cause = pe.Err
	}
	return fmt.Sprintf("exec %s not started in sandbox %s: berthd could not record it in its runtime journal (%v); nothing ran; retry once the server's journal directory can be written",
		e.ExecID, e.SandboxID, cause)
}

func (e *Journal) Unwrap() error { return e.Err }

// StaleHandle says a request named an exec of an earlier runtime
// (FAILED_PRECONDITION STALE_HANDLE, detail berthv1.StaleHandle). A zero
// Handle means the runtime journal was found damaged.
type StaleHandle struct {
	SandboxID string
	ExecID    string
	Handle    Runtime // the runtime the exec belonged to
	Current   Runtime
}

func (e *StaleHandle) Error() string {
	if e.Handle.BootID == "" {
		return fmt.Sprintf("exec %s of sandbox %s is not in berthd's runtime journal of the sandbox, which was found damaged: it may belong to an earlier runtime (now %s), so it is not started again; start a new exec with a new exec id",
			e.ExecID, e.SandboxID, e.Current)
	}
	return fmt.Sprintf("exec %s belongs to an earlier runtime of sandbox %s (%s; now %s): its processes are gone; start a new exec with a new exec id",
		e.ExecID, e.SandboxID, e.Handle, e.Current)
}

// Dependency says a request failed because something berthd depends on
// failed, outside any sandbox: containerd, the disk of berthd's own
// directories, berthd's file descriptors (detail berthv1.DependencyFailure).
type Dependency struct {
	SandboxID  string
	Dependency berthv1.Dependency
	Fault      berthv1.DependencyFault
	Op         string
	Waited     time.Duration
	Budget     time.Duration
	Admitted   berthv1.Admitted
	Err        error
}

func (e *Dependency) Error() string { return e.Err.Error() }

func (e *Dependency) Unwrap() error { return e.Err }

// Attempt wraps an error with what its caller knows of how far the request
// got: when the error is a dependency failure (see server/status), these
// facts fill its DependencyFailure detail in place of the ones found in the
// error. Zero fields leave those as they are.
type Attempt struct {
	Err      error
	Op       string
	Waited   time.Duration
	Admitted berthv1.Admitted
}

func (e *Attempt) Error() string { return e.Err.Error() }

func (e *Attempt) Unwrap() error { return e.Err }

// FleetBusy refuses new work for lack of capacity; nothing started
// (RESOURCE_EXHAUSTED FLEET_BUSY, details berthv1.FleetBusy and, when a
// wait can help, RetryInfo: see Delay).
type FleetBusy struct {
	SandboxID string
	Resource  berthv1.CapacityResource
	Limit     uint64
	InUse     uint64
	Requested uint64
	// RetryDelay is the server's configured wait before a retry
	// (--busy-retry-delay); Delay says whether it applies.
	RetryDelay time.Duration
	// Principal names the principal whose cap ran out (the
	// CAPACITY_RESOURCE_PRINCIPAL_* resources); empty for the others.
	Principal string
	// Standby is how much of InUse (sandboxes, or bytes) Principal's
	// own fork standby members hold: made ahead for the next forks of
	// her sandboxes, not listed to her, removed when that alone makes
	// the request fit (lifecycle's giveWay). Said only for Principal's
	// own caps: a refusal at the server's limits says nothing of whose
	// members it counts.
	Standby uint64
}

func (e *FleetBusy) Error() string {
	var what string
	switch e.Resource {
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOXES:
		what = fmt.Sprintf("the server holds %d of at most %d sandboxes", e.InUse, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS:
		what = fmt.Sprintf("sandbox %s runs %d of at most %d execs at once", e.SandboxID, e.InUse, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_SERVER_EXECS:
		what = fmt.Sprintf("the server runs %d of at most %d execs at once", e.InUse, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY:
		what = fmt.Sprintf("sandboxes are promised %d bytes of memory; %d more would exceed the budget of %d bytes", e.InUse, e.Requested, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_RUN_OUTPUT:
		what = fmt.Sprintf("Runs in progress hold %d bytes for their output; this Run's caps of %d bytes would exceed the server's budget of %d bytes", e.InUse, e.Requested, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_DISK:
		what = fmt.Sprintf("sandboxes are promised %d bytes of disk; a quota of %d bytes more would exceed the disk budget of %d bytes (the btrfs pool's size times --disk-overcommit)", e.InUse, e.Requested, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES:
		what = fmt.Sprintf("principal %q holds %d of at most %d sandboxes", e.Principal, e.InUse, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_MEMORY:
		what = fmt.Sprintf("principal %q's sandboxes are promised %d bytes of memory; %d more would exceed its cap of %d bytes", e.Principal, e.InUse, e.Requested, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK:
		what = fmt.Sprintf("principal %q's sandboxes are promised %d bytes of disk; %d more would exceed its cap of %d bytes", e.Principal, e.InUse, e.Requested, e.Limit)
	case berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_RAW_STREAMS:
		what = fmt.Sprintf("principal %q has %d of at most %d raw HTTP file streams open (--max-raw-streams-per-principal)", e.Principal, e.InUse, e.Limit)
	}
	if e.Standby > 0 && e.Principal != "" {
		what += e.standby()
	}
	if d := e.Delay(); d > 0 {
		return fmt.Sprintf("no capacity for sandbox %s: %s; nothing was started, retry after %v", e.SandboxID, what, d)
	}
	return fmt.Sprintf("no capacity for sandbox %s: %s; nothing was started, and waiting frees no disk: delete sandboxes or snapshots first", e.SandboxID, what)
}

// standby says how much of the refused principal's use her fork
// standby members hold, and why they stay.
func (e *FleetBusy) standby() string {
	const why = "fork standby members made ahead for the next forks of its sandboxes: not listed, they are removed when that makes room and no fork is taking them"
	if e.Resource == berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES {
		return fmt.Sprintf(" (%d of them are %s)", e.Standby, why)
	}
	return fmt.Sprintf(" (%d bytes of them are held by %s)", e.Standby, why)
}

// Delay is how long a caller should wait before retrying, or 0 when a wait
// alone frees nothing: disk (CAPACITY_RESOURCE_DISK, _PRINCIPAL_DISK) is
// promised until a sandbox, snapshot or fork copy is deleted, so its
// refusal carries no RetryInfo and clients do not retry it (a CLI retried
// a full disk budget ten times, a second apart). Sandboxes, memory, execs
// and Run buffers come free as others' work ends.
func (e *FleetBusy) Delay() time.Duration {
	switch e.Resource {
	case berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK:
		return 0
	}
	return e.RetryDelay
}

// Invalid is INVALID_ARGUMENT blaming one request field, given by its path
// in the request ("resources.memory_bytes").
type Invalid struct {
	Field       string
	Description string
}

func (e *Invalid) Error() string { return e.Field + ": " + e.Description }

// InvalidArgument returns an *Invalid for field.
func InvalidArgument(field, description string) error {
	return &Invalid{Field: field, Description: description}
}

// Refused is any other answer the API defines: a gRPC code, an ErrorInfo
// reason of errors.proto, a message and ErrorInfo metadata.
type Refused struct {
	Code    codes.Code
	Reason  string
	Message string
	Meta    map[string]string
}

func (e *Refused) Error() string { return e.Message }

// New returns a *Refused.
func New(code codes.Code, reason, message string, meta map[string]string) error {
	return &Refused{Code: code, Reason: reason, Message: message, Meta: meta}
}

// withMeta carries metadata for the ErrorInfo of the status err becomes.
type withMeta struct {
	err  error
	meta map[string]string
}

func (e *withMeta) Error() string { return e.err.Error() }

func (e *withMeta) Unwrap() error { return e.err }

// WithMeta returns err carrying meta for the ErrorInfo metadata of its
// status: what the request was about, e.g. "sandbox_id". Empty values are
// left out; nil stays nil.
func WithMeta(err error, meta map[string]string) error {
	if err == nil {
		return nil
	}
	return &withMeta{err: err, meta: meta}
}

// Meta returns the metadata that WithMeta put on err and the errors it
// wraps, the outermost winning.
func Meta(err error) map[string]string {
	out := map[string]string{}
	for err != nil {
		if m, ok := err.(*withMeta); ok {
			for k, v := range m.meta {
				if _, set := out[k]; !set && v != "" {
					out[k] = v
				}
			}
		}
		err = errors.Unwrap(err)
	}
	return out
}
