package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

func TestToStatus(t *testing.T) {
	var logged bytes.Buffer
	b := &Boundary{ConnectBudget: 3 * time.Second, ServerVersion: "v1", Log: slog.New(slog.NewTextHandler(&logged, nil))}
	rt := apierr.Runtime{BootID: strings.Repeat("1", 32), TaskPID: 42, AgentVersion: "v1"}
	meta := map[string]string{"sandbox_id": "sb"}
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
		// wantDetail is the type of the typed detail, nil for none.
		wantDetail proto.Message
		wantRetry  time.Duration
	}{
		{"fleet busy", &apierr.FleetBusy{SandboxID: "sb", Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS, Limit: 1, InUse: 1, Requested: 1, RetryDelay: 2 * time.Second},
			codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, &berthv1.FleetBusy{}, 2 * time.Second},
		// Only a deletion frees disk: no RetryInfo, so no client retries.
		{"fleet busy, disk", &apierr.FleetBusy{SandboxID: "sb", Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_DISK, Limit: 1, InUse: 1, Requested: 1, RetryDelay: 2 * time.Second},
			codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, &berthv1.FleetBusy{}, 0},
		{"fleet busy, principal's disk", &apierr.FleetBusy{SandboxID: "sb", Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK, Principal: "p", Limit: 1, InUse: 1, Requested: 1, RetryDelay: 2 * time.Second},
			codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, &berthv1.FleetBusy{}, 0},
		{"unreachable", fmt.Errorf("exec: %w", &apierr.Unreachable{SandboxID: "sb", Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, TaskRunning: true, Runtime: rt, What: "no answer", Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}),
			codes.Unavailable, rpcstatus.ReasonUnreachable, &berthv1.Unreachable{}, 0},
		{"unreachable without facts", fmt.Errorf("%w: agent did not answer", apierr.ErrUnreachable),
			codes.Unavailable, rpcstatus.ReasonUnreachable, &berthv1.Unreachable{}, 0},
		{"runtime replaced", &apierr.RuntimeReplaced{SandboxID: "sb", ExecID: "ex", Cause: berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED, Before: rt, ExitStatus: 137, ExitedAt: time.Now(), Admitted: berthv1.Admitted_ADMITTED_STARTED},
			codes.Aborted, rpcstatus.ReasonRuntimeReplaced, &berthv1.RuntimeReplaced{}, 0},
		{"stale handle", &apierr.StaleHandle{SandboxID: "sb", ExecID: "ex", Handle: rt, Current: apierr.Runtime{BootID: strings.Repeat("2", 32)}},
			codes.FailedPrecondition, rpcstatus.ReasonStaleHandle, &berthv1.StaleHandle{}, 0},
		{"sandbox not found", fmt.Errorf("load: %w", runtime.ErrSandboxNotFound), codes.NotFound, rpcstatus.ReasonSandboxNotFound, nil, 0},
		{"canceled", context.Canceled, codes.Canceled, rpcstatus.ReasonCanceled, nil, 0},
		{"deadline", status.Error(codes.DeadlineExceeded, "slow"), codes.DeadlineExceeded, rpcstatus.ReasonDeadlineExceeded, nil, 0},
		{"agent verdict passes", rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid, "cwd /x: no such directory", nil),
			codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid, nil, 0},
		{"unclassified", errors.New("containerd: secret internals"), codes.Internal, rpcstatus.ReasonInternal, nil, 0},
		// A full pool is the sandboxes' disk, not berthd's (issue 21).
		{"pool full", &runtime.PoolFullError{Pool: "the btrfs pool /pool", Op: "create sandbox sb", Err: fmt.Errorf("write: %w", syscall.ENOSPC)},
			codes.ResourceExhausted, rpcstatus.ReasonNoSpace, nil, 0},
		{"server disk full", &runtime.HostError{Op: "create sandbox sb", Err: fmt.Errorf("write: %w", syscall.ENOSPC)},
			codes.ResourceExhausted, rpcstatus.ReasonServerDiskFull, &berthv1.DependencyFailure{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logged.Reset()
			st := status.Convert(b.Status(context.Background(), apierr.WithMeta(tt.err, meta)))
			if st.Code() != tt.wantCode || st.Message() == "" {
				t.Errorf("status = %v %q, want %v and a message", st.Code(), st.Message(), tt.wantCode)
			}
			var info *errdetails.ErrorInfo
			var detail proto.Message
			var retry *errdetails.RetryInfo
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					info = d
				case *errdetails.RetryInfo:
					retry = d
				case proto.Message:
					detail = d
				}
			}
			if info.GetReason() != tt.wantReason || info.GetDomain() != rpcstatus.Domain {
				t.Errorf("ErrorInfo = %v, want reason %s", info, tt.wantReason)
			}
			if (tt.wantDetail == nil) != (detail == nil) || (detail != nil && detail.ProtoReflect().Descriptor() != tt.wantDetail.ProtoReflect().Descriptor()) {
				t.Errorf("detail = %T, want %T", detail, tt.wantDetail)
			}
			if got := retry.GetRetryDelay().AsDuration(); (retry != nil) != (tt.wantRetry != 0) || got != tt.wantRetry {
				t.Errorf("RetryInfo = %v, want %v", retry, tt.wantRetry)
			}
			if fb, ok := detail.(*berthv1.FleetBusy); ok && fb.GetRetryDelay().AsDuration() != tt.wantRetry {
				t.Errorf("FleetBusy.retry_delay = %v, want %v", fb.GetRetryDelay(), tt.wantRetry)
			}
		})
	}
	t.Run("unclassified hides the cause and logs it", func(t *testing.T) {
		logged.Reset()
		st := status.Convert(b.Status(context.Background(), apierr.WithMeta(errors.New("containerd: secret internals"), meta)))
		if strings.Contains(st.Message(), "secret") {
			t.Errorf("message %q passes the cause through", st.Message())
		}
		incident := rpcstatus.Reason(st.Err())
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		id := info.GetMetadata()["incident"]
		if incident != rpcstatus.ReasonInternal || id == "" || !strings.Contains(st.Message(), id) {
			t.Errorf("status %q, metadata %v: want the incident id in both", st.Message(), info.GetMetadata())
		}
		if !strings.Contains(logged.String(), "secret internals") || !strings.Contains(logged.String(), id) {
			t.Errorf("log %q lacks the cause or incident %s", logged.String(), id)
		}
	})
}

// TestToStatusAgentInternal passes an agent's INTERNAL status (an errno
// the agent could not classify, with its raw text) through the boundary: it is
// an incident like any unclassified failure, its text logged, never sent.
func TestToStatusAgentInternal(t *testing.T) {
	var logged bytes.Buffer
	b := &Boundary{Log: slog.New(slog.NewTextHandler(&logged, nil))}
	agentErr := rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "read /workspace/x: input/output error", map[string]string{"path": "/workspace/x"})
	for _, err := range []error{agentErr, fmt.Errorf("agent of sandbox sb: %w", agentErr), status.Error(codes.Internal, "grpc: error while marshaling")} {
		logged.Reset()
		st := status.Convert(b.Status(context.Background(), apierr.WithMeta(err, map[string]string{"sandbox_id": "sb"})))
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		id := info.GetMetadata()["incident"]
		if st.Code() != codes.Internal || info.GetReason() != rpcstatus.ReasonInternal || id == "" || !strings.Contains(st.Message(), id) {
			t.Errorf("Status(%v) = %v %q %v, want INTERNAL naming an incident", err, st.Code(), st.Message(), info)
		}
		if strings.Contains(st.Message(), "input/output") || strings.Contains(st.Message(), "marshaling") {
			t.Errorf("Status(%v) message %q passes the agent's text through", err, st.Message())
		}
		if info.GetMetadata()["sandbox_id"] != "sb" {
			t.Errorf("Status(%v) metadata %v, want the sandbox named", err, info.GetMetadata())
		}
		if !strings.Contains(logged.String(), id) || !strings.Contains(logged.String(), status.Convert(err).Message()) {
			t.Errorf("log %q lacks incident %s or the agent's text", logged.String(), id)
		}
	}
}
