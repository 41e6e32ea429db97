package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestCLIFaults pins the CLI faults of issue 12 that need a berthd; each
// case failed before its fix.
func TestCLIFaults(t *testing.T) {
	need(t)

	t.Run("rm of an unknown sandbox fails", func(t *testing.T) {
		out, errOut, code := berthCLI(t, nil, "sandbox", "rm", "cli-nosuch")
		if code != 125 || out != "" || !strings.Contains(errOut, "SANDBOX_NOT_FOUND") {
			t.Errorf("berth sandbox rm cli-nosuch = %q, %q, exit %d; want exit 125 and SANDBOX_NOT_FOUND", out, errOut, code)
		}
	})

	t.Run("an image without a tag means latest", func(t *testing.T) {
		untagged := strings.TrimSuffix(baseImage, ":latest")
		out, errOut, code := berthCLI(t, nil, "sandbox", "create", "--image", untagged, "--id", "cli-notag")
		if code != 0 || strings.TrimSpace(out) != "cli-notag" {
			t.Fatalf("berth sandbox create --image %s = %q, %q, exit %d", untagged, out, errOut, code)
		}
		t.Cleanup(func() { berthCLI(t, nil, "sandbox", "rm", "cli-notag") })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		got, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: "cli-notag"})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetSandbox().GetImage() != baseImage {
			t.Errorf("the sandbox's image is %q, want %q", got.GetSandbox().GetImage(), baseImage)
		}
	})

	t.Run("image ls shows the image's size", func(t *testing.T) {
		out, errOut, code := berthCLI(t, nil, "image", "ls")
		if code != 0 {
			t.Fatalf("berth image ls: %q, exit %d", errOut, code)
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != baseImage {
				continue
			}
			// NAME DIGEST SIZE UNIT CREATED...: the base image is about
			// 2 MiB of busybox and bash.
			n, err := strconv.ParseFloat(f[2], 64)
			if err != nil || f[3] != "MiB" || n < 1 {
				t.Errorf("berth image ls shows %s %s for %s, want at least 1 MiB:\n%s", f[2], f[3], baseImage, out)
			}
			return
		}
		t.Errorf("berth image ls does not list %s:\n%s", baseImage, out)
	})

	t.Run("-o json on list and get", func(t *testing.T) {
		sb := newSandbox(t, nil)
		run(t, sb.GetId(), "true")
		for _, args := range [][]string{{"sandbox", "ls", "-o", "json"}, {"image", "ls", "-o", "json"}, {"ps", sb.GetId(), "-o", "json"}, {"sandbox", "get", sb.GetId(), "-o", "json"}} {
			out, errOut, code := berthCLI(t, nil, args...)
			if code != 0 {
				t.Errorf("berth %q: %q, exit %d", args, errOut, code)
				continue
			}
			var v any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Errorf("berth %q printed no JSON (%v):\n%s", args, err, out)
				continue
			}
			want := map[string]string{"sandbox": `"id": "` + sb.GetId() + `"`, "image": `"contentSizeBytes": "`, "ps": `"argv": [`}[args[0]]
			if !strings.Contains(out, want) {
				t.Errorf("berth %q output lacks %s:\n%s", args, want, out)
			}
		}
		if _, errOut, code := berthCLI(t, nil, "sandbox", "ls", "-o", "yaml"); code != 125 || !strings.Contains(errOut, "want table or json") {
			t.Errorf("berth sandbox ls -o yaml: %q, exit %d; want 125 naming the formats", errOut, code)
		}
	})
}

// TestCLIRunUsesWarmPool: berth run always sent a sandbox id, so a berthd
// with a warm pool never handed it a ready sandbox (issue 12).
func TestCLIRunUsesWarmPool(t *testing.T) {
	need(t)
	e := newInProcessEnv(t, "runpool", server.Config{WarmPool: map[string]int{baseImage: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var member string
	for member == "" {
		if e.svc.WarmPoolReady(baseImage) == 1 {
			sbs, err := e.rt.List(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range sbs {
				if sb.Pooled {
					member = sb.ID
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the warm pool had no member: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	out, errOut, code := berthCLI(t, nil, "--addr", "unix://"+e.sock, "run", "--image", baseImage, "--", "hostname")
	if code != 0 || out != member+"\n" {
		t.Fatalf("berth run -- hostname = %q, %q, exit %d; want the warm-pool member %s", out, errOut, code, member)
	}
	if _, err := e.rt.Get(ctx, member); !errors.Is(err, runtime.ErrSandboxNotFound) {
		t.Errorf("after berth run, its sandbox %s: %v; want it deleted", member, err)
	}
}

// TestCLICompletion: berth completed no sandbox ids (issue 12).
func TestCLICompletion(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{SandboxId: "cli-complete-me"})
	for _, args := range [][]string{{"__complete", "exec", "cli-comp"}, {"__complete", "sandbox", "rm", "x", "cli-comp"}, {"__complete", "cat", "cli-comp"}} {
		out, errOut, code := berthCLI(t, nil, args...)
		want := sb.GetId() + "\n"
		if args[1] == "cat" {
			want = sb.GetId() + ":\n"
		}
		if code != 0 || !strings.HasPrefix(out, want) {
			t.Errorf("berth %q = %q, %q, exit %d; want it to start with %q", args, out, errOut, code, want)
		}
	}
}
