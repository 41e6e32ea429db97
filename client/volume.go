package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// CreateVolume makes the caller's empty volume name with a quota of
// quotaBytes (0: berthd's default disk quota), mounted into sandboxes by
// CreateSandbox's volumes and kept until DeleteVolume. It is not retried
// (a lost reply is found by GetVolume). Errors: codes.InvalidArgument
// (name, quota_bytes), codes.AlreadyExists (ReasonVolumeExists),
// codes.FailedPrecondition (ReasonVolumeUnsupported),
// codes.ResourceExhausted (ReasonFleetBusy past the caller's disk cap).
func (c *Client) CreateVolume(ctx context.Context, name string, quotaBytes uint64) (*berthv1.Volume, error) {
	resp, err := c.sandboxes.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: name, QuotaBytes: quotaBytes})
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetVolume(), nil
}

// GetVolume returns the caller's volume name with its usage and the
// sandboxes that mount it. Errors: codes.NotFound (ReasonVolumeNotFound,
// also for another principal's).
func (c *Client) GetVolume(ctx context.Context, name string) (*berthv1.Volume, error) {
	var resp *berthv1.GetVolumeResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.GetVolume(ctx, &berthv1.GetVolumeRequest{Name: name})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetVolume(), nil
}

// ListVolumes returns the caller's volumes (an admin's: all) with their
// usage, ordered by owner and name.
func (c *Client) ListVolumes(ctx context.Context) ([]*berthv1.Volume, error) {
	var resp *berthv1.ListVolumesResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.ListVolumes(ctx, &berthv1.ListVolumesRequest{})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetVolumes(), nil
}

// DeleteVolume removes the caller's volume name and its files. Errors:
// codes.NotFound (ReasonVolumeNotFound), codes.FailedPrecondition
// (ReasonVolumeInUse, whose metadata "sandbox_ids" names the sandboxes
// that mount it).
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.retry(ctx, func() error {
		_, err := c.sandboxes.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: name})
		return convertError(err)
	})
}
