// Package rpcstatus builds the gRPC statuses berth returns: a canonical code,
// a message that says what failed, a google.rpc.ErrorInfo whose reason is a
// stable machine token, and, for invalid requests, a google.rpc.BadRequest
// naming the field. Both berthd and berth-agent build their errors here so
// that every error carries the same details.
package rpcstatus

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/berth-sandbox/berth/internal/textsafe"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// Domain is the ErrorInfo domain of every berth error.
const Domain = "berth.dev"

// Reason tokens carried in ErrorInfo.reason. They are stable: clients switch
// on them.
const (
	ReasonInvalidArgument = "INVALID_ARGUMENT"
	ReasonSandboxNotFound = "SANDBOX_NOT_FOUND"
	ReasonSandboxExists   = "SANDBOX_EXISTS"
	ReasonImageNotFound   = "IMAGE_NOT_FOUND"
	ReasonImageArchive    = "IMAGE_ARCHIVE_INVALID"
	// ReasonImageExists (ALREADY_EXISTS): CommitSnapshot without replace
	// names a stored image.
	ReasonImageExists = "IMAGE_EXISTS"
	// ReasonImageUnusable (FAILED_PRECONDITION): what the image holds
	// cannot start a sandbox (its /etc/passwd is a named pipe, say).
	ReasonImageUnusable = "IMAGE_UNUSABLE"
	ReasonExecNotFound  = "EXEC_NOT_FOUND"
	ReasonExecExists    = "EXEC_EXISTS"
	ReasonCwdInvalid    = "CWD_INVALID"
	// ReasonStdinOffsetGap: FAILED_PRECONDITION, a WriteExecStdin offset
	// beyond the stdin bytes the exec has taken (metadata
	// "expected_offset").
	ReasonStdinOffsetGap = "STDIN_OFFSET_GAP"
	// Shell sessions (docs/sessions.md).
	ReasonSessionNotFound = "SESSION_NOT_FOUND" // NOT_FOUND: no such session in the sandbox
	ReasonSessionExists   = "SESSION_EXISTS"    // ALREADY_EXISTS: the session id is taken
	ReasonSessionBusy     = "SESSION_BUSY"      // FAILED_PRECONDITION: a command runs in the session
	ReasonSessionEnded    = "SESSION_ENDED"     // FAILED_PRECONDITION: the session's shell exited
	ReasonWatchNotFound   = "WATCH_NOT_FOUND"   // NOT_FOUND: no such file watch (docs/watch.md)
	// Code contexts (docs/contexts.md).
	ReasonContextNotFound    = "CONTEXT_NOT_FOUND"    // NOT_FOUND: no such code context in the sandbox
	ReasonContextExists      = "CONTEXT_EXISTS"       // ALREADY_EXISTS: the context id is taken by a running context
	ReasonContextEnded       = "CONTEXT_ENDED"        // FAILED_PRECONDITION: the context's interpreter ended; restart it
	ReasonCellFrameTooLarge  = "CELL_FRAME_TOO_LARGE" // RESOURCE_EXHAUSTED: the interpreter wrote a protocol line past berthd's bound
	ReasonInterpreterMissing = "INTERPRETER_MISSING"  // FAILED_PRECONDITION: the image has no interpreter for the language
	ReasonSandboxNotRunning  = "SANDBOX_NOT_RUNNING"
	// ReasonSandboxPaused (FAILED_PRECONDITION): the call names a paused
	// sandbox and asked not to resume it (NoResumeHeader).
	ReasonSandboxPaused = "SANDBOX_PAUSED"
	// ReasonSandboxHibernated (FAILED_PRECONDITION): the call names a
	// hibernated sandbox and asked not to wake it (NoResumeHeader).
	ReasonSandboxHibernated = "SANDBOX_HIBERNATED"
	// ReasonSnapshotNotFound (NOT_FOUND): no such snapshot, or another
	// principal's.
	ReasonSnapshotNotFound = "SNAPSHOT_NOT_FOUND"
	// ReasonSnapshotUnsupported (FAILED_PRECONDITION): snapshots need the
	// btrfs snapshotter and a sandbox with an idmapped root.
	ReasonSnapshotUnsupported = "SNAPSHOT_UNSUPPORTED"
	// ReasonSnapshotInUse (FAILED_PRECONDITION): a sandbox created from
	// the snapshot still exists.
	ReasonSnapshotInUse = "SNAPSHOT_IN_USE"
	// ReasonSnapshotLimit (RESOURCE_EXHAUSTED): the caller holds as many
	// snapshots as berthd allows one principal; deleting one frees room.
	ReasonSnapshotLimit = "SNAPSHOT_LIMIT"
	// ReasonVolumeNotFound (NOT_FOUND): no such volume, or another
	// principal's.
	ReasonVolumeNotFound = "VOLUME_NOT_FOUND"
	// ReasonVolumeExists (ALREADY_EXISTS): the caller holds a volume of
	// that name.
	ReasonVolumeExists = "VOLUME_EXISTS"
	// ReasonVolumeInUse (FAILED_PRECONDITION): sandboxes mount the volume;
	// metadata "sandbox_ids" names them.
	ReasonVolumeInUse = "VOLUME_IN_USE"
	// ReasonVolumeUnsupported (FAILED_PRECONDITION): volumes need the btrfs
	// snapshotter with quotas and a kernel that idmaps, on a single berthd.
	ReasonVolumeUnsupported = "VOLUME_UNSUPPORTED"
	ReasonUnreachable       = "SANDBOX_UNREACHABLE"
	ReasonInternal          = "INTERNAL"
	// The runtime conditions of berth.v1's errors.proto: each status with
	// one of these reasons also carries the typed detail of that name.
	ReasonFleetBusy       = "FLEET_BUSY"
	ReasonRuntimeReplaced = "RUNTIME_REPLACED"
	ReasonStaleHandle     = "STALE_HANDLE"
	// ReasonCanceled and ReasonDeadlineExceeded mark a request that ended
	// because the caller canceled it or its deadline passed.
	ReasonCanceled         = "CANCELED"
	ReasonDeadlineExceeded = "DEADLINE_EXCEEDED"
	ReasonRegistry         = "REGISTRY_UNREACHABLE"
	// ReasonOutputLost (DATA_LOSS) marks a Run whose command ran but whose
	// output within the caps did not all arrive.
	ReasonOutputLost = "OUTPUT_LOST"
	// ReasonRegistryNotAllowed (FAILED_PRECONDITION): berthd's
	// configuration does not let PullImage reach the image's registry.
	ReasonRegistryNotAllowed = "REGISTRY_NOT_ALLOWED"
	// ReasonDiskQuotaUnsupported: a disk quota was asked for on a server
	// whose snapshotter cannot enforce one.
	ReasonDiskQuotaUnsupported = "DISK_QUOTA_UNSUPPORTED"
	// ReasonUnauthenticated (UNAUTHENTICATED): the request carries no
	// valid credentials. ReasonNotPermitted (PERMISSION_DENIED): the
	// principal may not call the method (an admin-only one) or act on
	// another's behalf.
	ReasonUnauthenticated = "UNAUTHENTICATED"
	ReasonNotPermitted    = "NOT_PERMITTED"
	// Something berthd depends on failed (berth.v1.DependencyFailure):
	// containerd did not answer (UNAVAILABLE), the disk of berthd's own
	// directories is full or berthd is out of file descriptors
	// (RESOURCE_EXHAUSTED).
	ReasonContainerdUnavailable = "CONTAINERD_UNAVAILABLE"
	ReasonServerDiskFull        = "SERVER_DISK_FULL"
	ReasonServerDescriptors     = "SERVER_DESCRIPTORS_EXHAUSTED"
	// A fleet of berthd nodes (server/cluster). ReasonClusterUnavailable
	// (UNAVAILABLE): the cluster store (etcd) does not answer, or no node
	// holds a lease. ReasonNotClustered (FAILED_PRECONDITION): a NodeService
	// call to a berthd that is not part of a fleet. ReasonNodeNotFound
	// (NOT_FOUND): no such node. ReasonNoMatchingNode (FAILED_PRECONDITION):
	// no node has the labels a sandbox's placement constraints ask for.
	ReasonClusterUnavailable = "CLUSTER_UNAVAILABLE"
	ReasonNotClustered       = "NOT_CLUSTERED"
	ReasonNodeNotFound       = "NODE_NOT_FOUND"
	ReasonNoMatchingNode     = "NO_MATCHING_NODE"
	// ReasonNodeLive (FAILED_PRECONDITION): RemoveNode of a node that
	// holds a lease. ReasonNodeChanged (ABORTED): the node registered, or
	// one of its sandbox records changed, while RemoveNode removed them.
	ReasonNodeLive    = "NODE_LIVE"
	ReasonNodeChanged = "NODE_CHANGED"
	// ReasonNotANode (FAILED_PRECONDITION): an image call to a gateway
	// berthd, which holds no image store.
	ReasonNotANode = "NOT_A_NODE"
	// Between nodes only: a node answers a routed CreateSandbox with
	// ReasonPlacedElsewhere (ABORTED; metadata "node_id" names the holder)
	// when the cluster store records the id on another node, and with
	// ReasonNodeNotAccepting (UNAVAILABLE) when it takes no new sandboxes
	// (draining, or without a lease). The routing node acts on them; callers
	// do not see them.
	ReasonPlacedElsewhere  = "SANDBOX_PLACED_ELSEWHERE"
	ReasonNodeNotAccepting = "NODE_NOT_ACCEPTING"
	// ReasonJournalUnavailable (UNAVAILABLE) refuses an exec start that
	// berthd could not record in its runtime journal (a full or read-only
	// journal directory): nothing ran, and a retry is safe.
	ReasonJournalUnavailable = "JOURNAL_UNAVAILABLE"
)

// Error returns a status error with code, message msg and an ErrorInfo with
// reason and metadata meta (which may be nil), plus any extra details.
// msg and the metadata values are made safe to show (see safeText): raw
// control and bidirectional formatting characters and invalid UTF-8 are
// escaped, and each is cut to maxText bytes. Messages quote a request's
// values with textsafe.Quote, which bounds each one further.
func Error(code codes.Code, reason, msg string, meta map[string]string, extra ...protoadapt.MessageV1) error {
	st := status.New(code, safeText(msg))
	for _, v := range meta {
		if safeText(v) != v {
			safe := make(map[string]string, len(meta))
			for k, v := range meta {
				safe[k] = safeText(v)
			}
			meta = safe
			break
		}
	}
	details := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}}, extra...)
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		// WithDetails fails only for an OK status or unmarshalable details;
		// the bare status still says what failed.
		return st.Err()
	}
	return withDetails.Err()
}

// SandboxTaken is ALREADY_EXISTS SANDBOX_EXISTS for a sandbox id that a
// sandbox the caller may not see holds: ids are one namespace, so the
// create cannot go ahead, but the answer says nothing of that sandbox (no
// spec, no differing fields, not even whether it runs or where). berthd's
// handlers and its fleet router give it word for word alike.
func SandboxTaken(id string) error {
	return Error(codes.AlreadyExists, ReasonSandboxExists,
		fmt.Sprintf("sandbox id %s is taken; choose another id, or let berthd choose one (leave sandbox_id empty)", id),
		map[string]string{"sandbox_id": id})
}

// InvalidArgument returns an INVALID_ARGUMENT status naming field, with
// message "<field>: <description>" and a BadRequest field violation.
func InvalidArgument(field, description string) error {
	description = safeText(description)
	return Error(codes.InvalidArgument, ReasonInvalidArgument, field+": "+description,
		map[string]string{"field": field},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: description}}})
}

// RenameField returns err with the field it names moved from under prefix
// from to under prefix to: the message's leading field, ErrorInfo's
// "field" metadata and BadRequest's field violations. A call that checks
// its request as another message (CreateSession's cwd and env checked as
// an exec's process.cwd and process.env) refuses in the caller's own
// words with it. Any other error, or one naming no field under from, is
// returned as it is.
func RenameField(err error, from, to string) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	p := st.Proto()
	changed := false
	if msg := p.GetMessage(); strings.HasPrefix(msg, from) {
		p.Message = to + strings.TrimPrefix(msg, from)
		changed = true
	}
	for _, a := range p.GetDetails() {
		m, uerr := a.UnmarshalNew()
		if uerr != nil {
			continue
		}
		switch d := m.(type) {
		case *errdetails.ErrorInfo:
			if f, ok := d.GetMetadata()["field"]; ok && strings.HasPrefix(f, from) {
				d.Metadata["field"] = to + strings.TrimPrefix(f, from)
			} else {
				continue
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if strings.HasPrefix(v.GetField(), from) {
					v.Field = to + strings.TrimPrefix(v.GetField(), from)
				}
			}
		default:
			continue
		}
		if merr := a.MarshalFrom(m); merr != nil {
			return err
		}
		changed = true
	}
	if !changed {
		return err
	}
	return status.ErrorProto(p)
}

// Reason returns the ErrorInfo reason of err when err is a berth status
// error, and "" otherwise.
func Reason(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return ""
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// Metadata returns the ErrorInfo metadata of err when err is a berth status
// error, and nil otherwise.
func Metadata(err error) map[string]string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return nil
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetMetadata()
		}
	}
	return nil
}

// maxText bounds a status message, a BadRequest description and an
// ErrorInfo metadata value, in bytes. Statuses travel in HTTP/2 trailers; a
// message quoting a hostile input in full (megabytes of argv, quoted at up
// to 4 bytes per byte) overflows the peer's header limits and breaks the
// whole connection (COMPRESSION_ERROR), every stream on it included.
const maxText = 2 << 10

// safeText returns s escaped (textsafe.Escape) and clipped. Status texts
// reach terminals, logs and other languages' clients: a raw ESC or NUL
// from a request must not arrive there as is, and proto3 strings must be
// valid UTF-8.
func safeText(s string) string { return clip(textsafe.Escape(s)) }

// clip returns s when it is at most maxText bytes, else its first bytes up
// to a UTF-8 character boundary followed by a note of the full length.
func clip(s string) string {
	if len(s) <= maxText {
		return s
	}
	n := maxText - 64 // room for the note
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s... (cut: %d bytes in all)", s[:n], len(s))
}

// Reason tokens of PortForward streams; ErrorInfo metadata "port" names the
// port in the sandbox.
const (
	// ReasonPortClosed (FAILED_PRECONDITION): nothing accepts connections
	// on the port inside the sandbox (connect(2) was refused or did not
	// complete).
	ReasonPortClosed = "PORT_CLOSED"
	// ReasonConnectionReset (ABORTED): the forwarded connection failed
	// after it opened (reset by the server in the sandbox, or a write to it
	// failed); bytes sent before may or may not have been read.
	ReasonConnectionReset = "CONNECTION_RESET"
)

// ReasonNetworkUnavailable (FAILED_PRECONDITION): a sandbox of network mode
// EGRESS was asked of a berthd whose sandbox network is not available
// (CNI plugins or nftables missing, or it failed to start); metadata
// "field" is "network.mode".
const ReasonNetworkUnavailable = "NETWORK_UNAVAILABLE"

// ReasonAgentTooOld (FAILED_PRECONDITION): the sandbox's agent is older
// than berthd and does not serve the call berthd made of it (it answered
// UNIMPLEMENTED); metadata "agent_method" names the agent's method,
// "agent_version" and "server_version" the two versions. A sandbox
// created anew runs berthd's agent.
const ReasonAgentTooOld = "AGENT_TOO_OLD"
