package client

import (
	"errors"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// baseError lets the condition types embed *Error under a name that does
// not collide with their Error method: Code, Reason, Message, Metadata and
// the other fields of the *Error are promoted, and Unwrap returns it.
type baseError = Error

// FleetBusyError means berthd had no capacity for a new sandbox or exec
// (codes.ResourceExhausted, ReasonFleetBusy). Nothing was started: the same
// call may be made again after RetryDelay, which a Client with WithRetry
// does by itself.
type FleetBusyError struct {
	*baseError
	// Detail says which capacity ran out, its limit and use, and the retry
	// delay; never nil.
	Detail *berthv1.FleetBusy
}

// UnreachableError means the sandbox's agent did not answer within berthd's
// connect budget, or its task does not run (codes.Unavailable,
// ReasonUnreachable). Detail.Cause says which. When Detail.Admitted is
// ADMITTED_NOT_STARTED nothing ran, and a Client with WithRetry retries the
// call with jittered backoff; otherwise the call may have taken effect.
type UnreachableError struct {
	*baseError
	// Detail gives the cause, whether the task runs, the last known
	// runtime and how long berthd waited; never nil.
	Detail *berthv1.Unreachable
}

// RuntimeReplacedError means the sandbox's runtime (its container task and
// the agent in it) died or changed while the exec ran or was being attached
// (codes.Aborted, ReasonRuntimeReplaced). The exec's processes are gone; it
// may have run partly (Detail.Admitted). Files in the sandbox survive when
// berthd restarted its task (Detail.After); processes and memory do not.
// It is never retried automatically: decide whether running the command
// again is safe.
type RuntimeReplacedError struct {
	*baseError
	// Detail names the runtimes before and after, the old task's exit
	// status and whether the exec had started; never nil.
	Detail *berthv1.RuntimeReplaced
}

// StaleHandleError means the call named an exec of an earlier runtime of the
// sandbox (codes.FailedPrecondition, ReasonStaleHandle): its process is gone
// with that runtime. Nothing was done. Start a new exec with a new exec id;
// it is never retried automatically.
type StaleHandleError struct {
	*baseError
	// Detail names the exec's runtime and the sandbox's current one; never
	// nil.
	Detail *berthv1.StaleHandle
}

// DependencyError means the call failed because something berthd depends
// on failed, outside any sandbox: containerd did not answer
// (codes.Unavailable, ReasonContainerdUnavailable), the disk of berthd's
// own directories is full (codes.ResourceExhausted, ReasonServerDiskFull)
// or berthd is out of file descriptors (ReasonServerDescriptors). When
// Detail.Admitted is ADMITTED_NOT_STARTED nothing changed, and a Client
// with WithRetry retries a containerd failure with jittered backoff; a
// create or delete that may have taken effect in part (ADMITTED_UNKNOWN)
// is safe to repeat with the same sandbox id.
type DependencyError struct {
	*baseError
	// Detail names the dependency, how it failed, what berthd was doing
	// and how long it waited; never nil.
	Detail *berthv1.DependencyFailure
}

// Unwrap returns the *Error.
func (e *DependencyError) Unwrap() error { return e.baseError }

// NothingRan reports whether berthd says the failed call changed nothing
// (Detail.Admitted is ADMITTED_NOT_STARTED).
func (e *DependencyError) NothingRan() bool {
	return e.Detail.GetAdmitted() == berthv1.Admitted_ADMITTED_NOT_STARTED
}

// Unwrap returns the *Error.
func (e *FleetBusyError) Unwrap() error { return e.baseError }

// Unwrap returns the *Error.
func (e *UnreachableError) Unwrap() error { return e.baseError }

// Unwrap returns the *Error.
func (e *RuntimeReplacedError) Unwrap() error { return e.baseError }

// Unwrap returns the *Error.
func (e *StaleHandleError) Unwrap() error { return e.baseError }

// DefaultBusyDelay is FleetBusyError.Delay when the status carries no
// delay (berthd always sends one; a proxy may drop the details).
const DefaultBusyDelay = time.Second

// Delay returns how long to wait before retrying: the status's RetryInfo
// delay, else the detail's, else DefaultBusyDelay. It is never zero: a
// retry at once would meet the same full capacity.
func (e *FleetBusyError) Delay() time.Duration {
	if e.RetryDelay > 0 {
		return e.RetryDelay
	}
	if d := e.Detail.GetRetryDelay(); d.IsValid() && d.AsDuration() > 0 {
		return d.AsDuration()
	}
	return DefaultBusyDelay
}

// FreedByWaiting reports whether waiting alone can free the capacity that
// ran out: false for disk (CAPACITY_RESOURCE_DISK and _PRINCIPAL_DISK),
// which stays promised until a sandbox, snapshot or fork copy is deleted,
// so IsRetryable says no and berthd sends no RetryInfo; true for
// sandboxes, memory, execs and Run output buffers, which others' work
// frees as it ends.
func (e *FleetBusyError) FreedByWaiting() bool {
	switch e.Detail.GetResource() {
	case berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK:
		return false
	}
	return true
}

// NothingRan reports whether berthd says the failed call ran nothing
// (Detail.Admitted is ADMITTED_NOT_STARTED). A status that does not say,
// without the detail or with admitted unspecified, may have run: retrying
// it could run a command twice.
func (e *UnreachableError) NothingRan() bool {
	return e.Detail.GetAdmitted() == berthv1.Admitted_ADMITTED_NOT_STARTED
}

// IsRetryable reports whether err is a condition that is safe to retry as
// is: a *FleetBusyError that waiting can cure (after its Delay; not a
// full disk budget: FreedByWaiting), an *UnreachableError whose call
// ran nothing, a *DependencyError for containerd not answering whose
// call changed nothing, or an *Error with ReasonClusterUnavailable (a
// fleet's etcd did not answer, or no node holds a lease: berthd sent the
// call to no node and recorded nothing). RuntimeReplaced and StaleHandle are not: the
// command may have run, or the exec it names is gone; nor is a full disk
// or a lack of descriptors on berthd's host, which a retry does not cure.
// It never looks at message text.
func IsRetryable(err error) bool {
	var busy *FleetBusyError
	if errors.As(err, &busy) {
		return busy.FreedByWaiting()
	}
	var dep *DependencyError
	if errors.As(err, &dep) {
		return dep.Reason == ReasonContainerdUnavailable && dep.NothingRan()
	}
	var unreachable *UnreachableError
	if errors.As(err, &unreachable) {
		return unreachable.NothingRan()
	}
	var e *Error
	return errors.As(err, &e) && e.Reason == ReasonClusterUnavailable
}
