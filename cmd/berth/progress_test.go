package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	t0 := time.Now() // a clock that stands still: no rate
	p := &progress{w: &buf, verb: "pulling", label: "alpine", total: -1, now: func() time.Time { return t0 }}
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

// TestImportProgressRateAndPhase: the import line shows the rate and the
// time, and once every byte is sent says berthd stores and unpacks, the
// rate staying that of the transfer (issue 25).
func TestImportProgressRateAndPhase(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	now := t0
	p := &progress{w: &buf, verb: "sending", label: "base.oci.tar", total: 8 << 20, sentPhase: "storing and unpacking", now: func() time.Time { return now }}
	p.update(0)
	now = t0.Add(2 * time.Second)
	p.update(4 << 20)
	if want := "sending base.oci.tar [============>           ] 4.0 MiB / 8.0 MiB (50%), 2.0 MiB/s, 2s"; !strings.HasSuffix(buf.String(), want) {
		t.Errorf("progress line %q, want it to end %q", buf.String(), want)
	}
	now = t0.Add(4 * time.Second)
	p.update(8 << 20)
	now = t0.Add(10 * time.Second)
	p.done()
	lines := strings.Split(buf.String(), "\r\033[K")
	if want := "storing and unpacking base.oci.tar [========================] 8.0 MiB / 8.0 MiB (100%), 2.0 MiB/s, 10s\n"; lines[len(lines)-1] != want {
		t.Errorf("last progress line %q, want %q", lines[len(lines)-1], want)
	}
}

// TestCopyProgressEstimate: berth cp's line shows an estimated total with
// "~" and never claims 100% before the end; the estimate of a tree counts
// headers and 512-byte blocks of its files.
func TestCopyProgressEstimate(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	now := t0
	p := &transferProgress{&progress{w: &buf, verb: "copying", label: "src", total: -1, approx: true, now: func() time.Time { return now }}}
	p.update(1 << 20)
	p.setTotal(2 << 20)
	now = t0.Add(time.Second)
	p.update(3 << 20)
	p.done()
	lines := strings.Split(buf.String(), "\r\033[K")
	if want := "copying src [========================] 3.0 MiB / ~2.0 MiB (99%), 3.0 MiB/s, 1s\n"; lines[len(lines)-1] != want {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), make([]byte, 1000), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "b"), nil, 0o644)
	// 1024 end + 4 headers (dir, a, sub, b) + 1024 of a's data.
	if got, want := archiveEstimate(dir), int64(1024+4*512+1024); got != want {
		t.Errorf("archiveEstimate = %d, want %d", got, want)
	}
}
