// Package status is berthd's one error boundary: it turns what handlers
// return — server/apierr's domain errors, the runtime's and network's
// sentinels, context errors, statuses agents built — into the gRPC status
// the caller gets, with its ErrorInfo reason and typed details
// (proto/berth/v1/errors.proto), as unary and stream interceptors.
// Handlers return plain errors and never convert them themselves.
package status

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Boundary converts errors to statuses.
type Boundary struct {
	// Log receives the causes of INTERNAL errors and journal failures.
	Log *slog.Logger
	// ConnectBudget is the agent connect budget that Unreachable details
	// report (server.Config.ConnectBudget).
	ConnectBudget time.Duration
	// ServerVersion goes into every typed detail.
	ServerVersion string
}

// UnaryInterceptor converts the error a unary handler returns.
func (b *Boundary) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, b.Status(ctx, err)
		}
		return resp, nil
	}
}

// StreamInterceptor converts the error a stream handler returns.
func (b *Boundary) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := handler(srv, ss); err != nil {
			return b.Status(ss.Context(), err)
		}
		return nil
	}
}

// Status converts err to the gRPC status returned to the caller. Statuses
// that already carry a berth ErrorInfo (built by an agent, a cluster
// router, a shared validator) pass unchanged, and anything unclassified
// becomes INTERNAL with its cause logged under an incident id that the
// message names, never passed through. An agent's own INTERNAL status is
// unclassified too: its text is the agent's, not the caller's to read. The
// ErrorInfo metadata holds what apierr.WithMeta put on err.
func (b *Boundary) Status(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var se interface {
		error
		GRPCStatus() *grpcstatus.Status
	}
	if errors.As(err, &se) {
		if r := rpcstatus.Reason(se); r != "" && r != rpcstatus.ReasonInternal && se.GRPCStatus().Code() != codes.Internal {
			// The status as it was built: a wrapper's text would put
			// "rpc error: code = ..." into its message.
			return se
		}
	}
	meta := apierr.Meta(err)
	msg := err.Error()
	var (
		invalid     *apierr.Invalid
		refused     *apierr.Refused
		busy        *apierr.FleetBusy
		unreachable *apierr.Unreachable
		replaced    *apierr.RuntimeReplaced
		stale       *apierr.StaleHandle
		journal     *apierr.Journal
		storeFull   *runtime.ImageStoreFull
		poolFull    *runtime.PoolFullError
		volumeInUse *runtime.VolumeInUseError
	)
	switch {
	case errors.As(err, &invalid):
		return rpcstatus.InvalidArgument(invalid.Field, invalid.Description)
	case errors.As(err, &refused):
		return rpcstatus.Error(refused.Code, refused.Reason, refused.Message, merge(meta, refused.Meta))
	case errors.As(err, &busy):
		details := []protoadapt.MessageV1{b.fleetBusy(busy)}
		if d := busy.Delay(); d > 0 {
			details = append(details, &errdetails.RetryInfo{RetryDelay: durationProto(d)})
		}
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, msg, merge(meta, map[string]string{"resource": busy.Resource.String(), "principal": busy.Principal}),
			details...)
	case errors.As(err, &replaced):
		return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonRuntimeReplaced, msg, with(meta, "exec_id", replaced.ExecID), b.runtimeReplaced(replaced))
	case errors.As(err, &stale):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonStaleHandle, msg, with(meta, "exec_id", stale.ExecID), b.staleHandle(stale))
	case errors.As(err, &journal):
		b.Log.ErrorContext(ctx, "exec refused: runtime journal write failed", slog.String("sandbox_id", journal.SandboxID), slog.String("exec_id", journal.ExecID), slog.Any("error", journal.Err))
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonJournalUnavailable, msg,
			with(meta, "admitted", berthv1.Admitted_ADMITTED_NOT_STARTED.String()))
	case errors.As(err, &poolFull):
		// Before the dependencies: the errno it carries is the pool's,
		// not berthd's own directories'.
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonNoSpace, msg, merge(meta, map[string]string{"resource": "sandbox_pool", "pool": poolFull.Pool}))
	case errors.As(err, &unreachable):
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg, with(meta, "cause", unreachable.Cause.String()), b.unreachable(unreachable))
	case errors.Is(err, apierr.ErrUnreachable):
		// Built without the facts (CreateSandbox's readiness wait): the
		// detail says what is known.
		d := &berthv1.Unreachable{SandboxId: meta["sandbox_id"], ConnectBudget: durationProto(b.ConnectBudget), ServerVersion: b.ServerVersion, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg, meta, d)
	case errors.Is(err, network.ErrUnavailable):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNetworkUnavailable, msg, with(meta, "field", "network.mode"))
	}
	if d, ok := DependencyOf(err, meta["sandbox_id"]); ok {
		return b.dependency(d, meta)
	}
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, msg, meta)
	case errors.Is(err, runtime.ErrTaskNotRunning):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSandboxNotRunning, msg, meta)
	case errors.Is(err, runtime.ErrSnapshotNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSnapshotNotFound, msg, meta)
	case errors.Is(err, runtime.ErrSnapshotUnsupported):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSnapshotUnsupported, msg, meta)
	case errors.Is(err, runtime.ErrSnapshotInUse):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSnapshotInUse, msg, meta)
	case errors.As(err, &volumeInUse):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonVolumeInUse, msg, merge(meta, map[string]string{"volume": volumeInUse.Name, "sandbox_ids": strings.Join(volumeInUse.SandboxIDs, ",")}))
	case errors.Is(err, runtime.ErrVolumeNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonVolumeNotFound, msg, meta)
	case errors.Is(err, runtime.ErrVolumeExists):
		return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonVolumeExists, msg, meta)
	case errors.Is(err, runtime.ErrVolumeUnsupported):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonVolumeUnsupported, msg, meta)
	case errors.Is(err, runtime.ErrSnapshotLimit):
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonSnapshotLimit, msg, meta)
	case errors.Is(err, runtime.ErrSandboxExists):
		return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSandboxExists, msg, meta)
	case errors.Is(err, runtime.ErrImageExists):
		return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonImageExists, msg, meta)
	case errors.Is(err, runtime.ErrImageNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonImageNotFound, msg, meta)
	case errors.Is(err, runtime.ErrImageShared):
		return rpcstatus.Error(codes.PermissionDenied, rpcstatus.ReasonNotPermitted, msg, meta)
	case errors.Is(err, runtime.ErrDiskQuotaUnsupported):
		// Create could not put the quota in force (the kernel's quota
		// accounting stayed inconsistent); nothing was created.
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonDiskQuotaUnsupported, msg, with(meta, "field", "resources.disk_bytes"))
	case errors.Is(err, runtime.ErrImageUnusable):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonImageUnusable, msg, with(meta, "field", "image"))
	case errors.As(err, &storeFull):
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonNoSpace, msg, merge(meta, map[string]string{"resource": "image_store",
			"limit_bytes": strconv.FormatUint(storeFull.LimitBytes, 10), "used_bytes": strconv.FormatUint(storeFull.UsedBytes, 10)}))
	case errors.Is(err, runtime.ErrImageArchive):
		return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonImageArchive, msg, meta)
	case errors.Is(err, context.Canceled) || grpcstatus.Code(err) == codes.Canceled:
		return rpcstatus.Error(codes.Canceled, rpcstatus.ReasonCanceled, "request canceled: "+msg, meta)
	case errors.Is(err, context.DeadlineExceeded) || grpcstatus.Code(err) == codes.DeadlineExceeded:
		return rpcstatus.Error(codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded, "deadline exceeded: "+msg, meta)
	}
	return Internal(ctx, b.Log, err, meta)
}

// Internal logs err under a new incident id and returns INTERNAL naming
// the id, without err's text.
func Internal(ctx context.Context, log *slog.Logger, cause any, meta map[string]string) error {
	incident := sandboxid.New("", 10)
	log.ErrorContext(ctx, "internal error", slog.String("incident", incident), slog.Any("error", cause), slog.Any("meta", meta))
	return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "internal error "+incident+"; the server log has the cause", with(meta, "incident", incident))
}

// DependencyOf classifies err as a dependency failure: containerd not
// answering (runtime.UnavailableError), a host resource running out
// (runtime.HostError, or any error carrying ENOSPC, EDQUOT, EMFILE or
// ENFILE from berthd's own system calls: the agents' and containerd's
// failures arrive as statuses, never as errnos), or an *apierr.Dependency
// built where the failure happened. An *apierr.Attempt in err's chain
// overrides the facts it sets. sandboxID fills the detail when the error
// does not name one.
func DependencyOf(err error, sandboxID string) (*apierr.Dependency, bool) {
	d, ok := dependencyOf(err, sandboxID)
	if !ok {
		return nil, false
	}
	var at *apierr.Attempt
	if errors.As(err, &at) {
		if at.Op != "" {
			d.Op = at.Op
		}
		if at.Waited > 0 {
			d.Waited = at.Waited
		}
		if at.Admitted != berthv1.Admitted_ADMITTED_UNSPECIFIED {
			d.Admitted = at.Admitted
		}
	}
	return d, true
}

func dependencyOf(err error, sandboxID string) (*apierr.Dependency, bool) {
	var (
		dep         *apierr.Dependency
		unavailable *runtime.UnavailableError
		host        *runtime.HostError
	)
	switch {
	case errors.As(err, &dep):
		d := *dep
		if d.SandboxID == "" {
			d.SandboxID = sandboxID
		}
		return &d, true
	case errors.As(err, &unavailable):
		d := &apierr.Dependency{SandboxID: sandboxID, Dependency: berthv1.Dependency_DEPENDENCY_CONTAINERD, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE,
			Op: unavailable.Op, Waited: unavailable.Waited, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, Err: err}
		if unavailable.Slow {
			d.Fault, d.Budget = berthv1.DependencyFault_DEPENDENCY_FAULT_SLOW, unavailable.Budget
		}
		if unavailable.Changed {
			d.Admitted = berthv1.Admitted_ADMITTED_UNKNOWN
		}
		return d, true
	}
	errno, ok := runtime.HostErrno(err)
	if !ok {
		return nil, false
	}
	// Where berthd's own call failed is known only to a runtime
	// operation: anything else may have taken effect in part.
	d := &apierr.Dependency{SandboxID: sandboxID, Dependency: berthv1.Dependency_DEPENDENCY_SERVER_DISK, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_FULL,
		Admitted: berthv1.Admitted_ADMITTED_UNKNOWN, Err: err}
	if errors.As(err, &host) {
		d.Op = host.Op
		if !host.Changed {
			d.Admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
		}
	}
	if errno == syscall.EMFILE || errno == syscall.ENFILE {
		d.Dependency, d.Fault = berthv1.Dependency_DEPENDENCY_SERVER_DESCRIPTORS, berthv1.DependencyFault_DEPENDENCY_FAULT_EXHAUSTED
	}
	return d, true
}

// dependency is the status of e: UNAVAILABLE CONTAINERD_UNAVAILABLE, or
// RESOURCE_EXHAUSTED SERVER_DISK_FULL or SERVER_DESCRIPTORS_EXHAUSTED, with
// the DependencyFailure detail.
func (b *Boundary) dependency(e *apierr.Dependency, meta map[string]string) error {
	code, reason := codes.Unavailable, rpcstatus.ReasonContainerdUnavailable
	switch e.Dependency {
	case berthv1.Dependency_DEPENDENCY_SERVER_DISK:
		code, reason = codes.ResourceExhausted, rpcstatus.ReasonServerDiskFull
	case berthv1.Dependency_DEPENDENCY_SERVER_DESCRIPTORS:
		code, reason = codes.ResourceExhausted, rpcstatus.ReasonServerDescriptors
	}
	msg := e.Err.Error()
	switch e.Admitted {
	case berthv1.Admitted_ADMITTED_NOT_STARTED:
		msg += "; nothing was changed"
	case berthv1.Admitted_ADMITTED_UNKNOWN:
		msg += "; it may have taken effect in part: retry with the same sandbox_id, which is idempotent"
	}
	d := &berthv1.DependencyFailure{SandboxId: e.SandboxID, Dependency: e.Dependency, Fault: e.Fault, Operation: e.Op,
		Waited: durationProto(e.Waited), Budget: durationProto(e.Budget), ServerVersion: b.ServerVersion, Admitted: e.Admitted}
	return rpcstatus.Error(code, reason, msg, with(meta, "dependency", e.Dependency.String()), d)
}

func (b *Boundary) unreachable(e *apierr.Unreachable) *berthv1.Unreachable {
	return &berthv1.Unreachable{
		SandboxId:     e.SandboxID,
		ExecId:        e.ExecID,
		Cause:         e.Cause,
		TaskRunning:   e.TaskRunning,
		Runtime:       e.Runtime.Proto(),
		Waited:        durationProto(e.Waited),
		ConnectBudget: durationProto(b.ConnectBudget),
		AgentVersion:  e.Runtime.AgentVersion,
		ServerVersion: b.ServerVersion,
		Admitted:      e.Admitted,
	}
}

func (b *Boundary) runtimeReplaced(e *apierr.RuntimeReplaced) *berthv1.RuntimeReplaced {
	d := &berthv1.RuntimeReplaced{
		SandboxId:      e.SandboxID,
		ExecId:         e.ExecID,
		Cause:          e.Cause,
		Before:         e.Before.Proto(),
		After:          e.After.Proto(),
		Restarting:     e.Restarting,
		TaskExitStatus: e.ExitStatus,
		OomKilled:      e.OOMKilled,
		Elapsed:        durationProto(e.Elapsed),
		AgentVersion:   e.Before.AgentVersion,
		ServerVersion:  b.ServerVersion,
		Admitted:       e.Admitted,
	}
	if !e.ExitedAt.IsZero() {
		d.TaskExitedAt = timestamppb.New(e.ExitedAt)
	}
	return d
}

func (b *Boundary) staleHandle(e *apierr.StaleHandle) *berthv1.StaleHandle {
	return &berthv1.StaleHandle{
		SandboxId:      e.SandboxID,
		ExecId:         e.ExecID,
		HandleRuntime:  e.Handle.Proto(),
		CurrentRuntime: e.Current.Proto(),
		AgentVersion:   e.Current.AgentVersion,
		ServerVersion:  b.ServerVersion,
		Admitted:       berthv1.Admitted_ADMITTED_NOT_STARTED,
	}
}

func (b *Boundary) fleetBusy(e *apierr.FleetBusy) *berthv1.FleetBusy {
	return &berthv1.FleetBusy{
		SandboxId:     e.SandboxID,
		Resource:      e.Resource,
		Limit:         e.Limit,
		InUse:         e.InUse,
		Requested:     e.Requested,
		RetryDelay:    durationProto(e.Delay()),
		ServerVersion: b.ServerVersion,
		Admitted:      berthv1.Admitted_ADMITTED_NOT_STARTED,
		Principal:     e.Principal,
	}
}

// with returns a copy of meta with k set to v (left out when v is empty).
func with(meta map[string]string, k, v string) map[string]string {
	return merge(meta, map[string]string{k: v})
}

// merge returns a copy of meta with extra's non-empty values set.
func merge(meta, extra map[string]string) map[string]string {
	out := make(map[string]string, len(meta)+len(extra))
	for k, v := range meta {
		out[k] = v
	}
	for k, v := range extra {
		if v != "" {
			out[k] = v
		}
	}
	return out
}

func durationProto(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// Of returns the status err becomes at a Boundary that logs to
// slog.Default, reports no connect budget and server version "dev": for
// tests and tools that check a validator's answer without a server.
func Of(err error) error {
	return (&Boundary{Log: slog.Default(), ServerVersion: "dev"}).Status(context.Background(), err)
}

// InvalidField returns the field named by the one BadRequest violation of
// the status err becomes (see Of), or "" when that status is not
// INVALID_ARGUMENT with exactly one violation.
func InvalidField(err error) string {
	st, ok := grpcstatus.FromError(Of(err))
	if !ok || st.Code() != codes.InvalidArgument {
		return ""
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}
