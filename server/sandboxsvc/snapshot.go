package sandboxsvc

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/validate"
)

// CreateSnapshot stores a crash-consistent copy of the sandbox's root file
// system, owned by the caller (see the proto). Errors: INVALID_ARGUMENT
// (sandbox_id, labels: a sandbox's limits, and at most about 4 KiB of
// them as JSON), NOT_FOUND for a missing sandbox or another
// principal's, FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED (not the btrfs
// snapshotter, or a sandbox without an idmapped root) or
// SANDBOX_NOT_RUNNING.
func (s *Service) CreateSnapshot(ctx context.Context, req *berthv1.CreateSnapshotRequest) (*berthv1.CreateSnapshotResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	if err := validate.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if err := runtime.SnapshotLabelsError(req.GetLabels()); err != nil {
		return nil, apierr.InvalidArgument("labels", err.Error())
	}
	p, err := s.callerSeeing(ctx, id)
	if err != nil {
		return nil, err
	}
	snap, err := s.life.CreateSnapshot(ctx, id, p, req.GetLabels())
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	return &berthv1.CreateSnapshotResponse{Snapshot: snapshotProto(snap)}, nil
}

// ListSnapshots lists the caller's snapshots (an admin's: all), oldest
// first. Errors: FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED when berthd's
// snapshotter keeps none.
func (s *Service) ListSnapshots(ctx context.Context, _ *berthv1.ListSnapshotsRequest) (*berthv1.ListSnapshotsResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	snaps, err := s.life.ListSnapshots(ctx, p)
	if err != nil {
		return nil, err
	}
	resp := &berthv1.ListSnapshotsResponse{}
	for _, snap := range snaps {
		resp.Snapshots = append(resp.Snapshots, snapshotProto(snap))
	}
	return resp, nil
}

// DeleteSnapshot removes one of the caller's snapshots. Errors:
// INVALID_ARGUMENT (snapshot_id), NOT_FOUND SNAPSHOT_NOT_FOUND (also for
// another principal's), FAILED_PRECONDITION SNAPSHOT_IN_USE while a
// sandbox created from it exists.
func (s *Service) DeleteSnapshot(ctx context.Context, req *berthv1.DeleteSnapshotRequest) (*berthv1.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if !runtime.ValidSnapshotID(id) {
		return nil, apierr.InvalidArgument("snapshot_id", "is not a snapshot id (snap- and 20 lowercase hex digits)")
	}
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.life.DeleteSnapshot(ctx, id, p); err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"snapshot_id": id})
	}
	return &berthv1.DeleteSnapshotResponse{}, nil
}

// snapshotProto is the API's view of a stored snapshot.
func snapshotProto(s runtime.Snapshot) *berthv1.Snapshot {
	return &berthv1.Snapshot{
		Id:        s.ID,
		SandboxId: s.SandboxID,
		Owner:     s.Owner,
		Created:   timestamppb.New(s.Created),
		SizeBytes: s.SizeBytes,
		Labels:    s.Labels,
		Image:     s.Image,
	}
}
