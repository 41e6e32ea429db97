package execsvc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/validate"
)

func TestPublicExecFields(t *testing.T) {
	tests := []struct {
		err         error
		start       bool
		wantField   string
		wantMessage string
	}{
		{rpcstatus.InvalidArgument("process.env[K]", "value contains a NUL byte"), true, "start.process.env[K]", "start.process.env[K]: value contains a NUL byte"},
		{rpcstatus.InvalidArgument("since_seq", "beyond the last event"), false, "attach.since_seq", "attach.since_seq: beyond the last event"},
		{rpcstatus.InvalidArgument("signal.signal", "is empty"), true, "signal.signal", "signal.signal: is empty"},
		{rpcstatus.InvalidArgument("stdin", "no stdin"), false, "stdin", "stdin: no stdin"},
	}
	for _, tt := range tests {
		st := status.Convert(publicExecFields(tt.err, tt.start))
		var field, metaField string
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.BadRequest:
				field = d.GetFieldViolations()[0].GetField()
			case *errdetails.ErrorInfo:
				metaField = d.GetMetadata()["field"]
				if d.GetReason() != rpcstatus.ReasonInvalidArgument {
					t.Errorf("reason = %q", d.GetReason())
				}
			}
		}
		if st.Code() != codes.InvalidArgument || field != tt.wantField || metaField != tt.wantField || st.Message() != tt.wantMessage {
			t.Errorf("publicExecFields(%v, %v) = %v %q, field %q, metadata %q; want field %q, message %q", tt.err, tt.start, st.Code(), st.Message(), field, metaField, tt.wantField, tt.wantMessage)
		}
	}
	other := rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, "exec x not found", nil)
	if got := publicExecFields(other, false); got != other {
		t.Errorf("publicExecFields changed %v into %v", other, got)
	}
}

// TestWithCallerDeadline: a caller's deadline sooner than the command's
// timeout becomes its timeout (at least a second); later ones, and no
// deadline, leave the spec as it is.
func TestWithCallerDeadline(t *testing.T) {
	at := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	hour := &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(time.Hour)}
	none := &berthv1.ProcessSpec{Argv: []string{"true"}}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		spec *berthv1.ProcessSpec
		want time.Duration // 0: unchanged
		near bool
	}{
		{"no deadline", context.Background(), hour, 0, false},
		{"deadline after the timeout", at(2 * time.Hour), hour, 0, false},
		{"deadline before the timeout", at(10 * time.Minute), hour, 10 * time.Minute, true},
		{"deadline before the default", at(5 * time.Minute), none, 5 * time.Minute, true},
		{"deadline after the default", at(time.Hour), none, 0, false},
		{"deadline at once", at(time.Millisecond), hour, time.Second, false},
	} {
		got := validate.WithCallerDeadline(tc.ctx, tc.spec)
		switch {
		case tc.want == 0 && got != tc.spec:
			t.Errorf("%s: spec changed to timeout %v", tc.name, got.GetTimeout().AsDuration())
		case tc.want != 0 && tc.near && (got.GetTimeout().AsDuration() > tc.want || got.GetTimeout().AsDuration() < tc.want-5*time.Second):
			t.Errorf("%s: timeout %v, want about %v", tc.name, got.GetTimeout().AsDuration(), tc.want)
		case tc.want != 0 && !tc.near && got.GetTimeout().AsDuration() != tc.want:
			t.Errorf("%s: timeout %v, want %v", tc.name, got.GetTimeout().AsDuration(), tc.want)
		}
	}
	if hour.GetTimeout().AsDuration() != time.Hour {
		t.Error("the caller's spec was changed in place")
	}
}
