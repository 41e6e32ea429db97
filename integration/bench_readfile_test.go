package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// BenchmarkReadFileParts says where the time of ReadFile of 1 GiB into a
// host file goes (issue 23 part 4; docs/performance.md), in the setting of
// benchBigRead (a sandbox of its own, the source read whole and the
// previous copy removed and written out off the clock). Each iteration
// takes, in turns:
//   - ReadFile into a host file, timing the caller's write(2)s: their wall
//     time, and of it the writing thread's time on a CPU and waiting on a
//     run queue (/proc/thread-self/schedstat; the rest is time blocked);
//   - ReadFile into io.Discard: berth's transport alone;
//   - cp --reflink=never of the same file on the host.
//
// It reports each one's MB/s and CPU seconds per GiB (the test process's
// for berth: berthd and the client; cp's own), and the write's parts in
// seconds per GiB. Not part of make bench: go test -bench ReadFileParts.
func BenchmarkReadFileParts(b *testing.B) {
	if env.skip != "" {
		b.Skip("integration environment unavailable: " + env.skip)
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	dir, err := os.MkdirTemp(hostBenchDir(), "bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	id, src, dst := bigFileSource(b, c, dir)
	const path = bigFilePath
	warm := &berthv1.ProcessSpec{Argv: []string{"sh", "-c", `cat "$1" >/dev/null`, "sh", path}}

	var n int
	var file, discard, cp, write, onCPU, queued time.Duration
	var fileCPU, discardCPU, cpCPU time.Duration
	for b.Loop() {
		n++
		// Into a host file, on a thread of its own so that the thread's
		// schedstat is the writes'.
		writeOut(b, dir, dst)
		berthExec(b, c, id, warm, io.Discard)
		func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := selfCPU(b)
			start := time.Now()
			out, err := os.Create(dst)
			if err != nil {
				b.Fatal(err)
			}
			w := &timedWriter{w: out}
			_, err = c.ReadFile(ctx, id, path, w)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				b.Fatal(err)
			}
			file += time.Since(start)
			fileCPU += selfCPU(b) - cpu0
			write, onCPU, queued = write+w.wall, onCPU+w.run, queued+w.queued
		}()
		// Into io.Discard.
		writeOut(b, dir, dst)
		berthExec(b, c, id, warm, io.Discard)
		cpu0 := selfCPU(b)
		start := time.Now()
		if h, err := c.ReadFile(ctx, id, path, io.Discard); err != nil || h.GetLengthBytes() != bigFileBytes {
			b.Fatalf("ReadFile: %v", err)
		}
		discard += time.Since(start)
		discardCPU += selfCPU(b) - cpu0
		// cp.
		writeOut(b, dir, dst)
		if out, err := exec.Command("sh", "-c", `cat "$1" >/dev/null`, "sh", src).CombinedOutput(); err != nil {
			b.Fatalf("read %s: %v: %s", src, err, out)
		}
		start = time.Now()
		cmd := exec.Command("cp", "--reflink=never", src, dst)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		cp += time.Since(start)
		cpCPU += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	gib := float64(n) * bigFileBytes / (1 << 30)
	rate := func(d time.Duration) float64 { return float64(n) * bigFileBytes / d.Seconds() / 1e6 }
	perGiB := func(d time.Duration) float64 { return d.Seconds() / gib }
	b.ReportMetric(rate(file), "MB/s-ReadFile-file")
	b.ReportMetric(rate(discard), "MB/s-ReadFile-discard")
	b.ReportMetric(rate(cp), "MB/s-host-cp")
	b.ReportMetric(perGiB(fileCPU), "cpu-s/GiB-ReadFile-file")
	b.ReportMetric(perGiB(discardCPU), "cpu-s/GiB-ReadFile-discard")
	b.ReportMetric(perGiB(cpCPU), "cpu-s/GiB-host-cp")
	b.ReportMetric(perGiB(write), "s/GiB-in-write")
	b.ReportMetric(perGiB(onCPU), "s/GiB-in-write-on-cpu")
	b.ReportMetric(perGiB(queued), "s/GiB-in-write-runqueue")
	fmt.Printf("    load average: %s at the end\n", loadAverage())
}

// timedWriter times the Writes of w: their wall time, and the calling
// thread's time on a CPU and waiting on a run queue meanwhile (the caller
// locks its goroutine to its thread).
type timedWriter struct {
	w                 io.Writer
	wall, run, queued time.Duration
}

func (t *timedWriter) Write(p []byte) (int, error) {
	run0, queued0 := threadSchedstat()
	start := time.Now()
	n, err := t.w.Write(p)
	t.wall += time.Since(start)
	run1, queued1 := threadSchedstat()
	t.run += run1 - run0
	t.queued += queued1 - queued0
	return n, err
}

// threadSchedstat returns the calling thread's time on a CPU and waiting
// on a run queue (/proc/thread-self/schedstat); zeros when unreadable.
func threadSchedstat() (run, queued time.Duration) {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0, 0
	}
	var r, q int64
	fmt.Sscan(string(b), &r, &q)
	return time.Duration(r), time.Duration(q)
}
