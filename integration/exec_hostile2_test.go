package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

// TestListExecsStaysUnderMessageLimit retains 900 finished execs, each
// with 16 arguments of 300 bytes (ExecInfo keeps 16 of 256 bytes: about
// 4 KiB each). Listing them all is 3.7 MiB, past the 3 MiB a listing is
// kept under; with the agent's bound of 1000 retained execs it could reach
// 4.1 MiB, past the public client's default 4 MiB message limit: ListExecs
// failed RESOURCE_EXHAUSTED "received message larger than max" for as long
// as they were retained.
// It must answer with the newest execs and count the rest in omitted.
func TestListExecsStaysUnderMessageLimit(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := []string{"true"}
	for range 16 {
		argv = append(argv, strings.Repeat("a", 300))
	}
	const n = 900 // under the agent's 1000 retained ended execs
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: argv}}); err != nil {
				t.Errorf("run %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	ctx2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	_, err := env.sandboxes.Run(ctx2, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "last"}}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := env.sandboxes.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("ListExecs with %d retained execs: %v", n+1, err)
	}
	got := len(l.GetExecs())
	if got+int(l.GetOmitted()) != n+1 || l.GetOmitted() == 0 {
		t.Fatalf("ListExecs listed %d and omitted %d; want %d in all, some omitted", got, l.GetOmitted(), n+1)
	}
	if last := l.GetExecs()[got-1].GetArgv(); len(last) != 2 || last[1] != "last" {
		t.Fatalf("the last listed exec runs %q; want the newest, echo last", last)
	}
	if size := proto.Size(l); size > 3<<20 {
		t.Fatalf("ListExecs response is %d bytes; want at most 3 MiB", size)
	}
}
