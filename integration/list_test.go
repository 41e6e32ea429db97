package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// TestListSandboxesConcurrent: 1,000 concurrent ListSandboxes calls on a
// berthd holding 50 sandboxes all succeed, each with the 50 sandboxes and
// their tasks' state. Each listing costs containerd two requests, however
// many sandboxes there are (before: three per sandbox, and 946 of 1,000
// calls with 18 sandboxes failed "containerd did not answer within 10s").
func TestListSandboxesConcurrent(t *testing.T) {
	need(t)
	e := newInProcessEnv(t, "list", server.Config{TaskRestartLimit: -1})
	const sandboxes, calls = 50, 1000
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, sandboxes+calls)
	for i := range sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("list-%02d", i)
			if _, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage}); err != nil {
				errs <- fmt.Errorf("create %s: %w", id, err)
			}
		}()
		if i%5 == 4 {
			wg.Wait() // five at a time: 2 cores
		}
	}
	wg.Wait()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for i := range sandboxes {
			e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: fmt.Sprintf("list-%02d", i)})
		}
	})
	if len(errs) > 0 {
		t.Fatal(<-errs)
	}
	start := time.Now()
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{PageSize: 100})
			if err != nil {
				errs <- err
				return
			}
			running := 0
			for _, sb := range resp.GetSandboxes() {
				if sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING && sb.GetRuntime().GetTaskPid() != 0 {
					running++
				}
			}
			if len(resp.GetSandboxes()) != sandboxes || running != sandboxes {
				errs <- fmt.Errorf("a listing has %d sandboxes, %d running with a task pid; want %d", len(resp.GetSandboxes()), running, sandboxes)
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed == 0 {
			t.Errorf("ListSandboxes: %v", err)
		}
		failed++
	}
	t.Logf("%d concurrent listings of %d sandboxes in %v; %d failed", calls, sandboxes, time.Since(start).Round(time.Millisecond), failed)
	if failed > 0 {
		t.Errorf("%d of %d concurrent listings failed", failed, calls)
	}
}
