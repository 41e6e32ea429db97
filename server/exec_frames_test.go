package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
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
// output event {seq, stream, data} as proto.Marshal writes it, with its
// sequence number read from the wire. Anything else is decoded, and so
// never reaches a caller as it came: another event, and every way a
// hostile agent could shape an output event — a second event appended, a
// field repeated (the last seq would win in the caller's decode), an
// unknown field, fields out of order, bytes that do not parse.
func TestOutputFrame(t *testing.T) {
	frame := func(b []byte) *wire.Frame {
		// Split in two buffers, as gRPC may hand a message over.
		half := len(b) / 2
		var fr wire.Frame
		if err := (wire.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:half]), mem.SliceBuffer(b[half:])}, &fr); err != nil {
			t.Fatal(err)
		}
		return &fr
	}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// wrap makes an ExecResponse.output field of inner, an encoded
	// ExecOutput.
	wrap := func(inner []byte) []byte {
		b := protowire.AppendTag(nil, execOutputField, protowire.BytesType)
		return protowire.AppendBytes(b, inner)
	}
	data := make([]byte, 200<<10)
	for i := range data {
		data[i] = byte(i)
	}
	out := marshal(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: 300, Stream: berthv1.Stream_STREAM_STDERR, Data: data}}})
	for _, seq := range []uint64{1, 300, 1<<63 + 5} {
		b := marshal(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: berthv1.Stream_STREAM_STDOUT, Data: []byte("x")}}})
		var vals [2]uint64
		if n, ok := frame(b).Embedded(execOutputField, outputFields, outputDataField, vals[:]); !ok || vals != [2]uint64{seq, uint64(berthv1.Stream_STREAM_STDOUT)} || n != 1 {
			t.Errorf("output of seq %d: Embedded = %d, %v, values %v; want 1, true, [%d %d]", seq, n, ok, vals, seq, berthv1.Stream_STREAM_STDOUT)
		}
	}
	var vals [2]uint64
	if n, ok := frame(out).Embedded(execOutputField, outputFields, outputDataField, vals[:]); !ok || vals != [2]uint64{300, uint64(berthv1.Stream_STREAM_STDERR)} || n != len(data) {
		t.Errorf("200 KiB output: Embedded = %d, %v, values %v; want %d, true, [300 %d]", n, ok, vals, len(data), berthv1.Stream_STREAM_STDERR)
	}

	seq := func(b []byte, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, outputFields[0], protowire.VarintType), v)
	}
	stream := func(b []byte) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, outputFields[1], protowire.VarintType), uint64(berthv1.Stream_STREAM_STDOUT))
	}
	bytesOf := func(b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, outputDataField, protowire.BytesType), []byte("hello"))
	}
	exited := marshal(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{}}}})
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"exited", exited},
		{"output with an exited appended", append(append([]byte(nil), out...), exited...)},
		{"seq repeated after data", wrap(seq(bytesOf(stream(seq(nil, 1))), 999))},
		{"seq repeated before data", wrap(bytesOf(seq(stream(seq(nil, 1)), 999)))},
		{"unknown field", wrap(protowire.AppendVarint(protowire.AppendTag(bytesOf(stream(seq(nil, 1))), 9, protowire.VarintType), 1))},
		{"data twice", wrap(bytesOf(bytesOf(stream(seq(nil, 1)))))},
		{"fields out of order", wrap(bytesOf(seq(stream(nil), 1)))},
		{"no stream", wrap(bytesOf(seq(nil, 1)))},
		{"data longer than the message", wrap(append(stream(seq(nil, 1)), byte(outputDataField<<3|2), 100, 'x'))},
		{"data shorter than the message", wrap(append(bytesOf(stream(seq(nil, 1))), 0))},
		{"truncated varint", wrap(append(seq(nil, 1), byte(outputFields[1]<<3), 0x80))},
		{"outer length wrong", append(wrap(bytesOf(stream(seq(nil, 1)))), 0)},
		{"empty", nil},
	} {
		if _, ok := frame(tt.b).Embedded(execOutputField, outputFields, outputDataField, make([]uint64, 2)); ok {
			t.Errorf("%s: relayed undecoded", tt.name)
		}
	}
}
