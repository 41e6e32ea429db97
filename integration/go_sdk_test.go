package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
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
