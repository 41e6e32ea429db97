package execsvc

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestStartExec: StartExec is Exec's start through the same handler — the
// agent gets the same start, the caller the same events, and then the
// agent's stream is half-closed (no input comes that way); its request's
// fields are named at its top in errors (process, not start.process).
func TestStartExec(t *testing.T) {
	h := newHarness(t, 0)
	opened := make(chan *agentv1.ExecRequest, 1)
	closed := make(chan error, 1)
	h.agent.exec = func(stream agentv1.AgentService_ExecServer) error {
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		opened <- first
		_, err = stream.Recv()
		closed <- err
		for _, ev := range []*agentv1.ExecResponse{started(first.GetStart().GetExecId(), 7), output(1, berthv1.Stream_STREAM_STDOUT, "hi\n"), exited(exitCode(0))} {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	stream, err := h.client.StartExec(callContext(t), &berthv1.StartExecRequest{SandboxId: testSandbox, ExecId: "ex-split", Process: echo, HangupOnDisconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	var events []*berthv1.ExecResponse
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("StartExec: %v", err)
		}
		events = append(events, ev)
	}
	if start := (<-opened).GetStart(); start.GetExecId() != "ex-split" || !proto.Equal(start.GetProcess(), echo) {
		t.Errorf("agent started %v; want exec ex-split running %v", start, echo)
	}
	if err := <-closed; !errors.Is(err, io.EOF) {
		t.Errorf("agent stream after the start: %v; want io.EOF (half-closed)", err)
	}
	if len(events) != 3 || events[0].GetStarted().GetPid() != 7 || string(events[1].GetOutput().GetData()) != "hi\n" || events[2].GetExited() == nil {
		t.Errorf("events %v; want started pid 7, output hi, exited", events)
	}

	bad, err := h.client.StartExec(callContext(t), &berthv1.StartExecRequest{SandboxId: testSandbox})
	if err == nil {
		_, err = bad.Recv()
	}
	checkStatus(t, err, want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "process"})
}

// TestWriteExecStdin: the offset, data and close reach the agent as sent,
// and its count comes back; its STDIN_OFFSET_GAP passes through with the
// expected offset; ResizeExec checks the size before reaching anything.
func TestWriteExecStdin(t *testing.T) {
	h := newHarness(t, 0)
	got := make(chan *agentv1.WriteStdinRequest, 2)
	h.agent.writeStdin = func(req *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
		got <- req
		if req.GetOffset() > 10 {
			return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonStdinOffsetGap, "gap", map[string]string{"expected_offset": "10"})
		}
		return &agentv1.WriteStdinResponse{NextOffset: 10}, nil
	}
	resp, err := h.client.WriteExecStdin(callContext(t), &berthv1.WriteExecStdinRequest{SandboxId: testSandbox, ExecId: "ex-1", Offset: 7, Data: []byte("abc"), CloseStdin: true})
	if err != nil || resp.GetNextOffset() != 10 {
		t.Fatalf("WriteExecStdin = %v, %v; want next offset 10", resp, err)
	}
	if req := <-got; req.GetExecId() != "ex-1" || req.GetOffset() != 7 || string(req.GetData()) != "abc" || !req.GetCloseStdin() {
		t.Errorf("agent got %v; want exec ex-1 offset 7 data abc close", req)
	}
	_, err = h.client.WriteExecStdin(callContext(t), &berthv1.WriteExecStdinRequest{SandboxId: testSandbox, ExecId: "ex-1", Offset: 12, Data: []byte("x")})
	checkStatus(t, err, want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonStdinOffsetGap, meta: map[string]string{"expected_offset": "10"}})

	_, err = h.client.ResizeExec(callContext(t), &berthv1.ResizeExecRequest{SandboxId: testSandbox, ExecId: "ex-1", Rows: 24})
	checkStatus(t, err, want{code: codes.InvalidArgument, reason: rpcstatus.ReasonInvalidArgument, field: "cols"})
	if r := h.reach.Reached(); len(r) != 2 {
		t.Errorf("reached %v; want the two stdin calls only", r)
	}
}

// TestSplitRequestFields: StartExecRequest and AttachExecRequest carry
// ExecStart's and ExecAttach's fields, by name, number and kind, so that a
// field added to one and not the other fails here, not in a caller's
// exec.
func TestSplitRequestFields(t *testing.T) {
	for _, tc := range []struct {
		split, stream protoreflect.MessageDescriptor
	}{
		{(&berthv1.StartExecRequest{}).ProtoReflect().Descriptor(), (&berthv1.ExecStart{}).ProtoReflect().Descriptor()},
		{(&berthv1.AttachExecRequest{}).ProtoReflect().Descriptor(), (&berthv1.ExecAttach{}).ProtoReflect().Descriptor()},
	} {
		fields := func(md protoreflect.MessageDescriptor) []string {
			var out []string
			for i := range md.Fields().Len() {
				f := md.Fields().Get(i)
				out = append(out, fmt.Sprintf("%d %s %v", f.Number(), f.Name(), f.Kind()))
			}
			return out
		}
		if got, want := fields(tc.split), fields(tc.stream); !slices.Equal(got, want) {
			t.Errorf("%s fields %q; want %s's %q", tc.split.FullName(), got, tc.stream.FullName(), want)
		}
	}
}
