package main

import (
	"bytes"
	"strings"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestProgressBar(t *testing.T) {
	for _, tc := range []struct {
		sent  uint64
		total int64
		want  string
	}{
		{0, 100, "[>         ] "},
		{50, 100, "[=====>    ] "},
		{100, 100, "[==========] "},
		{150, 100, "[==========] "},
		{5, -1, ""},
		{5, 0, ""},
	} {
		if got := progressBar(tc.sent, tc.total, 10); got != tc.want {
			t.Errorf("progressBar(%d, %d, 10) = %q, want %q", tc.sent, tc.total, got, tc.want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	var buf bytes.Buffer
	p := &progress{w: &buf, verb: "pulling", label: "alpine", total: -1}
	p.updateTotal(1<<20, 4<<20, "1/3 blobs")
	p.done()
	got := buf.String()
	want := "pulling alpine [======>                 ] 1.0 MiB / 4.0 MiB (25%), 1/3 blobs"
	if !strings.Contains(got, want) || !strings.HasSuffix(got, "\n") {
		t.Errorf("progress output %q, want it to contain %q and end the line", got, want)
	}
}

// TestPullProgressUnpacking: the bar sat at 100% through the unpack
// (issue 12); once every blob is downloaded the line says unpacking.
func TestPullProgressUnpacking(t *testing.T) {
	var buf bytes.Buffer
	p := &progress{w: &buf, verb: "pulling", label: "alpine", total: -1}
	p.pulled(&berthv1.PullImageResponse{DownloadedBytes: 1 << 20, TotalBytes: 4 << 20,
		Layers: []*berthv1.PullLayerProgress{{Done: true}, {}}})
	p.pulled(&berthv1.PullImageResponse{DownloadedBytes: 4 << 20, TotalBytes: 4 << 20,
		Layers: []*berthv1.PullLayerProgress{{Done: true}, {Done: true}}})
	p.done()
	lines := strings.Split(buf.String(), "\r\033[K")
	last := lines[len(lines)-1]
	if want := "unpacking alpine 4.0 MiB, 2/2 blobs downloaded\n"; last != want {
		t.Errorf("last progress line %q, want %q (all: %q)", last, want, buf.String())
	}
}
