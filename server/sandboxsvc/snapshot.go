package sandboxsvc

import (
	"context"
	"fmt"
	"path"
	"strings"

	"google.golang.org/grpc/codes"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
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
// SANDBOX_NOT_RUNNING, RESOURCE_EXHAUSTED FLEET_BUSY past the disk budget
// or the caller's disk cap, NO_SPACE on a full pool.
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
		DiskBytes: s.DiskBytes,
	}
}

// CommitSnapshot makes an image of one of the caller's snapshots (see the
// proto). Errors: INVALID_ARGUMENT (snapshot_id; reference, which must
// parse as a docker reference; changes.env, changes.working_dir),
// PERMISSION_DENIED NOT_PERMITTED for replace by a non-admin, NOT_FOUND
// SNAPSHOT_NOT_FOUND (also another principal's) or IMAGE_NOT_FOUND,
// ALREADY_EXISTS IMAGE_EXISTS, RESOURCE_EXHAUSTED NO_SPACE, or FLEET_BUSY
// past the disk budget or the caller's disk cap.
func (s *Service) CommitSnapshot(ctx context.Context, req *berthv1.CommitSnapshotRequest) (*berthv1.CommitSnapshotResponse, error) {
	id, ref := req.GetSnapshotId(), req.GetReference()
	if !runtime.ValidSnapshotID(id) {
		return nil, apierr.InvalidArgument("snapshot_id", "is not a snapshot id (snap- and 20 lowercase hex digits)")
	}
	if err := validate.ImageRef("reference", ref); err != nil {
		return nil, err
	}
	if _, err := runtime.NormalizeReference(ref); err != nil {
		return nil, apierr.InvalidArgument("reference", err.Error())
	}
	ch := req.GetChanges()
	for i, kv := range ch.GetEnv() {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return nil, apierr.InvalidArgument("changes.env", fmt.Sprintf("entry %d is not KEY=VALUE (a non-empty key, no NUL)", i))
		}
	}
	if wd := ch.GetWorkingDir(); wd != "" && !path.IsAbs(wd) {
		return nil, apierr.InvalidArgument("changes.working_dir", "is not an absolute path")
	}
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"snapshot_id": id, "reference": ref}
	if req.GetReplace() && !p.Admin {
		return nil, apierr.New(codes.PermissionDenied, rpcstatus.ReasonNotPermitted,
			"replace is for admins: every principal's next sandbox of "+ref+" would run the replacement; commit under a new reference", meta)
	}
	c, err := s.life.CommitSnapshot(ctx, id, p, runtime.CommitOptions{
		Ref: ref, Replace: req.GetReplace(), Private: !p.Admin,
		Env: ch.GetEnv(), WorkingDir: ch.GetWorkingDir(), Entrypoint: ch.GetEntrypoint(), Cmd: ch.GetCmd(),
	})
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	img := c.Image
	return &berthv1.CommitSnapshotResponse{
		Image:          &berthv1.Image{Name: img.Name, Digest: img.Digest, SizeBytes: img.SizeBytes, ContentSizeBytes: img.ContentSizeBytes, CreatedAt: timestamppb.New(img.CreatedAt)},
		LayerDigest:    c.Layer.Digest.String(),
		LayerSizeBytes: c.Layer.Size,
	}, nil
}
