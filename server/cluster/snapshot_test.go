package cluster

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
)

// TestRouterRefusesSnapshots: in a fleet the snapshot calls, and a create
// from a snapshot, are FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED, never run
// on whichever node the call reached.
func TestRouterRefusesSnapshots(t *testing.T) {
	r := NewRouter(RouterConfig{Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	for method, req := range map[string]any{
		berthv1.SandboxService_CreateSnapshot_FullMethodName: &berthv1.CreateSnapshotRequest{SandboxId: "sb-1"},
		berthv1.SandboxService_ListSnapshots_FullMethodName:  &berthv1.ListSnapshotsRequest{},
		berthv1.SandboxService_DeleteSnapshot_FullMethodName: &berthv1.DeleteSnapshotRequest{SnapshotId: "snap-0123456789abcdef0123"},
		berthv1.SandboxService_CreateSandbox_FullMethodName:  &berthv1.CreateSandboxRequest{FromSnapshot: "snap-0123456789abcdef0123"},
		berthv1.SandboxService_CommitSnapshot_FullMethodName: &berthv1.CommitSnapshotRequest{SnapshotId: "snap-0123456789abcdef0123", Reference: "x:1"},
	} {
		ran := false
		_, err := r.UnaryInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { ran = true; return nil, nil })
		if ran || status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotUnsupported {
			t.Errorf("%s in a fleet: ran %v, %v; want FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED without running", method, ran, err)
		}
	}
}

// TestRouterRefusesVolumes: in a fleet the volume calls, and a create that
// mounts a volume, are FAILED_PRECONDITION VOLUME_UNSUPPORTED, never run
// on whichever node the call reached (a volume lives on one node).
func TestRouterRefusesVolumes(t *testing.T) {
	r := NewRouter(RouterConfig{Log: testLog()})
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	for method, req := range map[string]any{
		berthv1.SandboxService_CreateVolume_FullMethodName:  &berthv1.CreateVolumeRequest{Name: "v"},
		berthv1.SandboxService_GetVolume_FullMethodName:     &berthv1.GetVolumeRequest{Name: "v"},
		berthv1.SandboxService_ListVolumes_FullMethodName:   &berthv1.ListVolumesRequest{},
		berthv1.SandboxService_DeleteVolume_FullMethodName:  &berthv1.DeleteVolumeRequest{Name: "v"},
		berthv1.SandboxService_CreateSandbox_FullMethodName: &berthv1.CreateSandboxRequest{Volumes: []*berthv1.VolumeMount{{Name: "v", Path: "/data"}}},
	} {
		ran := false
		_, err := r.UnaryInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { ran = true; return nil, nil })
		if ran || status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeUnsupported {
			t.Errorf("%s in a fleet: ran %v, %v; want FAILED_PRECONDITION VOLUME_UNSUPPORTED without running", method, ran, err)
		}
	}
}
