package agent

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestOutputEncoding checks that an output event encoded in place is what
// proto.Marshal makes of the same ExecResponse, byte for byte, for
// sequence numbers and sizes whose varints take one to several bytes
// (events are never empty: a pump appends only bytes it read).
func TestOutputEncoding(t *testing.T) {
	for _, tt := range []struct {
		seq  uint64
		size int
	}{{1, 1}, {127, 127}, {128, 128}, {1 << 20, 300 << 10}, {1<<63 + 5, 70000}} {
		data := bytes.Repeat([]byte{0xab}, tt.size)
		ev := newOutputEvent(berthv1.Stream_STREAM_STDERR, data)
		stampOutput(ev, tt.seq)
		want, err := proto.Marshal(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Output{Output: &berthv1.ExecOutput{
			Seq: tt.seq, Stream: berthv1.Stream_STREAM_STDERR, Data: data}}})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ev.wire, want) {
			t.Errorf("seq %d, %d bytes: encoded %d bytes, proto.Marshal %d; they differ", tt.seq, tt.size, len(ev.wire), len(want))
		}
	}
}
