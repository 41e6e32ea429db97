package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// berthOut runs the CLI without stdin and returns its stdout and exit code,
// logging its stderr when it fails.
func berthOut(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := berthCLI(t, nil, args...)
	if code != 0 {
		t.Logf("berth %q stderr: %s", args, errOut)
	}
	return out, code
}

// TestCLIImagesAndCreate pulls with `berth image pull`, creates a sandbox
// with the lifecycle flags, holds it with `berth sandbox keepalive`, and
// deletes the image with `berth image rm`.
func TestCLIImagesAndCreate(t *testing.T) {
	need(t)
	host, _ := serveRegistry(t, archivePath(), "berth/cli", "v2")
	ref := host + "/berth/cli:v2"
	out, code := berthOut(t, "image", "pull", ref)
	if code != 0 || !strings.HasPrefix(out, ref+" sha256:") {
		t.Fatalf("berth image pull = %q, exit %d; want %q and its digest", out, code, ref)
	}
	out, code = berthOut(t, "sandbox", "create", "--image", ref, "--user", "1000:100", "--env", "A=b", "--idle-timeout", "1m", "--workdir", "/w")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("berth sandbox create = %q, exit %d", out, code)
	}
	t.Cleanup(func() { berthOut(t, "sandbox", "rm", id) })
	got := run(t, id, "sh", "-c", `id -u; id -g; pwd; echo $A`)
	if want := "1000\n100\n/w\nb\n"; string(got.GetStdout()) != want {
		t.Errorf("in the CLI-created sandbox: %q (stderr %q), want %q", got.GetStdout(), got.GetStderr(), want)
	}
	out, code = berthOut(t, "sandbox", "keepalive", id, "--hold", "10m")
	if code != 0 || !strings.Contains(out, "idle expires") || !strings.Contains(out, "lifetime ends") {
		t.Errorf("berth sandbox keepalive = %q, exit %d", out, code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if until := g.GetSandbox().GetIdleExpiresAt().AsTime(); time.Until(until) < 9*time.Minute {
		t.Errorf("idle_expires_at %v after a 10m hold, want about 10 minutes from now", until)
	}
	if out, code = berthOut(t, "image", "rm", ref); code != 0 || out != ref+"\n" {
		t.Errorf("berth image rm = %q, exit %d", out, code)
	}
	if _, code = berthOut(t, "image", "rm", ref); code != 125 {
		t.Errorf("berth image rm of a deleted image: exit %d, want 125", code)
	}
}
