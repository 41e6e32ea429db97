package execsvc

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestPortDataFields: berthd relays a port-forward data message between
// the caller and the agent as it is on the wire, so the data field must
// have the same number in all four messages, inside their oneof (a data
// message holds nothing else).
func TestPortDataFields(t *testing.T) {
	for _, m := range []proto.Message{
		&berthv1.PortForwardRequest{}, &berthv1.PortForwardResponse{},
		&agentv1.PortForwardRequest{}, &agentv1.PortForwardResponse{},
	} {
		name := m.ProtoReflect().Descriptor().FullName()
		n := wire.BytesField(m, "data")
		if n != portDataField {
			t.Errorf("%s data is field %d, want %d: berthd would relay data as another field", name, n, portDataField)
		}
		if m.ProtoReflect().Descriptor().Fields().ByNumber(n).ContainingOneof() == nil {
			t.Errorf("%s data is not in a oneof: a data message could carry other fields", name)
		}
	}
}
