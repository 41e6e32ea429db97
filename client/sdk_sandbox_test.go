package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// TestConnectSandboxRetries: a Sandbox that dials its own connection
// retries under the default RetryPolicy, as the Python and TypeScript SDKs
// do (a bare Client retries only WithRetry), and NoRetry turns it off.
func TestConnectSandboxRetries(t *testing.T) {
	fake := newScriptedBerthd()
	addr, stop, err := startScriptedBerthd(fake)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
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
