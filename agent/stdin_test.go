package agent_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestWriteStdinOffsets feeds cat through WriteStdin with offsets: a chunk
// sent again, whole or overlapping, is written once; a gap is
// FAILED_PRECONDITION STDIN_OFFSET_GAP naming the expected offset; the
// stream's ExecStdin counts in the same offsets; close_stdin ends cat.
func TestWriteStdinOffsets(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := execID(t)
	spec := argv("cat")
	spec.Stdin = true
	stream := a.startExec(t, ctx, id, spec)
	// The exec is known once its stream has sent ExecStarted.
	r := &execRun{}
	if ev, err := stream.Recv(); err != nil || r.recvEvent(t, ev) || ev.GetStarted() == nil {
		t.Fatalf("first event %v, %v; want started", ev, err)
	}
	write := func(offset uint64, data string, close bool) (uint64, error) {
		t.Helper()
		resp, err := a.client.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: id, Offset: offset, Data: []byte(data), CloseStdin: close})
		return resp.GetNextOffset(), err
	}
	steps := []struct {
		offset uint64
		data   string
		next   uint64
	}{
		{0, "hello ", 6},
		{0, "hello ", 6},    // a retry: dropped
		{3, "lo world", 11}, // overlapping: "world" written
		{6, "world", 11},    // inside what was taken: dropped
		{11, "", 11},        // nothing
		{11, "\x00\xff!", 14},
	}
	for _, s := range steps {
		next, err := write(s.offset, s.data, false)
		if err != nil || next != s.next {
			t.Fatalf("WriteStdin(offset %d, %q) = %d, %v; want %d", s.offset, s.data, next, err, s.next)
		}
	}
	_, err := write(20, "gap", false)
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonStdinOffsetGap || rpcstatus.Metadata(err)["expected_offset"] != "14" {
		t.Fatalf("WriteStdin at offset 20 of 14 = %v (reason %q, metadata %v), want FAILED_PRECONDITION STDIN_OFFSET_GAP expected_offset 14",
			err, rpcstatus.Reason(err), rpcstatus.Metadata(err))
	}
	// The stream's stdin takes offsets 14-16.
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: []byte("abc")}}}); err != nil {
		t.Fatal(err)
	}
	var next uint64
	for deadline := time.Now().Add(10 * time.Second); next != 17 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if next, err = write(17, "", false); status.Code(err) == codes.FailedPrecondition {
			next, err = 0, nil // the stream's bytes are not taken yet
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if next != 17 {
		t.Fatalf("after the stream's 3 bytes WriteStdin at 17 never succeeded")
	}
	if next, err := write(14, "abcdef", true); err != nil || next != 20 {
		t.Fatalf("WriteStdin(14, abcdef, close) = %d, %v; want 20", next, err)
	}
	collect(t, stream, r)
	if want := "hello world\x00\xff!abcdef"; !bytes.Equal(r.stdout, []byte(want)) || r.result.GetExitCode() != 0 {
		t.Errorf("cat wrote %q exit %d, want %q exit 0", r.stdout, r.result.GetExitCode(), want)
	}
	if _, err := a.client.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: "no-such-exec"}); rpcstatus.Reason(err) != rpcstatus.ReasonExecNotFound {
		t.Errorf("WriteStdin of an unknown exec = %v, want EXEC_NOT_FOUND", err)
	}

	noStdin := execID(t) + "-n"
	a.run(t, noStdin, argv("true"))
	_, err = a.client.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: noStdin, Data: []byte("x")})
	wantInvalid(t, err, "data")
	_, err = a.client.ResizeExec(ctx, &agentv1.ResizeExecRequest{ExecId: noStdin, Size: &berthv1.ExecResize{Rows: 10, Cols: 10}})
	wantInvalid(t, err, "exec_id")
}
