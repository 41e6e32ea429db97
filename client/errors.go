package client

import (
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of berth's errors.
const ErrorDomain = "berth.dev"

// Reason tokens berthd puts in Error.Reason. They are stable; switch on them
// instead of on messages.
const (
	ReasonInvalidArgument   = "INVALID_ARGUMENT"      // a request field is invalid; see FieldViolations
	ReasonSandboxNotFound   = "SANDBOX_NOT_FOUND"     // no such sandbox (or not the caller's)
	ReasonSandboxExists     = "SANDBOX_EXISTS"        // the sandbox id is taken by another spec
	ReasonImageNotFound     = "IMAGE_NOT_FOUND"       // the image is not in berthd's store
	ReasonImageArchive      = "IMAGE_ARCHIVE_INVALID" // an imported archive cannot be read or names no image
	ReasonExecNotFound      = "EXEC_NOT_FOUND"        // no such exec in the sandbox
	ReasonExecExists        = "EXEC_EXISTS"           // the exec id is taken
	ReasonCwdInvalid        = "CWD_INVALID"           // the working directory is missing or not a directory
	ReasonSandboxNotRunning = "SANDBOX_NOT_RUNNING"   // the sandbox's task is not running
	ReasonUnreachable       = "SANDBOX_UNREACHABLE"   // the sandbox's agent did not answer; nothing ran
	ReasonInternal          = "INTERNAL"              // a berthd bug or an unclassified failure
	ReasonRegistry          = "REGISTRY_UNREACHABLE"  // PullImage could not reach the image's registry
)

// Error is an error returned by berthd (or by gRPC on the way to it, such as
// codes.Unavailable when berthd cannot be reached, or codes.Canceled and
// codes.DeadlineExceeded when the caller's context ended). Every RPC error
// the Client returns is an *Error:
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
// error the Client returns: a status error becomes an *Error, anything else
// (nil, local errors) is returned unchanged. Typed errors for specific
// conditions will be made here too.
func convertError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*Error); ok {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
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
		}
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("berthd returned %s without a message", e.Code)
	}
	return e
}
