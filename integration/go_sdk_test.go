package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestGoSDK covers the Go column of the SDK surface (client.Sandbox) against
// a real berthd, as TestPythonSDK and TestTypeScriptSDK do for theirs: the
// bot loop of examples/go/bot.go as a non-root user, typed errors, a
// timeout that really stops the command, 64 MiB streamed to a slow
// consumer (exact sha256), UploadDir/DownloadDir with symlinks and modes,
// background commands with stdin and replay, and port forwarding.
func TestGoSDK(t *testing.T) {
	e := startClientBerthd(t, "gosdk")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Setenv("BERTH_ADDR", "unix://"+e.sock)
	t.Setenv("BERTH_TOKEN", "")
	t.Setenv("BERTH_TOKEN_FILE", "")

	t.Run("bot loop", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "bot")
		build := exec.Command("go", "build", "-o", bin, "./examples/go")
		build.Dir = env.repo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./examples/go: %v\n%s", err, out)
		}
		cmd := exec.Command(bin, filepath.Join(env.repo, "examples", "python", "project"))
		cmd.Env = append(os.Environ(), "BERTH_IMAGE="+baseImage)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("examples/go/bot.go: %v\n%s", err, out)
		}
		for _, want := range []string{"FAIL: want 4", "tests: exit 1", "calc says 4\nPASS\n", "after the fix: exit 0",
			"typed error: ", "FILE_NOT_FOUND", "timeout: timed_out=true signal="} {
			if !strings.Contains(string(out), want) {
				t.Errorf("examples/go/bot.go output lacks %q:\n%s", want, out)
			}
		}
		t.Logf("examples/go/bot.go:\n%s", out)
	})

	sb, err := client.CreateSandbox(ctx, client.SandboxOptions{Image: baseImage, User: "1000:1000"})
	if err != nil {
		t.Fatalf("CreateSandbox as 1000:1000: %v", err)
	}
	defer func() {
		if err := sb.Kill(context.Background()); err != nil {
			t.Errorf("Kill: %v", err)
		}
	}()

	t.Run("non-root run and typed errors", func(t *testing.T) {
		r, err := sb.Commands.RunArgv(ctx, []string{"id", "-u"}, client.RunOptions{})
		if err != nil || r.ExitCode != 0 || string(r.Stdout) != "1000\n" {
			t.Fatalf("id -u = %+v, %v; want 1000", r, err)
		}
		r, err = sb.Commands.Run(ctx, "echo out; echo err >&2; exit 3", client.RunOptions{Env: map[string]string{"X": "1"}})
		if err != nil || r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
			t.Fatalf("exit 3 = %+v, %v", r, err)
		}
		r, err = sb.Commands.Run(ctx, "tr a-z A-Z", client.RunOptions{Stdin: strings.NewReader("from stdin")})
		if err != nil || string(r.Stdout) != "FROM STDIN" {
			t.Errorf("Run with Stdin = %+v, %v", r, err)
		}
		_, err = sb.Files.Read(ctx, "/workspace/missing.txt")
		var be *client.Error
		if !client.IsReason(err, client.ReasonFileNotFound) || !errors.As(err, &be) || be.Metadata["path"] != "/workspace/missing.txt" {
			t.Errorf("Read of a missing file = %v; want FILE_NOT_FOUND naming the path", err)
		}
		if _, err := client.ConnectSandbox(ctx, "no-such-sandbox", client.SandboxOptions{Client: sb.Client}); !client.IsReason(err, client.ReasonSandboxNotFound) {
			t.Errorf("ConnectSandbox(no-such-sandbox) = %v; want SANDBOX_NOT_FOUND", err)
		}
		_, err = sb.Commands.Run(ctx, "true", client.RunOptions{Timeout: 500 * time.Millisecond})
		if !errors.As(err, &be) || be.Code != codes.InvalidArgument || len(be.FieldViolations) == 0 || be.FieldViolations[0].Field != "start.process.timeout" {
			t.Errorf("Run with a 0.5 s timeout = %v; want InvalidArgument naming start.process.timeout", err)
		}
	})

	t.Run("timeout stops the command", func(t *testing.T) {
		start := time.Now()
		r, err := sb.Commands.Run(ctx, "echo started; sleep 30; echo late", client.RunOptions{Timeout: time.Second})
		if err != nil || !r.TimedOut || r.ExitCode == 0 || string(r.Stdout) != "started\n" {
			t.Fatalf("Run(sleep 30, Timeout 1s) = %+v, %v; want timed out after 'started'", r, err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("the timed-out run took %v", d)
		}
		// A caller's ctx that ends first kills the command too.
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if r, err := sb.Commands.Run(short, "sleep 30", client.RunOptions{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run(sleep 30) under a 1 s ctx = %+v, %v; want context.DeadlineExceeded", r, err)
		}
		var ps *client.CommandResult
		if !poll(10*time.Second, func() bool {
			ps, err = sb.Commands.Run(ctx, "ps -o args | grep -c '^sleep 30' || true", client.RunOptions{})
			return err == nil && string(ps.Stdout) == "0\n"
		}) {
			t.Errorf("sleep 30 left running after its timeout or its caller's ctx: %+v, %v", ps, err)
		}
	})

	t.Run("64 MiB to a slow consumer", func(t *testing.T) {
		const size = 64 << 20
		want := sha256.Sum256(bytes.Repeat([]byte("berth sdk\n"), size/10+1)[:size])
		h := sha256.New()
		var n, calls int
		r, err := sb.Commands.Run(ctx, "yes 'berth sdk' | head -c 67108864", client.RunOptions{NoCapture: true, OnStdout: func(b []byte) {
			h.Write(b)
			n += len(b)
			if calls++; calls%8 == 0 {
				time.Sleep(10 * time.Millisecond) // the slow consumer this test is about: gRPC flow control slows the command
			}
		}})
		if err != nil || r.ExitCode != 0 || r.DroppedBytes != 0 || len(r.Stdout) != 0 {
			t.Fatalf("Run = %+v, %v", r, err)
		}
		if n != size || !bytes.Equal(h.Sum(nil), want[:]) || r.StdoutBytes != size {
			t.Errorf("got %d bytes (result says %d), sha256 %x; want %d bytes of sha256 %x", n, r.StdoutBytes, h.Sum(nil), size, want)
		}
		t.Logf("64 MiB in %d callbacks over %v", calls, r.Duration)
	})

	t.Run("UploadDir and DownloadDir keep symlinks and modes", func(t *testing.T) {
		src := t.TempDir()
		mustWrite := func(p string, mode os.FileMode) {
			if err := os.WriteFile(filepath.Join(src, p), []byte(p+"\n"), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(src, p), mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(src, "bin"), 0o750); err != nil {
			t.Fatal(err)
		}
		mustWrite("bin/run.sh", 0o755)
		mustWrite("secret", 0o600)
		for link, target := range map[string]string{"run": "bin/run.sh", "abs": "/etc/passwd"} {
			if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
				t.Fatal(err)
			}
		}
		if err := sb.Files.UploadDir(ctx, src, "/workspace/tree"); err != nil {
			t.Fatalf("UploadDir: %v", err)
		}
		r, err := sb.Commands.Run(ctx, "cd /workspace/tree && stat -c '%n %a %F' bin bin/run.sh secret && readlink run && readlink abs && cat run", client.RunOptions{})
		want := "bin 750 directory\nbin/run.sh 755 regular file\nsecret 600 regular file\nbin/run.sh\n/etc/passwd\nbin/run.sh\n"
		if err != nil || r.ExitCode != 0 || string(r.Stdout) != want {
			t.Errorf("the uploaded tree = %+v, %v\nstdout %q, want %q", r, err, r.Stdout, want)
		}
		dst := filepath.Join(t.TempDir(), "down")
		if err := sb.Files.DownloadDir(ctx, "/workspace/tree", dst); err != nil {
			t.Fatalf("DownloadDir: %v", err)
		}
		for p, mode := range map[string]os.FileMode{"bin": 0o750 | os.ModeDir, "bin/run.sh": 0o755, "secret": 0o600} {
			fi, err := os.Lstat(filepath.Join(dst, p))
			if err != nil || fi.Mode() != mode {
				t.Errorf("downloaded %s: %v, %v; want mode %v", p, fi, err, mode)
			}
		}
		for link, target := range map[string]string{"run": "bin/run.sh", "abs": "/etc/passwd"} {
			if got, err := os.Readlink(filepath.Join(dst, link)); err != nil || got != target {
				t.Errorf("downloaded symlink %s -> %q, %v; want %q", link, got, err, target)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dst, "bin", "run.sh")); err != nil || string(b) != "bin/run.sh\n" {
			t.Errorf("downloaded bin/run.sh = %q, %v", b, err)
		}
		// A link in the sandbox that points outside is kept as a link: nothing is written through it.
		if _, err := sb.Commands.Run(ctx, "ln -s / /workspace/tree/escape", client.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := sb.Files.DownloadDir(ctx, "/workspace/tree", filepath.Join(t.TempDir(), "again")); err != nil {
			t.Errorf("DownloadDir with an absolute symlink: %v", err)
		}
	})

	t.Run("files", func(t *testing.T) {
		if _, err := sb.Files.MakeDir(ctx, "/workspace/f/sub", true); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Files.Write(ctx, "/workspace/f/a.txt", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if err := sb.Files.Rename(ctx, "/workspace/f/a.txt", "/workspace/f/sub/b.txt", false); err != nil {
			t.Fatal(err)
		}
		if fi, err := sb.Files.Stat(ctx, "/workspace/f/sub/b.txt"); err != nil || fi.GetSizeBytes() != 5 || fi.GetUid() != 1000 {
			t.Errorf("Stat = %v, %v; want 5 bytes of uid 1000", fi, err)
		}
		list, err := sb.Files.List(ctx, "/workspace/f", 2)
		var names []string
		for _, fi := range list {
			names = append(names, fi.GetDisplayPath())
		}
		if err != nil || strings.Join(names, " ") != "/workspace/f/sub /workspace/f/sub/b.txt" {
			t.Errorf("List = %v, %v", names, err)
		}
		if err := sb.Files.Remove(ctx, "/workspace/f", true); err != nil {
			t.Fatal(err)
		}
		if ok, err := sb.Files.Exists(ctx, "/workspace/f"); ok || err != nil {
			t.Errorf("Exists after Remove = %v, %v", ok, err)
		}
	})

	t.Run("background commands", func(t *testing.T) {
		var mu sync.Mutex
		var seen []byte
		h, err := sb.Commands.Start(ctx, "echo one; read x; echo got $x; echo err >&2", client.RunOptions{StdinOpen: true, OnStdout: func(b []byte) {
			mu.Lock()
			seen = append(seen, b...)
			mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		// Stdin goes after "one" has arrived, so that "got hello" is an event of its own.
		if !poll(30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return string(seen) == "one\n" && h.LastSeq() > 0
		}) {
			t.Fatalf("the background command's first output: %q", seen)
		}
		oneSeq := h.LastSeq()
		if err := h.SendStdin([]byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		if err := h.CloseStdin(); err != nil {
			t.Fatal(err)
		}
		r, err := h.Wait()
		if err != nil || r.ExitCode != 0 || string(r.Stdout) != "one\ngot hello\n" || string(r.Stderr) != "err\n" {
			t.Fatalf("background Wait = %+v, %v", r, err)
		}
		again, err := sb.Commands.Connect(ctx, h.ExecID, client.ConnectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := again.Wait(); err != nil || string(r.Stdout) != "one\ngot hello\n" {
			t.Errorf("replay = %+v, %v", r, err)
		}
		tail, err := sb.Commands.Connect(ctx, h.ExecID, client.ConnectOptions{SinceSeq: oneSeq})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := tail.Wait(); err != nil || string(r.Stdout)+string(r.Stderr) != "got hello\nerr\n" {
			t.Errorf("replay since seq %d = %+v, %v", oneSeq, r, err)
		}
		long, err := sb.Commands.StartArgv(ctx, []string{"sleep", "300"}, client.RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		long.Disconnect()
		if ok, err := sb.Commands.Kill(ctx, long.ExecID); !ok || err != nil {
			t.Fatalf("Kill = %v, %v", ok, err)
		}
		h2, err := sb.Commands.Connect(ctx, long.ExecID, client.ConnectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := h2.Wait(); err != nil || r.Signal != "SIGKILL" {
			t.Errorf("killed background command = %+v, %v; want SIGKILL", r, err)
		}
	})

	t.Run("port forward", func(t *testing.T) {
		if _, err := sb.Files.Write(ctx, "/workspace/www/index.html", []byte("hello through the forward\n"), client.WithCreateParents()); err != nil {
			t.Fatal(err)
		}
		httpd, err := sb.Commands.StartArgv(ctx, []string{"httpd", "-f", "-p", "8080", "-h", "/workspace/www"}, client.RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer httpd.Kill(context.Background())
		fwd, err := sb.Ports.Forward(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		defer fwd.Close()
		var body []byte
		ok := poll(30*time.Second, func() bool {
			resp, err := http.Get("http://" + fwd.Address + "/index.html")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			body, err = io.ReadAll(resp.Body)
			return err == nil && resp.StatusCode == 200
		})
		if !ok || string(body) != "hello through the forward\n" {
			t.Errorf("GET through the forward = %q (answered: %v)", body, ok)
		}
		closed, err := sb.Ports.Forward(ctx, 9)
		if err != nil {
			t.Fatal(err)
		}
		defer closed.Close()
		if resp, err := http.Get("http://" + closed.Address + "/"); err == nil {
			resp.Body.Close()
			t.Errorf("GET through a forward to a closed port answered %s", resp.Status)
		}
		if !poll(10*time.Second, func() bool { return client.IsReason(closed.LastError(), client.ReasonPortClosed) }) {
			t.Errorf("LastError = %v; want PORT_CLOSED", closed.LastError())
		}
	})
}

// TestGoSDKState covers the state calls of the Go SDK's Sandbox against a
// real berthd, as TestPythonSDK's test_state does for Python's: Pause
// (a NoResume call is refused SANDBOX_PAUSED and leaves it paused),
// Resume, Snapshot with labels (listed, and a sandbox made FromSnapshot
// has its files), Fork of 2 whose children write apart, the same request
// id returning the same children, and Hibernate (runc: processes ended)
// woken by a command.
func TestGoSDKState(t *testing.T) {
	e := startClientBerthd(t, "gosdkst")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kill := func(sb *client.Sandbox) {
		if err := sb.Kill(context.Background()); err != nil {
			t.Errorf("Kill %s: %v", sb.ID, err)
		}
	}
	read := func(sb *client.Sandbox, path string) string {
		t.Helper()
		b, err := sb.Files.Read(ctx, path)
		if err != nil {
			t.Fatalf("read %s in %s: %v", path, sb.ID, err)
		}
		return string(b)
	}
	write := func(sb *client.Sandbox, path, data string) {
		t.Helper()
		if _, err := sb.Files.Write(ctx, path, []byte(data)); err != nil {
			t.Fatalf("write %s in %s: %v", path, sb.ID, err)
		}
	}

	sb, err := client.CreateSandbox(ctx, client.SandboxOptions{Client: c, Image: baseImage, Labels: map[string]string{"who": "go"}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	defer kill(sb)
	write(sb, "/workspace/f", "one")

	// Pause, and a call that must not resume is refused.
	if err := sb.Pause(ctx); err != nil || sb.Info.GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("Pause = %v, state %v; want PAUSED", err, sb.Info.GetState())
	}
	if _, err := sb.Commands.Run(client.NoResume(ctx), "true", client.RunOptions{}); !client.IsReason(err, client.ReasonSandboxPaused) {
		t.Errorf("Run under NoResume on a paused sandbox = %v; want SANDBOX_PAUSED", err)
	}
	if _, err := sb.Files.Read(client.NoResume(ctx), "/workspace/f"); !client.IsReason(err, client.ReasonSandboxPaused) {
		t.Errorf("Files.Read under NoResume on a paused sandbox = %v; want SANDBOX_PAUSED", err)
	}
	if info, err := sb.Refresh(ctx); err != nil || info.GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("state after the refused calls = %v, %v; want PAUSED", info.GetState(), err)
	}
	if err := sb.Resume(ctx); err != nil || sb.Info.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("Resume = %v, state %v; want RUNNING", err, sb.Info.GetState())
	}
	if got := read(sb, "/workspace/f"); got != "one" {
		t.Errorf("/workspace/f after Resume = %q; want one", got)
	}

	// Snapshot with labels, listed with them; a sandbox from it has its files.
	step := "one-" + shortID("s")
	snap, err := sb.Snapshot(ctx, map[string]string{"step": step})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer func() {
		if err := c.DeleteSnapshot(context.Background(), snap.GetId()); err != nil {
			t.Errorf("DeleteSnapshot %s: %v", snap.GetId(), err)
		}
	}()
	if !strings.HasPrefix(snap.GetId(), "snap-") || snap.GetSandboxId() != sb.ID || snap.GetLabels()["step"] != step {
		t.Errorf("Snapshot = %v; want snap-..., of %s, labelled step=%s", snap, sb.ID, step)
	}
	snaps, err := c.ListSnapshots(ctx)
	if err != nil {
		t.Fatalf("ListSnapshots: %v", err)
	}
	listed := false
	for _, s := range snaps {
		if s.GetId() == snap.GetId() {
			listed = s.GetLabels()["step"] == step
		}
	}
	if !listed {
		t.Errorf("ListSnapshots = %v; want %s labelled step=%s", snaps, snap.GetId(), step)
	}
	write(sb, "/workspace/f", "two")
	again, err := client.CreateSandbox(ctx, client.SandboxOptions{Client: c, FromSnapshot: snap.GetId()})
	if err != nil {
		t.Fatalf("CreateSandbox FromSnapshot %s: %v", snap.GetId(), err)
	}
	if got := read(again, "/workspace/f"); got != "one" {
		t.Errorf("/workspace/f in a sandbox from the snapshot = %q; want one", got)
	}
	kill(again)

	// Fork of 2: children with the parent's files, writing apart.
	kids, err := sb.Fork(ctx, client.ForkOptions{Count: 2, Labels: map[string]string{"kid": "yes"}})
	if err != nil {
		t.Fatalf("Fork of 2: %v", err)
	}
	for _, k := range kids {
		defer kill(k)
	}
	if len(kids) != 2 || kids[0].ID == kids[1].ID || kids[0].ID == sb.ID || kids[1].ID == sb.ID {
		t.Fatalf("Fork of 2 = %v; want 2 new sandboxes", kids)
	}
	for i, k := range kids {
		if k.Client != c || k.Info.GetLabels()["who"] != "go" || k.Info.GetLabels()["kid"] != "yes" {
			t.Errorf("child %s: same Client %v, labels %v; want true, who=go kid=yes", k.ID, k.Client == c, k.Info.GetLabels())
		}
		if got := read(k, "/workspace/f"); got != "two" {
			t.Errorf("/workspace/f in child %s = %q; want two", k.ID, got)
		}
		write(k, "/workspace/f", fmt.Sprintf("kid %d", i))
	}
	if got0, got1, gotp := read(kids[0], "/workspace/f"), read(kids[1], "/workspace/f"), read(sb, "/workspace/f"); got0 != "kid 0" || got1 != "kid 1" || gotp != "two" {
		t.Errorf("/workspace/f after the children's writes: %q, %q, parent %q; want kid 0, kid 1, two", got0, got1, gotp)
	}

	// The same request id returns the same children and makes none.
	rid := shortID("gosdk-fork")
	first, err := sb.Fork(ctx, client.ForkOptions{Count: 2, RequestID: rid})
	if err != nil {
		t.Fatalf("Fork with request id %s: %v", rid, err)
	}
	for _, k := range first {
		defer kill(k)
	}
	repeat, err := sb.Fork(ctx, client.ForkOptions{Count: 2, RequestID: rid})
	if err != nil {
		t.Fatalf("Fork again with request id %s: %v", rid, err)
	}
	if len(first) != 2 || len(repeat) != 2 || repeat[0].ID != first[0].ID || repeat[1].ID != first[1].ID {
		t.Errorf("Fork twice with request id %s = %v then %v; want the same 2 children", rid, sandboxIDs(first), sandboxIDs(repeat))
	}
	if _, err := sb.Fork(ctx, client.ForkOptions{Count: 1, RequestID: rid}); !client.IsReason(err, client.ReasonSandboxExists) {
		t.Errorf("Fork with request id %s and another count = %v; want SANDBOX_EXISTS", rid, err)
	}

	// Hibernate (runc: processes end, files stay); a command wakes it.
	hib, err := sb.Hibernate(ctx)
	if err != nil || hib != berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED || sb.Info.GetState() != berthv1.SandboxState_SANDBOX_STATE_HIBERNATED {
		t.Fatalf("Hibernate = %v, %v, state %v; want PROCESSES_ENDED, HIBERNATED", hib, err, sb.Info.GetState())
	}
	if _, err := sb.Commands.Run(client.NoResume(ctx), "true", client.RunOptions{}); !client.IsReason(err, client.ReasonSandboxHibernated) {
		t.Errorf("Run under NoResume on a hibernated sandbox = %v; want SANDBOX_HIBERNATED", err)
	}
	r, err := sb.Commands.Run(ctx, "cat /workspace/f", client.RunOptions{})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "two" {
		t.Errorf("Run after Hibernate = %+v, %v; want two", r, err)
	}
	if info, err := sb.Refresh(ctx); err != nil || info.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after the waking command = %v, %v; want RUNNING", info.GetState(), err)
	}
}

func sandboxIDs(sbs []*client.Sandbox) []string {
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.ID
	}
	return ids
}
