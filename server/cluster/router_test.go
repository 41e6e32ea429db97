package cluster

import (
	"testing"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestEveryRoutedMethodNamesItsSandbox checks the router's one assumption
// about the routed services: the request (the first message of a stream)
// of every method but CreateSandbox, ListSandboxes and ListSnapshots, which
// the router handles itself, and the calls naming a snapshot (routed by
// its record), names its sandbox in a sandbox_id field at most one level
// down. A method added to these services (PortForward) is routed by it
// without more code; one whose request names no sandbox fails here, and
// needs a decision in Router.
func TestEveryRoutedMethodNamesItsSandbox(t *testing.T) {
	special := map[string]bool{
		berthv1.SandboxService_CreateSandbox_FullMethodName: true,
		berthv1.SandboxService_ListSandboxes_FullMethodName: true,
		berthv1.SandboxService_ListSnapshots_FullMethodName: true,
		// Refused in a fleet (volumesNotInFleet).
		berthv1.SandboxService_CreateVolume_FullMethodName: true,
		berthv1.SandboxService_GetVolume_FullMethodName:    true,
		berthv1.SandboxService_ListVolumes_FullMethodName:  true,
		berthv1.SandboxService_DeleteVolume_FullMethodName: true,
	}
	// These name a snapshot, routed to its node by its record
	// (snapshotCall): a snapshot_id field, read by snapshotIDOf.
	namesSnapshot := map[string]bool{
		berthv1.SandboxService_DeleteSnapshot_FullMethodName: true,
		berthv1.SandboxService_CommitSnapshot_FullMethodName: true,
	}
	for _, sd := range []grpc.ServiceDesc{berthv1.SandboxService_ServiceDesc, berthv1.FileService_ServiceDesc} {
		if !routedServices[sd.ServiceName] {
			t.Errorf("service %s is not routed", sd.ServiceName)
		}
		var methods []string
		for _, m := range sd.Methods {
			methods = append(methods, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, m := range sd.Streams {
			methods = append(methods, "/"+sd.ServiceName+"/"+m.StreamName)
		}
		for _, method := range methods {
			if special[method] {
				continue
			}
			in, _, err := messageTypes(method)
			if err != nil {
				t.Errorf("%s: %v", method, err)
				continue
			}
			if namesSnapshot[method] {
				req := in.New()
				fd := req.Descriptor().Fields().ByName("snapshot_id")
				if fd == nil {
					t.Errorf("%s: request %s has no snapshot_id field", method, in.Descriptor().FullName())
					continue
				}
				req.Set(fd, protoreflect.ValueOfString("snap-x"))
				if got := snapshotIDOf(req.Interface()); got != "snap-x" {
					t.Errorf("%s: snapshotIDOf = %q, want snap-x", method, got)
				}
				continue
			}
			req := in.New()
			if !setSandboxID(req, "sb-x") {
				t.Errorf("%s: request %s has no sandbox_id field at most one level down: the router cannot route it", method, in.Descriptor().FullName())
				continue
			}
			if got := sandboxid.Of(req, 1); got != "sb-x" {
				t.Errorf("%s: sandboxid.Of = %q, want sb-x", method, got)
			}
		}
	}
}

// setSandboxID sets the sandbox_id field of m, or of its first message
// field that has one.
func setSandboxID(m protoreflect.Message, id string) bool {
	fields := m.Descriptor().Fields()
	if fd := fields.ByName("sandbox_id"); fd != nil {
		m.Set(fd, protoreflect.ValueOfString(id))
		return true
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsList() || fd.IsMap() {
			continue
		}
		if inner := fd.Message().Fields().ByName("sandbox_id"); inner != nil {
			sub := m.Mutable(fd).Message()
			sub.Set(inner, protoreflect.ValueOfString(id))
			return true
		}
	}
	return false
}
