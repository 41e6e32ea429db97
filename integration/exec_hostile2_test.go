package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestHugeInvalidArgvIsInvalidArgument sends an argv element of 2 MiB of
// control bytes with a NUL at its end. The agent refuses it, and the
// refusal must reach the caller as INVALID_ARGUMENT naming the field: an
// error that quoted the whole element (4 bytes per control byte) overflowed
// the HTTP/2 header limits of berthd's shared connection to the agent,
// which broke (COMPRESSION_ERROR) and took the caller's request, and any
// other stream on it, down as UNAVAILABLE.
func TestHugeInvalidArgvIsInvalidArgument(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := strings.Repeat("\x01", 2<<20) + "\x00"
	_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true", bad}}})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("Run with a NUL in a 2 MiB argv element: %v; want INVALID_ARGUMENT", err)
	}
	var field string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			field = br.GetFieldViolations()[0].GetField()
		}
	}
	if field != "process.argv[1]" {
		t.Fatalf("BadRequest field %q; want process.argv[1] (status %.200s)", field, st.Message())
	}
	if n := len(st.Message()); n > 4<<10 {
		t.Fatalf("error message is %d bytes; want it cut to a few KiB", n)
	}
	// The agent connection still serves.
	if out := run(t, id, "echo", "ok").GetStdout(); string(out) != "ok\n" {
		t.Fatalf("after the refused start, echo ok printed %q", out)
	}
}
