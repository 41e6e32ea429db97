package wire

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestFrameExecOutput checks which messages pass as an output event, read
// without decoding (berthd relays them as they are; the client takes their
// bytes from gRPC's buffers): an ExecResponse holding an output event
// {seq, stream, data} as proto.Marshal writes it, cut into buffers of
// several sizes, with its seq, stream and bytes. Anything else must be
// decoded, and so never reaches a caller as it came: another event, and
// every way a hostile agent could shape an output event — a second event
// appended, a field repeated (the last seq would win in the caller's
// decode), an unknown field, fields out of order, bytes that do not parse.
func TestFrameExecOutput(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	frame := func(b []byte, piece int) *Frame {
		var fr Frame
		if err := (Codec{}).Unmarshal(split(b, piece), &fr); err != nil {
			t.Fatal(err)
		}
		return &fr
	}
	output := func(seq uint64, stream berthv1.Stream, data []byte) []byte {
		return marshal(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: stream, Data: data}}})
	}
	for _, tt := range []struct {
		seq    uint64
		stream berthv1.Stream
		size   int
	}{
		{1, berthv1.Stream_STREAM_STDOUT, 1},
		{300, berthv1.Stream_STREAM_STDERR, 200 << 10},
		{1<<63 + 5, berthv1.Stream_STREAM_STDOUT, 70000},
	} {
		data := random(tt.size)
		for _, piece := range []int{1, 7, 16 << 10, 1 << 20} {
			fr := frame(output(tt.seq, tt.stream, data), piece)
			seq, stream, ok := fr.ExecOutput()
			var buf []byte
			if !ok || seq != tt.seq || stream != tt.stream || !bytes.Equal(fr.Data(&buf), data) {
				t.Errorf("output seq %d %v of %d bytes in pieces of %d: ExecOutput = %d, %v, %v, bytes equal %v; want %d, %v, true, true",
					tt.seq, tt.stream, tt.size, piece, seq, stream, ok, bytes.Equal(fr.Data(&buf), data), tt.seq, tt.stream)
			}
			if got := fr.DataLen(); got != tt.size {
				t.Errorf("output of %d bytes in pieces of %d: DataLen = %d, want %d", tt.size, piece, got, tt.size)
			}
		}
	}

	// wrap makes an ExecResponse.output field of inner, an encoded
	// ExecOutput.
	wrap := func(inner []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, ExecResponseOutput, protowire.BytesType), inner)
	}
	seq := func(b []byte, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, ExecOutputSeq, protowire.VarintType), v)
	}
	stream := func(b []byte) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, ExecOutputStream, protowire.VarintType), uint64(berthv1.Stream_STREAM_STDOUT))
	}
	data := func(b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, ExecOutputData, protowire.BytesType), []byte("hello"))
	}
	out := output(300, berthv1.Stream_STREAM_STDERR, random(200<<10))
	exited := marshal(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{}}}})
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"exited", exited},
		{"output with an exited appended", append(append([]byte(nil), out...), exited...)},
		{"seq repeated after data", wrap(seq(data(stream(seq(nil, 1))), 999))},
		{"seq repeated before data", wrap(data(seq(stream(seq(nil, 1)), 999)))},
		{"unknown field", wrap(protowire.AppendVarint(protowire.AppendTag(data(stream(seq(nil, 1))), 9, protowire.VarintType), 1))},
		{"data twice", wrap(data(data(stream(seq(nil, 1)))))},
		{"fields out of order", wrap(data(seq(stream(nil), 1)))},
		{"no stream", wrap(data(seq(nil, 1)))},
		{"data longer than the message", wrap(append(stream(seq(nil, 1)), byte(ExecOutputData<<3|2), 100, 'x'))},
		{"data shorter than the message", wrap(append(data(stream(seq(nil, 1))), 0))},
		{"truncated varint", wrap(append(seq(nil, 1), byte(ExecOutputStream<<3), 0x80))},
		{"outer length wrong", append(wrap(data(stream(seq(nil, 1)))), 0)},
		{"empty", nil},
	} {
		for _, piece := range []int{1, 16 << 10} {
			if _, _, ok := frame(tt.b, piece).ExecOutput(); ok {
				t.Errorf("%s, in pieces of %d: taken for a plain output event", tt.name, piece)
			}
		}
	}
}
