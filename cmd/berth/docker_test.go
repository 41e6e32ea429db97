package main

import (
	"bytes"
	"maps"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestSandboxFilters(t *testing.T) {
	f, err := parseSandboxFilters([]string{"label=team=a", "label=ci", "state=paused", "state=running", "owner=unix:1000"})
	if err != nil {
		t.Fatal(err)
	}
	if sel := f.addLabels(map[string]string{"x": "1"}); !maps.Equal(sel, map[string]string{"x": "1", "team": "a"}) {
		t.Errorf("labels for berthd = %v, want x=1 team=a", sel)
	}
	sb := func(state berthv1.SandboxState, owner string, labels map[string]string) *berthv1.Sandbox {
		return &berthv1.Sandbox{State: state, Owner: owner, Labels: labels}
	}
	ci := map[string]string{"ci": "", "team": "a"}
	for _, tc := range []struct {
		sb   *berthv1.Sandbox
		want bool
	}{
		{sb(berthv1.SandboxState_SANDBOX_STATE_RUNNING, "unix:1000", ci), true},
		{sb(berthv1.SandboxState_SANDBOX_STATE_PAUSED, "unix:1000", ci), true},
		{sb(berthv1.SandboxState_SANDBOX_STATE_STOPPED, "unix:1000", ci), false},
		{sb(berthv1.SandboxState_SANDBOX_STATE_RUNNING, "unix:0", ci), false},
		{sb(berthv1.SandboxState_SANDBOX_STATE_RUNNING, "unix:1000", map[string]string{"team": "a"}), false},
	} {
		if got := f.match(tc.sb); got != tc.want {
			t.Errorf("match(%v) = %v, want %v", tc.sb, got, tc.want)
		}
	}
	for _, bad := range []string{"state=sleeping", "colour=red", "label", "state="} {
		if _, err := parseSandboxFilters([]string{bad}); err == nil {
			t.Errorf("parseSandboxFilters(%q): no error", bad)
		}
	}
}

func TestStatsTable(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	mk := func(cpu time.Duration) *berthv1.Sandbox {
		return &berthv1.Sandbox{Id: "dev", Runtime: &berthv1.RuntimeIdentity{AgentBootId: "b1"},
			Resources: &berthv1.Resources{MemoryBytes: 512 << 20, PidsLimit: 128},
			Usage:     &berthv1.SandboxUsage{CpuTime: durationpb.New(cpu), MemoryBytes: 3 << 20, MemoryPeakBytes: 4 << 20, Pids: 3, DiskBytes: 1536}}
	}
	var b bytes.Buffer
	if err := writeStats(&b, usageSample{t0, []*berthv1.Sandbox{mk(time.Second)}}, usageSample{t0.Add(2 * time.Second), []*berthv1.Sandbox{mk(2 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"ID    CPU %   CPU TIME   MEM       MEM LIMIT   MEM PEAK   DISK      DISK LIMIT   PIDS   PIDS LIMIT\n" +
		"dev   50.0%   2s         3.0 MiB   512.0 MiB   4.0 MiB    1.5 KiB   -            3      128\n"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}
