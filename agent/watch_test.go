package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestWatchFiles creates 1,000 files under a watched tree and reads their
// events over two streams, the second resuming from the last seq the first
// saw: each creation arrives exactly once. A rename is one event with both
// paths; a ring too small for what happened reports the shed events as an
// overflow, never silence.
func TestWatchFiles(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	open := func(ctx context.Context, req *berthv1.WatchFilesRequest) func() *agentv1.WatchFilesResponse {
		t.Helper()
		stream, err := a.client.WatchFiles(ctx, &agentv1.WatchFilesRequest{Watch: req})
		if err != nil {
			t.Fatal(err)
		}
		return func() *agentv1.WatchFilesResponse {
			t.Helper()
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("WatchFiles: %v", err)
			}
			return msg
		}
	}
	first, stop := context.WithCancel(ctx)
	recv := open(first, &berthv1.WatchFilesRequest{WatchId: "w1", Path: dir, Recursive: true, Include: []string{"f*"}})
	if st := recv().GetStarted(); st.GetWatchId() != "w1" || st.GetLastSeq() != 0 {
		t.Fatalf("started = %v, want w1 at seq 0", st)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, "sub", fmt.Sprintf("f%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	var last uint64
	take := func(recv func() *agentv1.WatchFilesResponse, count int) {
		for range count {
			ev := recv()
			f := ev.GetFile()
			if f == nil || f.GetSeq() != last+1 || f.GetKind() != berthv1.FileEventKind_FILE_EVENT_KIND_CREATE {
				t.Fatalf("event %v after seq %d, want the CREATE numbered %d", ev, last, last+1)
			}
			last = f.GetSeq()
			seen[f.GetPath()]++
		}
	}
	take(recv, n/2)
	stop()
	recv = open(ctx, &berthv1.WatchFilesRequest{WatchId: "w1", SinceSeq: last})
	if st := recv().GetStarted(); st.GetWatchId() != "w1" {
		t.Fatalf("resumed started = %v", st)
	}
	take(recv, n-n/2)
	for i := range n {
		if p := filepath.Join(dir, "sub", fmt.Sprintf("f%04d", i)); seen[p] != 1 {
			t.Errorf("%s seen %d times, want once", p, seen[p])
		}
	}
	if err := os.Rename(filepath.Join(dir, "sub", "f0000"), filepath.Join(dir, "f-moved")); err != nil {
		t.Fatal(err)
	}
	if f := recv().GetFile(); f.GetKind() != berthv1.FileEventKind_FILE_EVENT_KIND_RENAME || f.GetPath() != filepath.Join(dir, "f-moved") || f.GetOldPath() != filepath.Join(dir, "sub", "f0000") {
		t.Errorf("rename: %v, want RENAME from sub/f0000 to f-moved", f)
	}
	// A name that is not UTF-8 (a workload may make one) is shown with
	// its bytes escaped, and the stream goes on: a proto string cannot
	// carry it, and the event replayed on every resume ended the watch.
	if err := os.WriteFile(filepath.Join(dir, "f\xff"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f-after"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if f := recv().GetFile(); f.GetPath() != filepath.Join(dir, `f\xff`) {
		t.Errorf("event of a non-UTF-8 name: %v, want the path with \\xff", f)
	}
	if f := recv().GetFile(); f.GetPath() != filepath.Join(dir, "f-after") {
		t.Errorf("event after the non-UTF-8 name: %v, want f-after", f)
	}

	// A ring of 100 events, 300 creations nobody read: 200 shed.
	small := t.TempDir()
	recv = open(ctx, &berthv1.WatchFilesRequest{WatchId: "w2", Path: small, BufferEvents: 100})
	recv() // started
	for i := range 300 {
		if err := os.WriteFile(filepath.Join(small, fmt.Sprintf("g%d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the 300th event on the live stream, then replay from 0.
	for {
		if f := recv().GetFile(); f.GetSeq() == 300 {
			break
		}
	}
	recv = open(ctx, &berthv1.WatchFilesRequest{WatchId: "w2", SinceSeq: 0})
	recv()
	if o := recv().GetOverflow(); o.GetReason() != berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_RING || o.GetFirstSeq() != 1 || o.GetLastSeq() != 200 {
		t.Errorf("replay from 0 of a 100-event ring after 300: %v, want a RING overflow of 1-200", o)
	}
	if f := recv().GetFile(); f.GetSeq() != 201 {
		t.Errorf("after the overflow: %v, want seq 201", f)
	}

	// Resuming a watch the agent does not have, with no path to start it.
	gone, err := a.client.WatchFiles(ctx, &agentv1.WatchFilesRequest{Watch: &berthv1.WatchFilesRequest{WatchId: "gone", SinceSeq: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Recv(); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "WATCH_NOT_FOUND") && !strings.Contains(err.Error(), "not found") {
		t.Errorf("resume of an unknown watch: %v, want NOT_FOUND", err)
	}
}
