package volumesvc

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
)

// fakeStore records the calls that reached it.
type fakeStore struct {
	created []string // owner/name/quota of each CreateVolume
	deleted []string
	sees    func(string) bool
}

func (f *fakeStore) CreateVolume(_ context.Context, owner, name string, quota uint64) (runtime.Volume, error) {
	f.created = append(f.created, owner+"/"+name)
	return runtime.Volume{Name: name, Owner: owner, QuotaBytes: quota}, nil
}

func (f *fakeStore) GetVolume(_ context.Context, owner, name string) (runtime.Volume, error) {
	return runtime.Volume{}, runtime.ErrVolumeNotFound
}

func (f *fakeStore) ListVolumes(_ context.Context, sees func(string) bool) ([]runtime.Volume, error) {
	f.sees = sees
	return nil, nil
}

func (f *fakeStore) DeleteVolume(_ context.Context, owner, name string) error {
	f.deleted = append(f.deleted, owner+"/"+name)
	return nil
}

// fakeAdmit admits or refuses, recording the bytes asked for.
type fakeAdmit struct {
	refuse    error
	requested []uint64
}

func (f *fakeAdmit) AdmitStored(_ context.Context, _, _ string, bytes uint64) (func(), error) {
	f.requested = append(f.requested, bytes)
	if f.refuse != nil {
		return nil, f.refuse
	}
	return func() {}, nil
}

func (f *fakeAdmit) RoomFreed() {}

// TestCreateVolume: names and quotas are checked before anything is
// admitted or made (INVALID_ARGUMENT naming the field), the default quota
// fills a zero, the admission's refusal stops the create, and the volume
// is the caller's.
func TestCreateVolume(t *testing.T) {
	ctx := auth.NewContext(context.Background(), auth.Principal{Name: "alice"})
	busy := errors.New("busy")
	for _, tc := range []struct {
		desc        string
		cfg         Config
		req         *berthv1.CreateVolumeRequest
		refuse      error
		wantField   string
		wantErr     error
		wantCreated string
		wantQuota   uint64
	}{
		{desc: "bad name", req: &berthv1.CreateVolumeRequest{Name: "A/b", QuotaBytes: 1 << 20}, wantField: "name"},
		{desc: "empty name", req: &berthv1.CreateVolumeRequest{QuotaBytes: 1 << 20}, wantField: "name"},
		{desc: "no quota, no default", req: &berthv1.CreateVolumeRequest{Name: "v"}, wantField: "quota_bytes"},
		{desc: "quota too small", req: &berthv1.CreateVolumeRequest{Name: "v", QuotaBytes: 4096}, wantField: "quota_bytes"},
		{desc: "quota past the maximum", cfg: Config{MaxQuotaBytes: 2 << 20}, req: &berthv1.CreateVolumeRequest{Name: "v", QuotaBytes: 3 << 20}, wantField: "quota_bytes"},
		{desc: "default quota", cfg: Config{DefaultQuotaBytes: 5 << 20}, req: &berthv1.CreateVolumeRequest{Name: "v"}, wantCreated: "alice/v", wantQuota: 5 << 20},
		{desc: "refused by admission", req: &berthv1.CreateVolumeRequest{Name: "v", QuotaBytes: 1 << 20}, refuse: busy, wantErr: busy, wantQuota: 1 << 20},
		{desc: "made", req: &berthv1.CreateVolumeRequest{Name: "v.1_x", QuotaBytes: 1 << 20}, wantCreated: "alice/v.1_x", wantQuota: 1 << 20},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			st, adm := &fakeStore{}, &fakeAdmit{refuse: tc.refuse}
			resp, err := New(tc.cfg, st, adm).CreateVolume(ctx, tc.req)
			switch {
			case tc.wantField != "":
				if invalidField(err) != tc.wantField {
					t.Fatalf("CreateVolume = %v, want INVALID_ARGUMENT naming %s", err, tc.wantField)
				}
				if len(adm.requested)+len(st.created) != 0 {
					t.Errorf("a refused request was admitted %v or made %v", adm.requested, st.created)
				}
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) || len(st.created) != 0 {
					t.Fatalf("CreateVolume = %v (made %v), want %v and nothing made", err, st.created, tc.wantErr)
				}
			default:
				if err != nil || len(st.created) != 1 || st.created[0] != tc.wantCreated || resp.GetVolume().GetOwner() != "alice" {
					t.Fatalf("CreateVolume = %v, %v (made %v), want %s", resp, err, st.created, tc.wantCreated)
				}
			}
			if len(adm.requested) != 1 || adm.requested[0] != tc.wantQuota {
				t.Errorf("admitted %v, want one admission of %d bytes", adm.requested, tc.wantQuota)
			}
		})
	}
}

// invalidField is the field an INVALID_ARGUMENT err names: an
// *apierr.Invalid's, or a status's BadRequest detail's.
func invalidField(err error) string {
	var inv *apierr.Invalid
	if errors.As(err, &inv) {
		return inv.Field
	}
	if status.Code(err) != codes.InvalidArgument {
		return ""
	}
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestListVolumesSees: a principal lists its own volumes, an admin every
// principal's.
func TestListVolumesSees(t *testing.T) {
	for _, p := range []auth.Principal{{Name: "alice"}, {Name: "root", Admin: true}} {
		st := &fakeStore{}
		if _, err := New(Config{}, st, &fakeAdmit{}).ListVolumes(auth.NewContext(context.Background(), p), &berthv1.ListVolumesRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := st.sees("bob"); got != p.Admin {
			t.Errorf("%s sees bob's volumes: %v, want %v", p.Name, got, p.Admin)
		}
		if !st.sees(p.Name) {
			t.Errorf("%s does not see its own volumes", p.Name)
		}
	}
}
