// Package resume carries a caller's choice about a paused sandbox: by
// default any call that needs a paused sandbox's agent resumes the sandbox
// first; a call whose gRPC metadata holds Header with the value "true"
// asks not to, and gets FAILED_PRECONDITION SANDBOX_PAUSED instead. The
// same metadata works for every call (Exec, Run, ListExecs, SignalExec,
// PortForward, the FileService), from any language (grpcurl: -H
// 'berth-no-resume: true').
package resume

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// Header is the metadata key of the choice.
const Header = "berth-no-resume"

// refusedKey marks a context whose call asked not to resume (Keep).
type refusedKey struct{}

// Keep returns ctx remembering whether its incoming metadata asked that a
// paused sandbox not be resumed, for the handlers after berthd drops the
// caller's metadata (server/auth seals it).
func Keep(ctx context.Context) context.Context {
	for _, v := range metadata.ValueFromIncomingContext(ctx, Header) {
		if v == "true" {
			return context.WithValue(ctx, refusedKey{}, true)
		}
	}
	return ctx
}

// Refused reports whether the call of ctx asked that a paused sandbox not
// be resumed: its incoming metadata says so, or said so when Keep saw it.
func Refused(ctx context.Context) bool {
	if v, _ := ctx.Value(refusedKey{}).(bool); v {
		return true
	}
	for _, v := range metadata.ValueFromIncomingContext(ctx, Header) {
		if v == "true" {
			return true
		}
	}
	return false
}

// Forbid returns ctx whose outgoing calls ask that a paused sandbox not be
// resumed.
func Forbid(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, Header, "true")
}

// Forward returns the pairs of ctx's incoming metadata that a call
// forwarded to another node must carry on (metadata.Pairs form): Header
// when it is set.
func Forward(ctx context.Context) []string {
	if Refused(ctx) {
		return []string{Header, "true"}
	}
	return nil
}
