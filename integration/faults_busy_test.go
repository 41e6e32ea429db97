package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// TestBusyAgentIsNotUnreachable runs 300 execs at once in one sandbox
// under a berthd whose connect budget (150 ms) is far below the latency
// such a burst has on two cores: an agent that is busy answering others is
// not an unreachable one, so every exec runs; none fails
// SANDBOX_UNREACHABLE (issue 15 saw one of 500 fail with the 3 s default
// at a p99 of 2.4 s). TestUnreachableWhenAgentStopped checks that a
// stopped agent still is unreachable after the budget.
func TestBusyAgentIsNotUnreachable(t *testing.T) {
	need(t)
	const (
		budget = 150 * time.Millisecond
		execs  = 300
	)
	c := dialClient(t, startServer(t, server.Config{ConnectBudget: budget, TaskRestartLimit: -1}))
	id := createSandbox(t, c, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		unreachable int
		failed      []error
		slowest     time.Duration
	)
	start := make(chan struct{})
	for range execs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			began := time.Now()
			res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "echo ok"})
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, took)
			var ue *client.UnreachableError
			switch {
			case errors.As(err, &ue):
				unreachable++
				if len(failed) < 3 {
					failed = append(failed, err)
				}
			case err != nil || string(res.GetStdout()) != "ok\n":
				if len(failed) < 3 {
					failed = append(failed, err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("%d execs at once, connect budget %v: slowest took %v, %d SANDBOX_UNREACHABLE", execs, budget, slowest, unreachable)
	if slowest < 2*budget {
		t.Errorf("the slowest exec took %v: the burst did not load the agent past the connect budget of %v, so the test proves nothing", slowest, budget)
	}
	if unreachable > 0 || len(failed) > 0 {
		t.Errorf("%d of %d execs failed SANDBOX_UNREACHABLE with a busy agent; first failures: %v", unreachable, execs, failed)
	}
}
