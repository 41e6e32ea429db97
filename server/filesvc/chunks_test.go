package filesvc

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestChunkFields: berthd relays a chunk message between the caller and
// the agent as it is on the wire, so each data message's chunk field must
// have the same number in berth.v1 and berth.agent.v1, and the chunk must
// be the only thing such a message holds.
func TestChunkFields(t *testing.T) {
	for _, pair := range [][2]proto.Message{
		{&berthv1.ReadFileResponse{}, &agentv1.ReadFileResponse{}},
		{&berthv1.WriteFileRequest{}, &agentv1.WriteFileRequest{}},
		{&berthv1.UploadRequest{}, &agentv1.UploadRequest{}},
		{&berthv1.DownloadResponse{}, &agentv1.DownloadResponse{}},
	} {
		public, agent := wire.ChunkField(pair[0]), wire.ChunkField(pair[1])
		name := pair[0].ProtoReflect().Descriptor().FullName()
		if public != agent {
			t.Errorf("%s chunk is field %d, its agent counterpart's %d: berthd would relay chunks as another field", name, public, agent)
		}
		fd := pair[0].ProtoReflect().Descriptor().Fields().ByNumber(public)
		if fd.ContainingOneof() == nil {
			t.Errorf("%s chunk is not in a oneof: a chunk message could carry other fields", name)
		}
	}
}
