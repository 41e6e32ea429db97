package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestExecEventFields keeps the agent's exec events wire-compatible with the
// public ones: berthd relays output events as they are on the wire.
func TestExecEventFields(t *testing.T) {
	public := (&berthv1.ExecResponse{}).ProtoReflect().Descriptor().Fields()
	agent := (&agentv1.ExecResponse{}).ProtoReflect().Descriptor().Fields()
	for i := range public.Len() {
		p := public.Get(i)
		a := agent.ByName(p.Name())
		if a == nil || a.Number() != p.Number() || a.Message().FullName() != p.Message().FullName() {
			t.Errorf("ExecResponse.%s: public field %d of %s, agent's %v", p.Name(), p.Number(), p.Message().FullName(), a)
		}
	}
}

// TestOutputFrame checks which agent messages berthd relays undecoded: an
// output event alone, with its sequence number read from the wire; any
// other event, or an output with more fields than one, is decoded.
func TestOutputFrame(t *testing.T) {
	frame := func(m proto.Message) *wire.Frame {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var fr wire.Frame
		if err := (wire.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &fr); err != nil {
			t.Fatal(err)
		}
		return &fr
	}
	out := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: 300, Stream: berthv1.Stream_STREAM_STDERR, Data: make([]byte, 200<<10)}}}
	if seq, ok := frame(out).Embedded(execOutputField, outputSeqField); !ok || seq != 300 {
		t.Errorf("output frame: seq %d, %v; want 300, true", seq, ok)
	}
	exited := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{}}}}
	if _, ok := frame(exited).Embedded(execOutputField, outputSeqField); ok {
		t.Errorf("exited frame taken for output")
	}
	// A hostile agent's output with an exited appended: decoded, not
	// relayed, so the caller never sees two events in one message.
	b, _ := proto.Marshal(out)
	e, _ := proto.Marshal(exited)
	var fr wire.Frame
	if err := (wire.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(append(b, e...))}, &fr); err != nil {
		t.Fatal(err)
	}
	if _, ok := fr.Embedded(execOutputField, outputSeqField); ok {
		t.Errorf("output frame with a second field taken for a plain output")
	}
}
