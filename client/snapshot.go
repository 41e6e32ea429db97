package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// CreateSnapshot stores a point-in-time, crash-consistent copy of the root
// file system of the sandbox named id, with labels, owned by the caller:
// every write the sandbox saw complete before the call is in it. It
// survives the sandbox's deletion; CreateSandbox with from_snapshot starts
// a sandbox from it. It is not retried (each call takes a new snapshot).
// Errors: codes.NotFound (ReasonSandboxNotFound), codes.FailedPrecondition
// (ReasonSnapshotUnsupported: berthd's snapshotter is not btrfs, or the
// sandbox has no idmapped root; ReasonSandboxNotRunning).
func (c *Client) CreateSnapshot(ctx context.Context, id string, labels map[string]string) (*berthv1.Snapshot, error) {
	resp, err := c.sandboxes.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: id, Labels: labels})
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetSnapshot(), nil
}

// ListSnapshots returns the caller's snapshots (an admin's: all), oldest
// first.
func (c *Client) ListSnapshots(ctx context.Context) ([]*berthv1.Snapshot, error) {
	var resp *berthv1.ListSnapshotsResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSnapshots(), nil
}

// DeleteSnapshot removes the snapshot named id. Errors: codes.NotFound
// (ReasonSnapshotNotFound, also for another principal's),
// codes.FailedPrecondition (ReasonSnapshotInUse) while a sandbox created
// from it exists.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.retry(ctx, func() error {
		_, err := c.sandboxes.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: id})
		return convertError(err)
	})
}

// CommitOptions are the optional parts of CommitSnapshot.
type CommitOptions struct {
	// Replace replaces a stored image of the same reference (admins only).
	Replace bool
	// Changes are applied to the image's config; nil keeps the
	// snapshot's image's config.
	Changes *berthv1.ImageConfigChanges
}

// CommitSnapshot makes image ref of the caller's snapshot named id, like
// docker commit: the snapshot's image plus one layer of what the snapshot
// changed (whiteouts for deleted files), listed by ListImages and taken
// by CreateSandbox. It is not retried (a lost reply is found by
// ListImages). Errors: codes.InvalidArgument (snapshot_id, reference),
// codes.NotFound (ReasonSnapshotNotFound, also for another principal's;
// ReasonImageNotFound when the snapshot's image is gone),
// codes.AlreadyExists (ReasonImageExists) without opts.Replace,
// codes.PermissionDenied (ReasonNotPermitted) for Replace by a non-admin.
func (c *Client) CommitSnapshot(ctx context.Context, id, ref string, opts CommitOptions) (*berthv1.CommitSnapshotResponse, error) {
	resp, err := c.sandboxes.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: id, Reference: ref, Replace: opts.Replace, Changes: opts.Changes})
	if err != nil {
		return nil, convertError(err)
	}
	return resp, nil
}
