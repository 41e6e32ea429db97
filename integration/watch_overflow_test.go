package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestWatchKernelOverflow overflows the kernel's inotify queue of a
// sandbox's watch and checks that the watch says so with a typed KERNEL
// overflow, numbered in its sequence, instead of going silent.
// fs.inotify.max_queued_events is not per user namespace (unlike
// max_user_instances and max_user_watches, it is one global sysctl, read
// into each inotify instance when it is made), so the test does not lower
// it: it freezes the sandbox (PauseSandbox: the agent cannot read) and
// creates more files than the queue holds in a volume the sandbox watches,
// from the host, then thaws it.
func TestWatchKernelOverflow(t *testing.T) {
	need(t)
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Fatal(err)
	}
	queue, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || queue <= 0 || queue > 200000 {
		t.Fatalf("fs.inotify.max_queued_events = %q: the test creates more files than it", b)
	}
	vol := createVolumeOn(t, env.sandboxes, 256<<20)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Volumes: []*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/data"}}})
	pool, _, err := env.rt.DiskPool()
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(pool, "berth-volumes", env.namespace, "*", vol.GetName(), "data"))
	if len(dirs) != 1 {
		t.Fatalf("the volume's directory on the host: %v", dirs)
	}
	c, err := client.Dial(t.Context(), env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w, err := c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	watchID := msg.GetStarted().GetWatchId()
	w.Close()

	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	n := queue + queue/4 + 100
	for i := range n {
		f, err := os.Create(filepath.Join(dirs[0], fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if _, err := env.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	w, err = c.WatchFiles(ctx, &berthv1.WatchFilesRequest{SandboxId: sb.GetId(), WatchId: watchID})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	files := 0
	var last uint64
	for {
		msg, err := w.Recv()
		if err != nil {
			t.Fatalf("after %d file events (%d files made, queue %d): %v; want a KERNEL overflow", files, n, queue, err)
		}
		if o := msg.GetOverflow(); o != nil {
			if o.GetReason() != berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_KERNEL || o.GetSeq() != last+1 {
				t.Fatalf("overflow %v after seq %d, want KERNEL numbered %d", o, last, last+1)
			}
			if files > queue {
				t.Errorf("%d events before the overflow, more than the queue's %d", files, queue)
			}
			t.Logf("KERNEL overflow at seq %d after %d events (%d files, queue %d)", o.GetSeq(), files, n, queue)
			return
		}
		f := msg.GetFile()
		if f == nil || f.GetSeq() != last+1 {
			t.Fatalf("%v after seq %d", msg, last)
		}
		last = f.GetSeq()
		files++
		if files > n {
			t.Fatalf("%d events for %d files and no overflow", files, n)
		}
	}
}
