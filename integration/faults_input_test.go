package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// The observed cases of issue 15 about input: what a caller sends is never
// echoed back unbounded or raw, labels are printable text, an exec's cwd
// may not be the agent's own directory, and client numbers are bounded
// before they are summed or converted.

// maxEchoMessage is the most a status message quoting one hostile input
// may take: each echoed value is cut to a few hundred bytes.
const maxEchoMessage = 1024

// wantSafeMessage checks that err's message and ErrorInfo metadata hold no
// raw control or bidirectional formatting character and that the message
// stays under maxEchoMessage.
func wantSafeMessage(t *testing.T, what string, err error) {
	t.Helper()
	st := status.Convert(err)
	if n := len(st.Message()); n > maxEchoMessage {
		t.Errorf("%s: message is %d bytes, want at most %d: %.200q...", what, n, maxEchoMessage, st.Message())
	}
	texts := []string{st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetMetadata() map[string]string }); ok {
			for _, v := range info.GetMetadata() {
				texts = append(texts, v)
				if len(v) > maxEchoMessage {
					t.Errorf("%s: an ErrorInfo metadata value is %d bytes, want at most %d", what, len(v), maxEchoMessage)
				}
			}
		}
	}
	for _, s := range texts {
		if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }); i >= 0 {
			t.Errorf("%s: %q holds a raw control or bidi character at byte %d", what, s, i)
		}
	}
}

// TestEchoedInputBoundedAndEscaped sends a 100 KB image name, names with
// NUL, escape and bidi-override characters, and a 100 KB argv element with
// a NUL: each is refused naming its field, with a message that quotes the
// input bounded and escaped.
func TestEchoedInputBoundedAndEscaped(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	huge := strings.Repeat("a", 100<<10)
	for _, image := range []string{huge, "base\x00:latest", "base\x1b[31m:latest", "base\u202e:latest", "base latest"} {
		_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: image})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "image")
		wantSafeMessage(t, "CreateSandbox image", err)
	}
	for _, ref := range []string{huge, "localhost:5000/x\x00:1"} {
		stream, err := env.images.PullImage(ctx, &berthv1.PullImageRequest{Reference: ref})
		if err == nil {
			_, err = stream.Recv()
		}
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "reference")
		wantSafeMessage(t, "PullImage reference", err)
	}
	for _, name := range []string{huge, "gone\x00\x1b[2J:latest"} {
		_, err := env.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: name})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "name")
		wantSafeMessage(t, "DeleteImage name", err)
	}
	// A name that is valid but missing is NOT_FOUND, quoted safely.
	_, err := env.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: "berth.dev/missing" + strings.Repeat("x", 200) + ":latest"})
	if code := status.Code(err); code != codes.NotFound && err != nil {
		t.Errorf("DeleteImage of a missing image: %v, want OK or NOT_FOUND", err)
	}

	id := newSandbox(t, nil).GetId()
	_, err = env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", huge + "\x00\x1b]0;pwned\x07"}}})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "process.argv[1]")
	wantSafeMessage(t, "Run argv", err)
	_, err = env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "/no\x1b[2Jwhere"}})
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid, "")
	wantSafeMessage(t, "Run cwd", err)
}

// TestLabelsPrintable: label keys are printable ASCII without spaces and
// values printable text (no control or format characters, bidirectional
// overrides included); a label selector follows the same rule.
func TestLabelsPrintable(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := []map[string]string{
		{"team\x00": "a"},
		{"team": "a\x00b"},
		{"team": "line\nbreak"},
		{"team": "\x1b[31mred"},
		{"team": "evil\u202etxt.exe"},
		{"team": "a\u200fb"},
		{"te am": "a"},
		{"tëam": "a"},
		{"team": "a\u0085b"},
	}
	for _, labels := range bad {
		_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Labels: labels})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "labels")
		wantSafeMessage(t, "CreateSandbox labels", err)
		_, err = env.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{LabelSelector: labels})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "label_selector")
		wantSafeMessage(t, "ListSandboxes label_selector", err)
	}
	good := map[string]string{"team": "café ☕ — a b", "app.kubernetes.io/name": "x", "empty": ""}
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Labels: good})
	resp, err := env.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{LabelSelector: map[string]string{"team": good["team"]}})
	if err != nil || len(resp.GetSandboxes()) != 1 || resp.GetSandboxes()[0].GetId() != sb.GetId() {
		t.Errorf("ListSandboxes by a printable Unicode label = %v, %v; want just %s", resp.GetSandboxes(), err, sb.GetId())
	}
}

// TestExecCwdOutsideAgentMounts: Run and Exec refuse a working directory
// inside the agent's own mounts (/.berth-run, /.berth-agent), as
// CreateSandbox refuses them as a workdir, naming the field.
func TestExecCwdOutsideAgentMounts(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cwd := range []string{"/.berth-run", "/.berth-run/", "/.berth-run/sub/..", "/workspace/../.berth-run", "/.berth-agent"} {
		_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"pwd"}, Cwd: cwd}})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "process.cwd", "/.berth-")
		c := openExec(t, env.sandboxes, startReq(id, xid(t), &berthv1.ProcessSpec{Argv: []string{"pwd"}, Cwd: cwd}), 0)
		wantStatus(t, c.failure(), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start.process.cwd")
	}
	// Names that only begin alike are fine.
	got := run(t, id, "mkdir", "-p", "/workspace/.berth-run")
	if got.GetResult().GetExitCode() != 0 {
		t.Fatalf("mkdir: %v", got.GetResult())
	}
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"pwd"}, Cwd: "/workspace/.berth-run"}})
	if err != nil || string(resp.GetStdout()) != "/workspace/.berth-run\n" {
		t.Errorf("Run in /workspace/.berth-run = %q, %v", resp.GetStdout(), err)
	}
}

// TestMemoryBytesBounded: memory_bytes near 2^64 is refused by name, not
// wrapped in the memory budget's sum or passed to the container spec as a
// negative limit.
func TestMemoryBytesBounded(t *testing.T) {
	need(t)
	c := dialClient(t, startServer(t, server.Config{MemoryBudgetBytes: 300 << 20, TaskRestartLimit: -1}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range []uint64{1<<64 - 50, 1 << 63, 1<<63 - 1} {
		_, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{MemoryBytes: m}})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != codes.InvalidArgument || len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != "resources.memory_bytes" {
			t.Errorf("CreateSandbox with memory_bytes %d: %v, want INVALID_ARGUMENT naming resources.memory_bytes", m, err)
		}
	}
}
