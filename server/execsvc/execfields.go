package execsvc

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// execFieldPrefix is where the fields the agent validates sit in a public
// ExecRequest: the agent checks ExecStart.process as "process" and
// ExecAttach.since_seq as "since_seq", the caller sent start.process and
// attach.since_seq.
func execFieldPrefix(start bool) (prefix string, fields []string) {
	if start {
		return "start.", []string{"process", "exec_id"}
	}
	return "attach.", []string{"since_seq", "exec_id"}
}

// publicExecFields returns err with the fields its INVALID_ARGUMENT
// details blame renamed to their path in the public Exec request (see
// execFieldPrefix), in the BadRequest, the ErrorInfo metadata and the
// message's "field: " prefix. Any other error is returned unchanged.
func publicExecFields(err error, start bool) error {
	if rpcstatus.Reason(err) != rpcstatus.ReasonInvalidArgument {
		return err
	}
	prefix, fields := execFieldPrefix(start)
	rename := func(f string) string {
		for _, name := range fields {
			if f == name || strings.HasPrefix(f, name+".") || strings.HasPrefix(f, name+"[") {
				return prefix + f
			}
		}
		return f
	}
	st := status.Convert(err)
	msg := st.Message()
	var details []protoadapt.MessageV1
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			meta := make(map[string]string, len(d.GetMetadata()))
			for k, v := range d.GetMetadata() {
				meta[k] = v
			}
			if f, ok := meta["field"]; ok {
				meta["field"] = rename(f)
				if rest, ok := strings.CutPrefix(msg, f+": "); ok {
					msg = rename(f) + ": " + rest
				}
			}
			details = append(details, &errdetails.ErrorInfo{Reason: d.GetReason(), Domain: d.GetDomain(), Metadata: meta})
		case *errdetails.BadRequest:
			br := &errdetails.BadRequest{}
			for _, v := range d.GetFieldViolations() {
				br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: rename(v.GetField()), Description: v.GetDescription()})
			}
			details = append(details, br)
		case protoadapt.MessageV1:
			details = append(details, d)
		default:
			return err // a detail this berthd cannot carry over: keep the status whole
		}
	}
	out, derr := status.New(st.Code(), msg).WithDetails(details...)
	if derr != nil {
		return err
	}
	return out.Err()
}
