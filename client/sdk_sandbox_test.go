package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestConnectSandboxRetries: a Sandbox that dials its own connection
// retries under the default RetryPolicy, as the Python and TypeScript SDKs
// do (a bare Client retries only WithRetry), and NoRetry turns it off.
func TestConnectSandboxRetries(t *testing.T) {
	fake := newScriptedBerthd()
	addr := serveScripted(t, fake)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fake.fail("sb", busyStatus("sb", 50*time.Millisecond))
	sb, err := client.ConnectSandbox(ctx, "sb", client.SandboxOptions{Addr: addr})
	if err != nil {
		t.Fatalf("ConnectSandbox after one FLEET_BUSY: %v", err)
	}
	if sb.ID != "sb" || fake.callsTo("sb") != 2 {
		t.Errorf("ConnectSandbox = %q after %d calls; want sb after 2", sb.ID, fake.callsTo("sb"))
	}
	if err := sb.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	fake.fail("sb2", busyStatus("sb2", 50*time.Millisecond))
	if _, err := client.ConnectSandbox(ctx, "sb2", client.SandboxOptions{Addr: addr, NoRetry: true}); !client.IsReason(err, client.ReasonFleetBusy) {
		t.Errorf("ConnectSandbox with NoRetry = %v; want FLEET_BUSY", err)
	}
}

// TestCreateSandboxDefaultImage: without SandboxOptions.Image the Go SDK
// asks for $BERTH_IMAGE, else DefaultImage, as the Python and TypeScript
// SDKs do. Before, it sent an empty image and berthd answered
// INVALID_ARGUMENT "image: is empty" to the README's Go walk-through.
func TestCreateSandboxDefaultImage(t *testing.T) {
	env := newTestEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	t.Setenv("BERTH_IMAGE", "busybox")
	sb, err := client.CreateSandbox(ctx, client.SandboxOptions{Client: env.c})
	if err != nil {
		t.Fatalf("CreateSandbox with $BERTH_IMAGE=busybox: %v", err)
	}
	if got := sb.Info.GetImage(); got != "busybox" {
		t.Errorf("image with $BERTH_IMAGE=busybox = %q; want busybox", got)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Errorf("Kill: %v", err)
	}

	t.Setenv("BERTH_IMAGE", "")
	_, err = client.CreateSandbox(ctx, client.SandboxOptions{Client: env.c})
	if !client.IsReason(err, client.ReasonImageNotFound) || !strings.Contains(err.Error(), `"`+client.DefaultImage+`"`) {
		t.Errorf("CreateSandbox without an image = %v; want IMAGE_NOT_FOUND for %q (the fake has only busybox)", err, client.DefaultImage)
	}
}

// TestRunContextEndsWhileOpening: a caller's ctx that ends before the
// exec stream's started event (a loaded berthd) is ctx's error, as
// Commands.Run says, not the stream's RST_STREAM status (TestGoSDK got
// "stream terminated by RST_STREAM with error code: CANCEL" at load 30).
func TestRunContextEndsWhileOpening(t *testing.T) {
	fake := newScriptedBerthd()
	addr, stop, err := startScriptedBerthd(fake)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	sb, err := client.ConnectSandbox(context.Background(), "slow-open", client.SandboxOptions{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if r, err := sb.Commands.Run(ctx, "sleep 30", client.RunOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run under a ctx that ends while the stream opens = %+v, %v; want context.DeadlineExceeded", r, err)
	}
}

// TestSandboxStateRetries: the state calls of Sandbox keep Client's retry
// rules, as the Python and TypeScript SDKs do (docs/clients.md): Hibernate
// is retried and says what was kept; a Snapshot and a Fork without a
// request id are sent once (each call would make new ones); a Fork with a
// request id is retried, and its children share the Sandbox's Client.
func TestSandboxStateRetries(t *testing.T) {
	fake := newScriptedBerthd()
	addr := serveScripted(t, fake)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := client.ConnectSandbox(ctx, "sb", client.SandboxOptions{Addr: addr})
	if err != nil {
		t.Fatalf("ConnectSandbox: %v", err)
	}
	defer sb.Close()
	calls := func(f func()) int {
		before := fake.callsTo("sb")
		f()
		return fake.callsTo("sb") - before
	}
	busy := busyStatus("sb", 10*time.Millisecond)

	fake.fail("sb", busy)
	var hib berthv1.Hibernation
	if n := calls(func() { hib, err = sb.Hibernate(ctx) }); err != nil || n != 2 ||
		hib != berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED || sb.Info.GetState() != berthv1.SandboxState_SANDBOX_STATE_HIBERNATED {
		t.Errorf("Hibernate after one FLEET_BUSY = %v, %v in %d calls, state %v; want PROCESSES_ENDED in 2 calls, HIBERNATED", hib, err, n, sb.Info.GetState())
	}

	fake.fail("sb", busy)
	if n := calls(func() { _, err = sb.Snapshot(ctx, nil) }); !client.IsReason(err, client.ReasonFleetBusy) || n != 1 {
		t.Errorf("Snapshot after one FLEET_BUSY = %v in %d calls; want FLEET_BUSY in 1 call", err, n)
	}

	fake.fail("sb", busy)
	if n := calls(func() { _, err = sb.Fork(ctx, client.ForkOptions{Count: 2}) }); !client.IsReason(err, client.ReasonFleetBusy) || n != 1 {
		t.Errorf("Fork without a request id after one FLEET_BUSY = %v in %d calls; want FLEET_BUSY in 1 call", err, n)
	}

	fake.fail("sb", busy)
	var children []*client.Sandbox
	labels := map[string]string{"k": "v"}
	if n := calls(func() { children, err = sb.Fork(ctx, client.ForkOptions{Count: 2, RequestID: "r1", Labels: labels}) }); err != nil || n != 2 {
		t.Fatalf("Fork with a request id after one FLEET_BUSY = %v in %d calls; want children in 2 calls", err, n)
	}
	if len(children) != 2 || children[0].ID != "sb-0" || children[1].ID != "sb-1" || children[1].Info.GetLabels()["k"] != "v" {
		t.Fatalf("Fork children = %v; want sb-0, sb-1 labelled k=v", children)
	}
	for _, c := range children {
		if c.Client != sb.Client || c.Commands == nil || c.Files == nil || c.Ports == nil {
			t.Errorf("child %s: Client shared %v, Commands/Files/Ports set %v", c.ID, c.Client == sb.Client, c.Commands != nil && c.Files != nil && c.Ports != nil)
		}
		if err := c.Close(); err != nil {
			t.Errorf("child %s Close: %v", c.ID, err)
		}
	}
	// A child's Close leaves the shared connection open.
	if _, err := sb.Refresh(ctx); err != nil {
		t.Errorf("Refresh after the children's Close: %v", err)
	}

	if children, err := sb.Fork(ctx, client.ForkOptions{}); err != nil || len(children) != 1 {
		t.Errorf("Fork with Count 0 = %v, %v; want 1 child", children, err)
	}
}
