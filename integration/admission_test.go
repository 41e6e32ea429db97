package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// concurrentRuns is how many `sleep` Runs TestConcurrentRunsAdmitted holds
// at once: BERTH_CONCURRENT_RUNS, default 400 (more than the 341 that
// reserving each Run's caps admitted into the default --run-buffer-bytes,
// and what the 2-core CI host carries beside other tests; 1,000 was
// measured too, see docs/exec-contract.md).
func concurrentRuns(t *testing.T) int {
	n := 400
	if v := os.Getenv("BERTH_CONCURRENT_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("BERTH_CONCURRENT_RUNS=%q: want a positive count", v)
		}
	}
	return n
}

// TestConcurrentRunsAdmitted is issue 23's admission check against the
// berthd binary at its default flags: N concurrent `sleep 10` Runs spread
// over 10 sandboxes are all admitted and exit 0, more than 341 (the old
// limit) running at once (all of them at the default 400). A
// Run holds 128 KiB of --run-buffer-bytes (its first slabs) while it is
// silent, not its 3 MiB of caps; --max-execs and --max-execs-per-sandbox
// are off by default, and one connection carries up to 1,024 calls
// (--max-concurrent-streams).
func TestConcurrentRunsAdmitted(t *testing.T) {
	need(t)
	const (
		sandboxes = 10
		sleep     = 10 * time.Second
		// oldAdmitted is how many Runs reserving their caps (3 MiB)
		// fit the default --run-buffer-bytes (1 GiB).
		oldAdmitted = 341
	)
	n := concurrentRuns(t)
	e := newBinaryEnv(t, "admit")
	p := startBerthd(t, e)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ids := make([]string, sandboxes)
	for i := range ids {
		resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
		if err != nil {
			t.Fatalf("create sandbox %d: %v", i, err)
		}
		ids[i] = resp.GetSandbox().GetId()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: ids[i]})
		})
	}
	before := rss(t, p.cmd.Process.Pid)

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
		ok     int
	)
	began := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := &berthv1.ProcessSpec{Argv: []string{"sleep", strconv.Itoa(int(sleep / time.Second))}}
			resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: ids[i%sandboxes], ExecId: fmt.Sprintf("run-%d", i), Process: spec})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				failed = append(failed, fmt.Sprintf("run-%d: %v", i, err))
			case resp.GetResult().GetExitCode() != 0:
				failed = append(failed, fmt.Sprintf("run-%d: exit %d", i, resp.GetResult().GetExitCode()))
			default:
				ok++
			}
		}()
	}
	var took time.Duration
	returned := make(chan struct{})
	go func() { wg.Wait(); took = time.Since(began); close(returned) }()
	// As many run at once as the host starts within the sleep: all 400
	// here; of 1,000 the host (2 cores) started 656 before the first
	// ended, exec start rate being issue 23's part 1. Either way more
	// than the 341 the old admission held.
	var running, most int
	var peak int64
	ended := func() bool {
		select {
		case <-returned:
			return true
		default:
			return false
		}
	}
	poll(2*time.Minute, func() bool {
		running = 0
		for _, id := range ids {
			for _, x := range listExecs(t, e.sandboxes, id) {
				if x.GetState() == berthv1.ExecState_EXEC_STATE_RUNNING {
					running++
				}
			}
		}
		most = max(most, running)
		peak = max(peak, rss(t, p.cmd.Process.Pid))
		return running == n || ended()
	})
	<-returned
	t.Logf("%d concurrent `sleep %v` Runs over %d sandboxes: %d exit 0, %d failed; at most %d running at once, all returned after %v; berthd RSS %d -> %d MiB",
		n, sleep, sandboxes, ok, len(failed), most, took.Round(time.Millisecond), before>>20, peak>>20)
	if want := min(n, oldAdmitted+1); most < want {
		t.Errorf("at most %d of %d Runs running at once, want at least %d (the old admission held %d)", most, n, want, oldAdmitted)
	}
	for i, f := range failed {
		if i == 10 {
			t.Errorf("... and %d more", len(failed)-10)
			break
		}
		t.Errorf("a Run failed: %s; want all admitted and exit 0", f)
	}
}
