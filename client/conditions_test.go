package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// scriptedClient serves fake and dials it with opts.
func scriptedClient(t *testing.T, fake *scriptedBerthd, opts ...client.Option) *client.Client {
	t.Helper()
	addr, stop, err := startScriptedBerthd(fake)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c, err := client.Dial(t.Context(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConditionErrors checks that each runtime condition arrives as its own
// type, with its detail, wrapping the *client.Error, from the reason alone.
func TestConditionErrors(t *testing.T) {
	tests := []struct {
		name          string
		status        error
		wantCode      codes.Code
		wantReason    string
		wantDetail    proto.Message
		wantRetryable bool
		detail        func(error) (proto.Message, bool)
	}{{
		name: "fleet busy", status: busyStatus("sb", 250*time.Millisecond),
		wantCode: codes.ResourceExhausted, wantReason: client.ReasonFleetBusy, wantRetryable: true,
		detail: func(err error) (proto.Message, bool) {
			var e *client.FleetBusyError
			if !errors.As(err, &e) {
				return nil, false
			}
			if e.Delay() != 250*time.Millisecond || e.RetryDelay != 250*time.Millisecond {
				t.Errorf("Delay() = %v, RetryDelay %v, want 250ms", e.Delay(), e.RetryDelay)
			}
			return e.Detail, true
		},
	}, {
		name: "unreachable, nothing ran", status: unreachableStatus("sb", berthv1.Admitted_ADMITTED_NOT_STARTED),
		wantCode: codes.Unavailable, wantReason: client.ReasonUnreachable, wantRetryable: true,
		detail: func(err error) (proto.Message, bool) {
			var e *client.UnreachableError
			if !errors.As(err, &e) {
				return nil, false
			}
			if !e.NothingRan() {
				t.Errorf("NothingRan() = false for %v", e.Detail)
			}
			return e.Detail, true
		},
	}, {
		name: "unreachable after the start", status: unreachableStatus("sb", berthv1.Admitted_ADMITTED_UNKNOWN),
		wantCode: codes.Unavailable, wantReason: client.ReasonUnreachable, wantRetryable: false,
	}, {
		name: "runtime replaced", status: replacedStatus("sb", "ex-1"),
		wantCode: codes.Aborted, wantReason: client.ReasonRuntimeReplaced,
		detail: func(err error) (proto.Message, bool) {
			var e *client.RuntimeReplacedError
			if !errors.As(err, &e) {
				return nil, false
			}
			return e.Detail, true
		},
	}, {
		name: "stale handle", status: staleStatus("sb", "ex-1"),
		wantCode: codes.FailedPrecondition, wantReason: client.ReasonStaleHandle,
		detail: func(err error) (proto.Message, bool) {
			var e *client.StaleHandleError
			if !errors.As(err, &e) {
				return nil, false
			}
			return e.Detail, true
		},
	}, {
		name: "containerd down, nothing changed", status: dependencyStatus(rpcstatus.ReasonContainerdUnavailable, codes.Unavailable, berthv1.Dependency_DEPENDENCY_CONTAINERD, berthv1.Admitted_ADMITTED_NOT_STARTED),
		wantCode: codes.Unavailable, wantReason: client.ReasonContainerdUnavailable, wantRetryable: true,
		detail: func(err error) (proto.Message, bool) {
			var e *client.DependencyError
			if !errors.As(err, &e) {
				return nil, false
			}
			if !e.NothingRan() {
				t.Errorf("NothingRan() = false for %v", e.Detail)
			}
			return e.Detail, true
		},
	}, {
		name: "containerd down during a create", status: dependencyStatus(rpcstatus.ReasonContainerdUnavailable, codes.Unavailable, berthv1.Dependency_DEPENDENCY_CONTAINERD, berthv1.Admitted_ADMITTED_UNKNOWN),
		wantCode: codes.Unavailable, wantReason: client.ReasonContainerdUnavailable, wantRetryable: false,
	}, {
		name: "server disk full", status: dependencyStatus(rpcstatus.ReasonServerDiskFull, codes.ResourceExhausted, berthv1.Dependency_DEPENDENCY_SERVER_DISK, berthv1.Admitted_ADMITTED_NOT_STARTED),
		wantCode: codes.ResourceExhausted, wantReason: client.ReasonServerDiskFull, wantRetryable: false,
		detail: func(err error) (proto.Message, bool) {
			var e *client.DependencyError
			if !errors.As(err, &e) {
				return nil, false
			}
			return e.Detail, true
		},
	}, {
		name: "fleet store unavailable", status: clusterStatus(250 * time.Millisecond),
		wantCode: codes.Unavailable, wantReason: client.ReasonClusterUnavailable, wantRetryable: true,
	}, {
		name: "not found", status: rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, "sandbox sb not found", nil),
		wantCode: codes.NotFound, wantReason: client.ReasonSandboxNotFound,
	}, {
		name: "transport unavailable is not a berth condition", status: status.Error(codes.Unavailable, "connection refused"),
		wantCode: codes.Unavailable,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newScriptedBerthd()
			fake.fail("sb", tt.status)
			c := scriptedClient(t, fake)
			_, err := c.GetSandbox(t.Context(), "sb")
			var ce *client.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T) does not wrap a *client.Error", err, err)
			}
			if ce.Code != tt.wantCode || ce.Reason != tt.wantReason || ce.Message != status.Convert(tt.status).Message() {
				t.Errorf("error = %v %q %q, want %v %q and the status message", ce.Code, ce.Reason, ce.Message, tt.wantCode, tt.wantReason)
			}
			if st, ok := status.FromError(err); !ok || st.Code() != tt.wantCode || len(st.Details()) != len(status.Convert(tt.status).Details()) {
				t.Errorf("status.FromError = %v, %v; want the full status", st, ok)
			}
			if got := client.IsRetryable(err); got != tt.wantRetryable {
				t.Errorf("IsRetryable = %v, want %v", got, tt.wantRetryable)
			}
			if tt.detail != nil {
				got, ok := tt.detail(err)
				if !ok {
					t.Fatalf("error %v (%T) is not the condition's type", err, err)
				}
				want := status.Convert(tt.status).Details()[1].(proto.Message)
				if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
					t.Errorf("detail (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// dependencyStatus is a status of a dependency failure as berthd sends it.
func dependencyStatus(reason string, code codes.Code, dep berthv1.Dependency, admitted berthv1.Admitted) error {
	return rpcstatus.Error(code, reason, "read sandbox sb: containerd refused the connection", map[string]string{"sandbox_id": "sb"},
		&berthv1.DependencyFailure{SandboxId: "sb", Dependency: dep, Fault: berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE, Operation: "read sandbox sb", Admitted: admitted})
}

// TestConditionWithoutDetail checks that a condition whose status lacks the
// detail (an older berthd) still gets its type, with an empty detail.
func TestConditionWithoutDetail(t *testing.T) {
	fake := newScriptedBerthd()
	fake.fail("sb", rpcstatus.Error(codes.Aborted, rpcstatus.ReasonRuntimeReplaced, "runtime replaced", nil))
	_, err := scriptedClient(t, fake).GetSandbox(t.Context(), "sb")
	var e *client.RuntimeReplacedError
	if !errors.As(err, &e) || e.Detail == nil || e.Detail.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_UNSPECIFIED {
		t.Fatalf("error = %v (%T), want a *RuntimeReplacedError with an empty detail", err, err)
	}
}

// TestUnreachableWithoutAdmitted checks that an UNREACHABLE status that
// does not say whether the call took effect (no detail, or admitted left
// unspecified) is not taken to mean that nothing ran: a retry could run a
// command twice, so it is neither retryable nor retried.
func TestUnreachableWithoutAdmitted(t *testing.T) {
	for name, st := range map[string]error{
		"no detail":            rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, "agent gone", nil),
		"admitted unspecified": unreachableStatus("sb", berthv1.Admitted_ADMITTED_UNSPECIFIED),
		"admitted unknown":     unreachableStatus("sb", berthv1.Admitted_ADMITTED_UNKNOWN),
		"admitted and started": unreachableStatus("sb", berthv1.Admitted_ADMITTED_STARTED),
	} {
		t.Run(name, func(t *testing.T) {
			fake := newScriptedBerthd()
			fake.fail("sb", st, st, st)
			c := scriptedClient(t, fake, client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
			_, err := c.Run(t.Context(), "sb", &berthv1.ProcessSpec{Argv: []string{"true"}})
			var e *client.UnreachableError
			if !errors.As(err, &e) {
				t.Fatalf("Run = %v (%T), want an *UnreachableError", err, err)
			}
			if e.NothingRan() || client.IsRetryable(err) {
				t.Errorf("NothingRan() = %v, IsRetryable = %v for %v; want both false", e.NothingRan(), client.IsRetryable(err), e.Detail)
			}
			if n := fake.callsTo("sb"); n != 1 {
				t.Errorf("berthd saw %d calls, want 1: the retry policy retried a call that may have run", n)
			}
		})
	}
}

// TestRetryPolicy checks what the retry policy retries, how long it waits,
// and that it stops at the context's end and at MaxAttempts.
func TestRetryPolicy(t *testing.T) {
	const delay = 30 * time.Millisecond
	type retry struct {
		attempt int
		wait    time.Duration
	}
	tests := []struct {
		name        string
		errs        []error
		policy      client.RetryPolicy
		timeout     time.Duration
		wantErr     string // reason of the error returned; "" for success
		wantCalls   int
		wantRetries int
		minWait     time.Duration
		minTook     time.Duration // the call's own time: the waits were waited
	}{
		{name: "busy twice then fine", errs: []error{busyStatus("sb", delay), busyStatus("sb", delay)},
			wantCalls: 3, wantRetries: 2, minWait: delay},
		{name: "unreachable then fine", errs: []error{unreachableStatus("sb", berthv1.Admitted_ADMITTED_NOT_STARTED)},
			policy: client.RetryPolicy{InitialBackoff: 40 * time.Millisecond}, wantCalls: 2, wantRetries: 1, minWait: 20 * time.Millisecond},
		{name: "fleet store unavailable then fine, after its RetryInfo delay", errs: []error{clusterStatus(300 * time.Millisecond)},
			wantCalls: 2, wantRetries: 1, minWait: 300 * time.Millisecond},
		{name: "unreachable that may have run is not retried", errs: []error{unreachableStatus("sb", berthv1.Admitted_ADMITTED_UNSPECIFIED)},
			wantErr: client.ReasonUnreachable, wantCalls: 1},
		{name: "busy without a delay still waits", errs: []error{busyStatusNoDelay("sb")},
			wantCalls: 2, wantRetries: 1, minWait: time.Second},
		// Only a deletion frees disk: a full disk budget is not retried,
		// whatever delay an older berthd sent with it.
		{name: "busy disk is not retried", errs: []error{busyDiskStatus("sb", berthv1.CapacityResource_CAPACITY_RESOURCE_DISK)},
			wantErr: client.ReasonFleetBusy, wantCalls: 1},
		{name: "busy principal disk is not retried", errs: []error{busyDiskStatus("sb", berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK)},
			wantErr: client.ReasonFleetBusy, wantCalls: 1},
		{name: "unreachable after a start is not retried", errs: []error{unreachableStatus("sb", berthv1.Admitted_ADMITTED_STARTED)},
			wantErr: client.ReasonUnreachable, wantCalls: 1},
		{name: "runtime replaced is not retried", errs: []error{replacedStatus("sb", "ex")},
			wantErr: client.ReasonRuntimeReplaced, wantCalls: 1},
		{name: "stale handle is not retried", errs: []error{staleStatus("sb", "ex")},
			wantErr: client.ReasonStaleHandle, wantCalls: 1},
		{name: "not found is not retried", errs: []error{rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, "gone", nil)},
			wantErr: client.ReasonSandboxNotFound, wantCalls: 1},
		{name: "attempts bounded", errs: []error{busyStatus("sb", delay), busyStatus("sb", delay), busyStatus("sb", delay)},
			policy: client.RetryPolicy{MaxAttempts: 2}, wantErr: client.ReasonFleetBusy, wantCalls: 2, wantRetries: 1},
		{name: "no wait past the deadline", errs: []error{busyStatus("sb", time.Hour)},
			timeout: 10 * time.Second, wantErr: client.ReasonFleetBusy, wantCalls: 1},
		// Issue 23: the default policy waits FLEET_BUSY's RetryInfo
		// delay for real (not zero) before each retry, and gives up
		// after its attempts with the last FLEET_BUSY.
		{name: "busy waits its RetryInfo delay", errs: []error{busyStatus("sb", 250*time.Millisecond), busyStatus("sb", 250*time.Millisecond)},
			wantCalls: 3, wantRetries: 2, minWait: 250 * time.Millisecond, minTook: 500 * time.Millisecond},
		{name: "busy gives up after the default 10 attempts", errs: slices.Repeat([]error{busyStatus("sb", 20*time.Millisecond)}, 12),
			wantErr: client.ReasonFleetBusy, wantCalls: 10, wantRetries: 9, minWait: 20 * time.Millisecond, minTook: 9 * 20 * time.Millisecond},
		{name: "run output budget exhausted after the start is not retried",
			errs:    []error{rpcstatus.Error(codes.DataLoss, rpcstatus.ReasonOutputLost, "exec started, but berthd could not hold its output", nil)},
			wantErr: client.ReasonOutputLost, wantCalls: 1},
		{name: "busy delay capped", errs: []error{busyStatus("sb", time.Hour)},
			policy: client.RetryPolicy{MaxBusyDelay: delay}, wantCalls: 2, wantRetries: 1, minWait: delay},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newScriptedBerthd()
			fake.fail("sb", tt.errs...)
			var retries []retry
			p := tt.policy
			p.OnRetry = func(attempt int, err error, wait time.Duration) {
				retries = append(retries, retry{attempt, wait})
				if !client.IsRetryable(err) {
					t.Errorf("retrying %v, which IsRetryable says is not", err)
				}
			}
			c := scriptedClient(t, fake, client.WithRetry(p))
			ctx := t.Context()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			began := time.Now()
			res, err := c.Run(ctx, "sb", &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}})
			took := time.Since(began)
			var ce *client.Error
			switch {
			case tt.wantErr == "" && (err != nil || string(res.GetStdout()) != "ok\n"):
				t.Errorf("Run = %v, %v; want success", res, err)
			case tt.wantErr != "" && (!errors.As(err, &ce) || ce.Reason != tt.wantErr):
				t.Errorf("Run error = %v, want reason %s", err, tt.wantErr)
			}
			if got := fake.callsTo("sb"); got != tt.wantCalls {
				t.Errorf("calls = %d, want %d", got, tt.wantCalls)
			}
			if len(retries) != tt.wantRetries {
				t.Errorf("retries = %v, want %d", retries, tt.wantRetries)
			}
			for i, r := range retries {
				if r.attempt != i+1 || r.wait < tt.minWait {
					t.Errorf("retry %d = attempt %d wait %v, want attempt %d and at least %v", i, r.attempt, r.wait, i+1, tt.minWait)
				}
			}
			if took < tt.minTook {
				t.Errorf("took %v, want at least %v of waits", took, tt.minTook)
			}
			if tt.wantRetries == 0 && took > 5*time.Second {
				t.Errorf("took %v without retrying", took)
			}
		})
	}
}

// TestRetryOpensExec checks that the opening of an Exec is retried, and
// that an Execution's end is not.
func TestRetryOpensExec(t *testing.T) {
	fake := newScriptedBerthd()
	fake.fail("sb", busyStatus("sb", 10*time.Millisecond))
	c := scriptedClient(t, fake, client.WithRetry(client.RetryPolicy{}))
	e, err := c.Exec(t.Context(), "sb", &berthv1.ProcessSpec{Argv: []string{"true"}})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if _, err := e.Wait(); err != nil || fake.callsTo("sb") != 2 {
		t.Errorf("Wait = %v after %d calls, want success after 2", err, fake.callsTo("sb"))
	}
	e, err = c.Exec(t.Context(), "crashy", &berthv1.ProcessSpec{Argv: []string{"true"}})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	_, err = e.Wait()
	var replaced *client.RuntimeReplacedError
	if !errors.As(err, &replaced) || fake.callsTo("crashy") != 1 {
		t.Errorf("Wait = %v after %d calls, want RuntimeReplaced after 1", err, fake.callsTo("crashy"))
	}
}
