// Package resume carries a caller's choice about a paused sandbox: by
// default any call that needs a paused sandbox's agent resumes the sandbox
// first; a call whose gRPC metadata holds Header with the value "true"
// asks not to, and gets FAILED_PRECONDITION SANDBOX_PAUSED instead. The
// value is read as Go's strconv.ParseBool reads it ("true", "1", "t",
// "false", "0", "f", any case); any other value, or the header given more
// than once, fails the call INVALID_ARGUMENT (Check) rather than resume. The
// same metadata works for every call (Exec, Run, ListExecs, SignalExec,
// PortForward, the FileService), from any language (grpcurl: -H
// 'berth-no-resume: true').
package resume

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/metadata"
)

// Header is the metadata key of the choice.
const Header = "berth-no-resume"

// refusedKey marks a context whose call asked not to resume (Keep).
type refusedKey struct{}

// Check reports whether the incoming metadata of ctx holds a value of
// Header that means something: none, or exactly one that
// strconv.ParseBool accepts. The error says what is wrong with the value
// (its text does not repeat the header's name: callers name it).
func Check(ctx context.Context) error {
	_, err := asked(ctx)
	return err
}

// asked reads Header from the incoming metadata of ctx.
func asked(ctx context.Context) (bool, error) {
	vs := metadata.ValueFromIncomingContext(ctx, Header)
	switch len(vs) {
	case 0:
		return false, nil
	case 1:
	default:
		return false, fmt.Errorf("given %d times; give it once", len(vs))
	}
	v, err := strconv.ParseBool(vs[0])
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean; want true or false", vs[0])
	}
	return v, nil
}

// Keep returns ctx remembering whether its incoming metadata asked that a
// paused sandbox not be resumed, for the handlers after berthd drops the
// caller's metadata (server/auth seals it).
func Keep(ctx context.Context) context.Context {
	if v, err := asked(ctx); err == nil && v {
		return context.WithValue(ctx, refusedKey{}, true)
	}
	return ctx
}

// Refused reports whether the call of ctx asked that a paused sandbox not
// be resumed: its incoming metadata says so, or said so when Keep saw it.
func Refused(ctx context.Context) bool {
	if v, _ := ctx.Value(refusedKey{}).(bool); v {
		return true
	}
	v, err := asked(ctx)
	return err == nil && v
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
