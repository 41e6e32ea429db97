package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// This example handles each runtime condition the way a caller should. It
// runs against a scripted stand-in for berthd that produces each condition
// on cue (the code is the same against a real berthd): sandbox "busy" is
// full for its first two calls, "frozen" has a stopped agent, and the
// runtime of "crashy" dies under every exec.
func Example_conditions() {
	fake := newScriptedBerthd()
	fake.fail("busy", busyStatus("busy", 10*time.Millisecond), busyStatus("busy", 10*time.Millisecond))
	for range 10 {
		fake.fail("frozen", unreachableStatus("frozen", berthv1.Admitted_ADMITTED_NOT_STARTED))
	}
	addr, stop, err := startScriptedBerthd(fake)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	ctx := context.Background()
	// Opt in to retries of what is safe to retry: FLEET_BUSY after
	// berthd's delay, SANDBOX_UNREACHABLE (when nothing ran) with jittered
	// backoff; both end with the call's context or after MaxAttempts.
	retries := 0
	c, err := client.Dial(ctx, addr, client.WithRetry(client.RetryPolicy{
		MaxAttempts:    5,
		InitialBackoff: 10 * time.Millisecond,
		OnRetry:        func(attempt int, err error, wait time.Duration) { retries++ },
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// FleetBusy: refused twice, then run by the retry policy; the caller
	// sees only the result.
	res, err := c.Run(ctx, "busy", &berthv1.ProcessSpec{Argv: []string{"echo", "built"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("busy: %s after %d retries\n", res.GetStdout()[:5], retries)

	// Unreachable: retried with backoff, here 5 attempts in all, then
	// returned.
	_, err = c.Run(ctx, "frozen", &berthv1.ProcessSpec{Argv: []string{"true"}})
	var unreachable *client.UnreachableError
	if errors.As(err, &unreachable) {
		fmt.Println("frozen:", unreachable.Detail.GetCause(), "nothing ran:", unreachable.NothingRan(), "calls:", fake.callsTo("frozen"))
	}

	// RuntimeReplaced: never retried, the command may have run partly.
	e, err := c.Exec(ctx, "crashy", &berthv1.ProcessSpec{ShellCommand: "make install"}, client.WithExecID("install-1"))
	if err != nil {
		log.Fatal(err)
	}
	_, err = e.Wait()
	var replaced *client.RuntimeReplacedError
	if errors.As(err, &replaced) {
		d := replaced.Detail
		fmt.Println("crashy:", d.GetCause(), d.GetAdmitted(), "exit status", d.GetTaskExitStatus())
		fmt.Println("crashy: runtime", d.GetBefore().GetAgentBootId()[:8], "->", d.GetAfter().GetAgentBootId()[:8], "retryable:", client.IsRetryable(err))
	}

	// StaleHandle: the exec id belongs to the runtime that died.
	fake.fail("crashy", staleStatus("crashy", "install-1"))
	_, err = c.Attach(ctx, "crashy", "install-1", 0)
	var stale *client.StaleHandleError
	if errors.As(err, &stale) {
		fmt.Println("crashy:", stale.Code, stale.Reason, "- start a new exec")
	}

	// Every one of them is also a *client.Error.
	var ce *client.Error
	fmt.Println(errors.As(err, &ce), ce.Reason)

	// Output:
	// busy: built after 2 retries
	// frozen: UNREACHABLE_CAUSE_CONNECT_TIMEOUT nothing ran: true calls: 5
	// crashy: REPLACED_CAUSE_TASK_EXITED ADMITTED_STARTED exit status 137
	// crashy: runtime 0a1b2c3d -> f9e8d7c6 retryable: false
	// crashy: FailedPrecondition STALE_HANDLE - start a new exec
	// true STALE_HANDLE
}
