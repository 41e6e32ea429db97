package client

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of berth's errors.
const ErrorDomain = "berth.dev"

// Reason tokens berthd puts in Error.Reason. They are stable; switch on them
// instead of on messages.
const (
	ReasonInvalidArgument     = "INVALID_ARGUMENT"      // a request field is invalid; see FieldViolations
	ReasonSandboxNotFound     = "SANDBOX_NOT_FOUND"     // no such sandbox (or not the caller's)
	ReasonSandboxExists       = "SANDBOX_EXISTS"        // the sandbox id is taken: by another spec, or by a sandbox of another principal
	ReasonImageNotFound       = "IMAGE_NOT_FOUND"       // the image is not in berthd's store
	ReasonImageExists         = "IMAGE_EXISTS"          // ALREADY_EXISTS: CommitSnapshot without replace names a stored image
	ReasonImageArchive        = "IMAGE_ARCHIVE_INVALID" // an imported archive cannot be read or names no image
	ReasonExecNotFound        = "EXEC_NOT_FOUND"        // no such exec in the sandbox
	ReasonExecExists          = "EXEC_EXISTS"           // the exec id is taken
	ReasonCwdInvalid          = "CWD_INVALID"           // the working directory is missing or not a directory
	ReasonStdinOffsetGap      = "STDIN_OFFSET_GAP"      // WriteExecStdin past the stdin taken; metadata expected_offset
	ReasonSessionNotFound     = "SESSION_NOT_FOUND"     // NOT_FOUND: no such shell session in the sandbox
	ReasonSessionExists       = "SESSION_EXISTS"        // ALREADY_EXISTS: the session id is taken
	ReasonSessionBusy         = "SESSION_BUSY"          // FAILED_PRECONDITION: a command runs in the session; Metadata["exec_id"] names it
	ReasonSessionEnded        = "SESSION_ENDED"         // FAILED_PRECONDITION: the session's shell exited; delete it
	ReasonContextNotFound     = "CONTEXT_NOT_FOUND"     // NOT_FOUND: no such code context in the sandbox
	ReasonContextExists       = "CONTEXT_EXISTS"        // ALREADY_EXISTS: the context id is taken by a running context
	ReasonContextEnded        = "CONTEXT_ENDED"         // FAILED_PRECONDITION: the context's interpreter ended; restart it
	ReasonInterpreterMissing  = "INTERPRETER_MISSING"   // FAILED_PRECONDITION: the image has no interpreter (python3) for the context
	ReasonWatchNotFound       = "WATCH_NOT_FOUND"       // NOT_FOUND: no such file watch: it ended 10 minutes after its last stream
	ReasonSandboxNotRunning   = "SANDBOX_NOT_RUNNING"   // the sandbox's task is not running
	ReasonSandboxPaused       = "SANDBOX_PAUSED"        // FAILED_PRECONDITION: the sandbox is paused and the call asked not to resume it (NoResume)
	ReasonSandboxHibernated   = "SANDBOX_HIBERNATED"    // FAILED_PRECONDITION: the sandbox is hibernated and the call asked not to wake it (NoResume)
	ReasonSnapshotNotFound    = "SNAPSHOT_NOT_FOUND"    // no such snapshot (or not the caller's)
	ReasonSnapshotUnsupported = "SNAPSHOT_UNSUPPORTED"  // FAILED_PRECONDITION: snapshots need the btrfs snapshotter and an idmapped root
	ReasonSnapshotInUse       = "SNAPSHOT_IN_USE"       // FAILED_PRECONDITION: a sandbox created from the snapshot exists
	ReasonVolumeNotFound      = "VOLUME_NOT_FOUND"      // NOT_FOUND: no such volume, or another principal's
	ReasonVolumeExists        = "VOLUME_EXISTS"         // ALREADY_EXISTS: the caller holds a volume of that name
	ReasonVolumeInUse         = "VOLUME_IN_USE"         // FAILED_PRECONDITION: sandboxes mount the volume (metadata sandbox_ids)
	ReasonVolumeUnsupported   = "VOLUME_UNSUPPORTED"    // FAILED_PRECONDITION: volumes need btrfs with quotas and idmapping, one berthd
	ReasonSnapshotLimit       = "SNAPSHOT_LIMIT"        // RESOURCE_EXHAUSTED: the caller holds as many snapshots as berthd allows one principal
	ReasonUnreachable         = "SANDBOX_UNREACHABLE"   // the sandbox's agent did not answer; see *UnreachableError
	ReasonInternal            = "INTERNAL"              // a berthd bug or an unclassified failure
	ReasonFleetBusy           = "FLEET_BUSY"            // no capacity right now; nothing started; see *FleetBusyError
	ReasonRuntimeReplaced     = "RUNTIME_REPLACED"      // the sandbox's runtime died under the exec; see *RuntimeReplacedError
	ReasonStaleHandle         = "STALE_HANDLE"          // the exec id is from an earlier runtime; see *StaleHandleError
	ReasonCanceled            = "CANCELED"              // the caller canceled the request
	ReasonDeadlineExceeded    = "DEADLINE_EXCEEDED"     // the request's deadline passed
	ReasonRegistry            = "REGISTRY_UNREACHABLE"  // PullImage could not reach the image's registry
	// ReasonRegistryNotAllowed (FAILED_PRECONDITION): berthd may not pull
	// from the image's registry (berthd --pull-registry); nothing was sent.
	ReasonRegistryNotAllowed = "REGISTRY_NOT_ALLOWED"
	// ReasonDiskQuotaUnsupported: resources.disk_bytes was set on a server
	// that cannot enforce disk quotas (FAILED_PRECONDITION); nothing was
	// created. Create without disk_bytes, or on a server that has them.
	ReasonDiskQuotaUnsupported = "DISK_QUOTA_UNSUPPORTED"
	ReasonUnauthenticated      = "UNAUTHENTICATED" // the request carries no valid credentials (token, client certificate)
	ReasonNotPermitted         = "NOT_PERMITTED"   // the principal may not call the method (image writes are for admins)
	// ReasonOutputLost (DATA_LOSS): a Run's command ran, but its output
	// within the caps did not all arrive; Metadata["exec_id"] names the
	// exec, which may be attached for what is retained. Not retryable
	// blindly: the command ran.
	ReasonOutputLost = "OUTPUT_LOST"
	// A fleet of berthd nodes. A sandbox whose node is lost or does not
	// answer is an *UnreachableError (ReasonUnreachable) whose
	// Detail.Cause is UNREACHABLE_CAUSE_NODE_LOST or
	// UNREACHABLE_CAUSE_NODE_UNREACHABLE and Detail.NodeId names the node.
	ReasonClusterUnavailable = "CLUSTER_UNAVAILABLE" // the cluster store (etcd) does not answer, or no node holds a lease
	ReasonNotClustered       = "NOT_CLUSTERED"       // a NodeService call to a berthd outside a fleet
	ReasonNodeNotFound       = "NODE_NOT_FOUND"      // no node of that id in the fleet
	ReasonNodeLive           = "NODE_LIVE"           // RemoveNode of a node that holds a lease: stop its berthd first
	ReasonNodeChanged        = "NODE_CHANGED"        // RemoveNode raced the node registering or its records changing: list and try again
	ReasonNoMatchingNode     = "NO_MATCHING_NODE"    // no node has the labels the sandbox's node.berth.dev/ labels ask for
	ReasonNotANode           = "NOT_A_NODE"          // an image call to a gateway berthd, which holds no images
	// The sandbox's own limits (RESOURCE_EXHAUSTED): nothing was started;
	// the same request may work once something in the sandbox ends.
	// Error.Metadata["limit"] names the limit ("pids", "memory",
	// "descriptors") and ["errno"] the errno.
	ReasonPidsLimit       = "PIDS_LIMIT_REACHED"       // a fork failed: the sandbox's pids_limit is reached
	ReasonMemoryLimit     = "MEMORY_LIMIT_REACHED"     // the agent could not allocate: the sandbox's memory limit
	ReasonDescriptorLimit = "DESCRIPTOR_LIMIT_REACHED" // the agent is out of file descriptors
	// PortForward (Error.Metadata["port"] names the port in the sandbox).
	ReasonPortClosed      = "PORT_CLOSED"      // FAILED_PRECONDITION: nothing accepts connections on the port in the sandbox
	ReasonConnectionReset = "CONNECTION_RESET" // ABORTED: the forwarded connection failed after it opened
	// ReasonNetworkUnavailable (FAILED_PRECONDITION): network mode EGRESS
	// asked of a berthd without a working sandbox network.
	ReasonNetworkUnavailable = "NETWORK_UNAVAILABLE"
	// Something berthd depends on failed, not the request or a sandbox;
	// see *DependencyError.
	ReasonContainerdUnavailable = "CONTAINERD_UNAVAILABLE"       // UNAVAILABLE: containerd refused or did not answer in time
	ReasonServerDiskFull        = "SERVER_DISK_FULL"             // RESOURCE_EXHAUSTED: the disk of berthd's own directories is full
	ReasonServerDescriptors     = "SERVER_DESCRIPTORS_EXHAUSTED" // RESOURCE_EXHAUSTED: berthd is out of file descriptors
)

// Error is an error returned by berthd (or by gRPC on the way to it, such as
// codes.Unavailable when berthd cannot be reached, or codes.Canceled and
// codes.DeadlineExceeded when the caller's context ended). Every RPC error
// the Client returns is an *Error or, for the four runtime conditions, a
// typed error that wraps one (*FleetBusyError, *UnreachableError,
// *RuntimeReplacedError, *StaleHandleError), so errors.As finds the *Error
// in either case:
//
//	var e *client.Error
//	if errors.As(err, &e) && e.Reason == client.ReasonSandboxNotFound { ... }
//
// It implements GRPCStatus, so status.FromError and status.Code still work.
type Error struct {
	// Code is the canonical gRPC code.
	Code codes.Code
	// Reason is the stable token from the status's google.rpc.ErrorInfo of
	// domain ErrorDomain, e.g. ReasonSandboxNotFound; empty when the status
	// carries none (errors made by gRPC itself).
	Reason string
	// Message is the status message, for people; never parse it.
	Message string
	// Metadata is the ErrorInfo's metadata, e.g. {"field": "image"}; nil
	// when there is none.
	Metadata map[string]string
	// FieldViolations lists the request fields a google.rpc.BadRequest
	// detail blames, in order; set for codes.InvalidArgument.
	FieldViolations []FieldViolation
	// RetryDelay is the delay of the status's google.rpc.RetryInfo: how
	// long berthd suggests waiting before retrying; zero when there is
	// none.
	RetryDelay time.Duration

	status *status.Status
}

// FieldViolation names one invalid request field.
type FieldViolation struct {
	// Field is the field's path in the request, e.g. "process.argv".
	Field string
	// Description says what is wrong with it.
	Description string
}

// Error returns "<message> (<code>, <reason>)", or "<message> (<code>)"
// when there is no reason.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	b.WriteString(" (")
	b.WriteString(e.Code.String())
	if e.Reason != "" {
		b.WriteString(", ")
		b.WriteString(e.Reason)
	}
	b.WriteString(")")
	return b.String()
}

// GRPCStatus returns the status the error was made from, with all its
// details.
func (e *Error) GRPCStatus() *status.Status {
	return e.status
}

// convertError is the one place where an error from a gRPC call becomes the
// error the Client returns: a status error becomes an *Error, or the typed
// error of its reason; anything else (nil, local errors, errors converted
// already) is returned unchanged. The reason decides, never the message.
func convertError(err error) error {
	if err == nil {
		return nil
	}
	switch err.(type) {
	case *Error, *FleetBusyError, *UnreachableError, *RuntimeReplacedError, *StaleHandleError, *DependencyError:
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	var (
		busy        *berthv1.FleetBusy
		unreachable *berthv1.Unreachable
		replaced    *berthv1.RuntimeReplaced
		stale       *berthv1.StaleHandle
		dependency  *berthv1.DependencyFailure
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && e.Reason == "" {
				e.Reason = d.GetReason()
				if len(d.GetMetadata()) > 0 {
					e.Metadata = d.GetMetadata()
				}
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.FieldViolations = append(e.FieldViolations, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		case *errdetails.RetryInfo:
			if d.GetRetryDelay().IsValid() {
				e.RetryDelay = max(d.GetRetryDelay().AsDuration(), 0)
			}
		case *berthv1.FleetBusy:
			busy = d
		case *berthv1.Unreachable:
			unreachable = d
		case *berthv1.RuntimeReplaced:
			replaced = d
		case *berthv1.StaleHandle:
			stale = d
		case *berthv1.DependencyFailure:
			dependency = d
		}
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("berthd returned %s without a message", e.Code)
	}
	// A detail missing from the status (an older berthd) leaves an empty
	// one: the typed error is still made from the reason.
	switch e.Reason {
	case ReasonFleetBusy:
		return &FleetBusyError{baseError: e, Detail: orEmpty(busy)}
	case ReasonUnreachable:
		return &UnreachableError{baseError: e, Detail: orEmpty(unreachable)}
	case ReasonRuntimeReplaced:
		return &RuntimeReplacedError{baseError: e, Detail: orEmpty(replaced)}
	case ReasonStaleHandle:
		return &StaleHandleError{baseError: e, Detail: orEmpty(stale)}
	case ReasonContainerdUnavailable, ReasonServerDiskFull, ReasonServerDescriptors:
		return &DependencyError{baseError: e, Detail: orEmpty(dependency)}
	}
	return e
}

// orEmpty returns m, or a new empty message when m is nil.
func orEmpty[M any, P interface {
	*M
	proto.Message
}](m P) P {
	if m == nil {
		return P(new(M))
	}
	return m
}
