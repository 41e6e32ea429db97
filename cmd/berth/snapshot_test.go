package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestSnapshotTable: `berth snapshot ls` prints each snapshot's size and
// the disk it counts against its owner's cap, in their columns.
func TestSnapshotTable(t *testing.T) {
	now := time.Now()
	var b strings.Builder
	err := writeSnapshotTable(&b, []*berthv1.Snapshot{{Id: "snap-1", SandboxId: "sb-1", Image: "img", SizeBytes: 3 << 20, DiskBytes: 40 << 20,
		Created: timestamppb.New(now.Add(-time.Minute))}}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID SANDBOX IMAGE SIZE DISK CREATED" {
		t.Fatalf("table = %q, want a header and one row", b.String())
	}
	if f := strings.Fields(lines[1]); len(f) < 7 || f[3]+" "+f[4] != "3.0 MiB" || f[5]+" "+f[6] != "40.0 MiB" {
		t.Errorf("row = %q, want SIZE 3.0 MiB and DISK 40.0 MiB", lines[1])
	}
}
