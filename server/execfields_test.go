package server

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
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
