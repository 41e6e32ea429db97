// Package volumesvc is berth.v1.SandboxService's volume RPCs —
// CreateVolume, GetVolume, ListVolumes, DeleteVolume: it checks the
// request, names the caller as owner, admits a new volume's quota against
// the caller's and the server's disk (admit.Capacity.AdmitStored, as a
// snapshot is admitted) and asks the runtime, which keeps the volumes
// (runtime/volume.go, docs/volumes.md). Mounting a volume is part of
// CreateSandbox (sandboxsvc).
package volumesvc

import (
	"context"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// store keeps volumes (*runtime.Runtime).
type store interface {
	CreateVolume(ctx context.Context, owner, name string, quotaBytes uint64) (runtime.Volume, error)
	GetVolume(ctx context.Context, owner, name string) (runtime.Volume, error)
	ListVolumes(ctx context.Context, sees func(owner string) bool) ([]runtime.Volume, error)
	DeleteVolume(ctx context.Context, owner, name string) error
}

// admitter admits stored bytes within the server's disk budget and the
// owner's disk cap (*lifecycle.Manager: admit.Capacity.AdmitStored, fork
// standby members giving way to a volume refused for room they hold).
type admitter interface {
	AdmitStored(ctx context.Context, id, owner string, bytes uint64) (release func(), err error)
	// RoomFreed says that a volume's quota was given back (a standby
	// member refused for room may be made again).
	RoomFreed()
}

// Config is what the volume RPCs need of berthd's flags.
type Config struct {
	// DefaultQuotaBytes is a volume's quota, in bytes, when the request
	// sets none (berthd --default-disk-bytes); zero: the request must.
	DefaultQuotaBytes uint64
	// MaxQuotaBytes bounds requested quotas, in bytes (--max-disk-bytes);
	// zero: no bound beyond the disk budgets.
	MaxQuotaBytes uint64
}

// Service implements the volume RPCs of berth.v1.SandboxService.
type Service struct {
	cfg   Config
	store store
	admit admitter
}

// New returns the volume RPCs over st, admitting new volumes with adm.
func New(cfg Config, st store, adm admitter) *Service {
	return &Service{cfg: cfg, store: st, admit: adm}
}

// minQuotaBytes is the smallest volume quota: btrfs needs some metadata
// blocks for a subvolume's first files.
const minQuotaBytes = 1 << 20

// caller is the request's principal, or UNAUTHENTICATED.
func caller(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, apierr.New(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "the request carries no authenticated principal", nil)
	}
	return p, nil
}

// named checks name and returns the caller.
func named(ctx context.Context, name string) (auth.Principal, error) {
	if err := runtime.VolumeNameError(name); err != nil {
		return auth.Principal{}, apierr.InvalidArgument("name", err.Error())
	}
	return caller(ctx)
}

// CreateVolume makes an empty volume owned by the caller (see the proto).
// Errors: INVALID_ARGUMENT (name, quota_bytes), ALREADY_EXISTS
// VOLUME_EXISTS, FAILED_PRECONDITION VOLUME_UNSUPPORTED, RESOURCE_EXHAUSTED
// FLEET_BUSY past the disk budget or the caller's disk cap, NO_SPACE on a
// full pool.
func (s *Service) CreateVolume(ctx context.Context, req *berthv1.CreateVolumeRequest) (*berthv1.CreateVolumeResponse, error) {
	name := req.GetName()
	p, err := named(ctx, name)
	if err != nil {
		return nil, err
	}
	quota := req.GetQuotaBytes()
	switch {
	case quota == 0 && s.cfg.DefaultQuotaBytes == 0:
		return nil, apierr.InvalidArgument("quota_bytes", "is required: this server has no default disk quota (--default-disk-bytes)")
	case quota == 0:
		quota = s.cfg.DefaultQuotaBytes
	default:
		if err := bounds.Uint("quota_bytes", quota, minQuotaBytes, math.MaxInt64, "bytes", "btrfs needs metadata blocks for a volume's first files"); err != nil {
			return nil, err
		}
		if max := s.cfg.MaxQuotaBytes; max > 0 && quota > max {
			return nil, apierr.InvalidArgument("quota_bytes", fmt.Sprintf("%d exceeds the server's maximum of %d (--max-disk-bytes)", quota, max))
		}
	}
	meta := map[string]string{"volume": name}
	release, err := s.admit.AdmitStored(ctx, "volume "+name, p.Name, quota)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	defer release()
	v, err := s.store.CreateVolume(ctx, p.Name, name, quota)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	return &berthv1.CreateVolumeResponse{Volume: volumeProto(v)}, nil
}

// GetVolume returns one of the caller's volumes with its usage. Errors:
// INVALID_ARGUMENT (name), NOT_FOUND VOLUME_NOT_FOUND (also another
// principal's), FAILED_PRECONDITION VOLUME_UNSUPPORTED.
func (s *Service) GetVolume(ctx context.Context, req *berthv1.GetVolumeRequest) (*berthv1.GetVolumeResponse, error) {
	p, err := named(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	v, err := s.store.GetVolume(ctx, p.Name, req.GetName())
	if err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"volume": req.GetName()})
	}
	return &berthv1.GetVolumeResponse{Volume: volumeProto(v)}, nil
}

// ListVolumes lists the caller's volumes (an admin's: all). Errors:
// FAILED_PRECONDITION VOLUME_UNSUPPORTED.
func (s *Service) ListVolumes(ctx context.Context, _ *berthv1.ListVolumesRequest) (*berthv1.ListVolumesResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := s.store.ListVolumes(ctx, func(owner string) bool { return p.Admin || owner == p.Name })
	if err != nil {
		return nil, err
	}
	resp := &berthv1.ListVolumesResponse{}
	for _, v := range vols {
		resp.Volumes = append(resp.Volumes, volumeProto(v))
	}
	return resp, nil
}

// DeleteVolume removes one of the caller's volumes. Errors:
// INVALID_ARGUMENT (name), NOT_FOUND VOLUME_NOT_FOUND, FAILED_PRECONDITION
// VOLUME_IN_USE naming the sandboxes that mount it, VOLUME_UNSUPPORTED.
func (s *Service) DeleteVolume(ctx context.Context, req *berthv1.DeleteVolumeRequest) (*berthv1.DeleteVolumeResponse, error) {
	p, err := named(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if err := s.store.DeleteVolume(ctx, p.Name, req.GetName()); err != nil {
		return nil, apierr.WithMeta(err, map[string]string{"volume": req.GetName()})
	}
	s.admit.RoomFreed()
	return &berthv1.DeleteVolumeResponse{}, nil
}

// volumeProto is the API's view of a volume.
func volumeProto(v runtime.Volume) *berthv1.Volume {
	return &berthv1.Volume{Name: v.Name, Owner: v.Owner, Created: timestamppb.New(v.Created),
		QuotaBytes: v.QuotaBytes, UsedBytes: v.UsedBytes, SandboxIds: v.SandboxIDs}
}
