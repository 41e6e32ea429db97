package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestParseVolumeMounts: --volume takes NAME:PATH, NAME:PATH:ro and
// NAME:PATH:rw, and refuses anything else naming the value.
func TestParseVolumeMounts(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    *berthv1.VolumeMount
		wantErr bool
	}{
		{in: "data:/data", want: &berthv1.VolumeMount{Name: "data", Path: "/data"}},
		{in: "data:/data:ro", want: &berthv1.VolumeMount{Name: "data", Path: "/data", ReadOnly: true}},
		{in: "data:/data:rw", want: &berthv1.VolumeMount{Name: "data", Path: "/data"}},
		{in: "data", wantErr: true},
		{in: ":/data", wantErr: true},
		{in: "data:", wantErr: true},
		{in: "data:/data:rx", wantErr: true},
	} {
		got, err := parseVolumeMounts([]string{tc.in})
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("parseVolumeMounts(%q) = %v, %v; want an error naming the value", tc.in, got, err)
			}
			continue
		}
		if err != nil || len(got) != 1 || got[0].GetName() != tc.want.GetName() || got[0].GetPath() != tc.want.GetPath() || got[0].GetReadOnly() != tc.want.GetReadOnly() {
			t.Errorf("parseVolumeMounts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestVolumeTable: `berth volume ls` prints each volume's usage, quota
// and the sandboxes that mount it.
func TestVolumeTable(t *testing.T) {
	now := time.Now()
	var b strings.Builder
	err := writeVolumeTable(&b, []*berthv1.Volume{{Name: "data", UsedBytes: 3 << 20, QuotaBytes: 40 << 20, SandboxIds: []string{"sb-1", "sb-2"},
		Created: timestamppb.New(now.Add(-time.Minute))}}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME USED QUOTA SANDBOXES CREATED" {
		t.Fatalf("table = %q, want a header and one row", b.String())
	}
	if f := strings.Fields(lines[1]); len(f) < 6 || f[1]+" "+f[2] != "3.0 MiB" || f[3]+" "+f[4] != "40.0 MiB" || f[5] != "sb-1,sb-2" {
		t.Errorf("row = %q, want USED 3.0 MiB, QUOTA 40.0 MiB, SANDBOXES sb-1,sb-2", lines[1])
	}
}
