package wire

import (
	"google.golang.org/protobuf/reflect/protoreflect"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Field numbers of an exec's output event, ExecResponse{output:
// ExecOutput{seq, stream, data}}: the same in berth.v1 and berth.agent.v1
// (server's TestExecEventFields), so that berthd relays the agent's output
// events as they are and the client reads their bytes from gRPC's buffers.
var (
	execOutputFields = (&berthv1.ExecOutput{}).ProtoReflect().Descriptor().Fields()
	// ExecResponseOutput is ExecResponse.output's number.
	ExecResponseOutput = (&berthv1.ExecResponse{}).ProtoReflect().Descriptor().Fields().ByName("output").Number()
	// ExecOutputSeq, ExecOutputStream and ExecOutputData are ExecOutput's
	// fields, in the order proto.Marshal writes them.
	ExecOutputSeq    = execOutputFields.ByName("seq").Number()
	ExecOutputStream = execOutputFields.ByName("stream").Number()
	ExecOutputData   = execOutputFields.ByName("data").Number()

	execOutputVarints = []protoreflect.FieldNumber{ExecOutputSeq, ExecOutputStream}
)

// ExecOutput reports whether the frame is an ExecResponse of an output
// event and nothing else, in the shape proto.Marshal gives it (see
// Embedded), and returns its sequence number and stream; Data returns its
// bytes. Any other message, events of other kinds included, is not:
// Decode it.
func (f *Frame) ExecOutput() (seq uint64, stream berthv1.Stream, ok bool) {
	var vals [2]uint64
	if !f.Embedded(ExecResponseOutput, execOutputVarints, ExecOutputData, vals[:]) {
		return 0, 0, false
	}
	// A varint beyond int32 is cut to it, as protobuf decodes an enum.
	return vals[0], berthv1.Stream(int32(vals[1])), true
}
