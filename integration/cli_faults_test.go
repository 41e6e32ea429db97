package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
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

// TestCLIHangup: killing or hanging up `berth exec -t` left the remote
// shell running until its timeout, keeping its sandbox from idling out
// (issue 12). berthd now sends SIGHUP to the exec's process group when the
// caller of a -t exec goes away, as sshd does; --detach-on-hangup keeps the
// old behavior.
func TestCLIHangup(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The script says it is ready once its trap is set: a SIGHUP before
	// that would kill the shell without a trace.
	script := `trap "echo hup >> /workspace/hup-$0; exit 0" HUP; : > /workspace/ready-$0; sleep 600 & wait`
	catFile := func(t *testing.T, name string) string {
		return string(run(t, id, "sh", "-c", "cat /workspace/"+name+" 2>/dev/null; true").GetStdout())
	}
	exists := func(t *testing.T, name string) bool {
		return string(run(t, id, "sh", "-c", "test -e /workspace/"+name+" && echo yes; true").GetStdout()) == "yes\n"
	}
	waitFor := func(t *testing.T, what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: not within 2 minutes", what)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	// startExec runs berth exec -t with the script (named name) and
	// returns once the script's trap is set in the sandbox.
	startExec := func(t *testing.T, name string, flags ...string) *exec.Cmd {
		t.Helper()
		args := append([]string{"--addr", env.berthdAddr, "exec", "-t"}, flags...)
		cmd := exec.Command(env.cliBinary, append(args, id, "--", "sh", "-c", script, name)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitFor(t, name+": the script's trap set", func() bool { return exists(t, "ready-"+name) })
		return cmd
	}
	hungUp := func(t *testing.T, name string) bool { return catFile(t, "hup-"+name) == "hup\n" }
	waitHungUp := func(t *testing.T, name string) {
		t.Helper()
		waitFor(t, name+": the remote shell's SIGHUP", func() bool { return hungUp(t, name) })
	}

	t.Run("berth killed", func(t *testing.T) {
		cmd := startExec(t, "killed")
		cmd.Process.Kill()
		waitHungUp(t, "killed")
	})
	t.Run("berth killed as the exec starts", func(t *testing.T) {
		// berth is killed as soon as the agent has the exec, before or
		// about when berthd gets its Started: berthd must still hang it
		// up once it runs. The SIGHUP may then come before the trap is
		// set, so no mark is asked for: the shell must end, where it
		// would otherwise wait for its sleep of 600 s.
		name := "early"
		cmd := exec.Command(env.cliBinary, "--addr", env.berthdAddr, "exec", "-t", id, "--", "sh", "-c", script, name)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		state := func() berthv1.ExecState {
			resp, err := env.sandboxes.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range resp.GetExecs() {
				if strings.Contains(strings.Join(x.GetArgv(), " "), "; sleep 600 & wait "+name) {
					return x.GetState()
				}
			}
			return berthv1.ExecState_EXEC_STATE_UNSPECIFIED
		}
		waitFor(t, name+": the exec in the agent", func() bool { return state() != berthv1.ExecState_EXEC_STATE_UNSPECIFIED })
		cmd.Process.Kill()
		waitFor(t, name+": the remote shell's end", func() bool { return state() == berthv1.ExecState_EXEC_STATE_EXITED })
	})
	t.Run("berth killed while output flows", func(t *testing.T) {
		// berthd is then blocked sending output to the caller, not
		// waiting for the agent: the hangup must come from there too.
		name := "flowing"
		args := []string{"--addr", env.berthdAddr, "exec", "-t", id, "--", "sh", "-c",
			`trap "echo hup >> /workspace/hup-$0; exit 0" HUP; : > /workspace/ready-$0; while :; do echo flowing; done`, name}
		cmd := exec.Command(env.cliBinary, args...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		// Read nothing more once output flows: berth and berthd fill
		// their windows and berthd's send waits.
		if _, err := stdout.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, name+": the script's trap set", func() bool { return exists(t, "ready-"+name) })
		// Kill berth only once berthd (in this process) is blocked in
		// Send: killed any earlier, the hangup could come from the agent
		// side of the handler instead, and this case would prove nothing.
		waitFor(t, name+": berthd's Exec blocked sending to berth", execSendBlocked)
		cmd.Process.Kill()
		waitHungUp(t, name)
	})
	t.Run("terminal hangup", func(t *testing.T) {
		cmd := startExec(t, "hangup")
		cmd.Process.Signal(syscall.SIGHUP)
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != 129 {
			t.Errorf("berth exec -t after SIGHUP: %v, exit %d; want 129", err, cmd.ProcessState.ExitCode())
		}
		waitHungUp(t, "hangup")
	})
	t.Run("detach on hangup", func(t *testing.T) {
		cmd := startExec(t, "detached", "--detach-on-hangup")
		cmd.Process.Signal(syscall.SIGHUP)
		cmd.Wait()
		// A hangup would have come before berthd answered this round
		// trip: the handler signals as it returns.
		if hungUp(t, "detached") {
			t.Errorf("--detach-on-hangup: the remote shell got SIGHUP")
		}
		resp, err := env.sandboxes.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, x := range resp.GetExecs() {
			if x.GetState() == berthv1.ExecState_EXEC_STATE_RUNNING && strings.Contains(strings.Join(x.GetArgv(), " "), "detached") {
				running++
			}
		}
		if running != 1 {
			t.Errorf("--detach-on-hangup: %d execs of the detached shell run, want 1", running)
		}
	})
}

// TestCLIExecUserEnvDir: berth exec had no -u (issue 12); -e and -w with it.
func TestCLIExecUserEnvDir(t *testing.T) {
	need(t)
	id := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000"}).GetId()
	script := []string{"--", "sh", "-c", "id -u; id -g; echo $K; pwd"}
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{nil, "1000\n1000\n\n/workspace\n"},
		{[]string{"-u", "0"}, "0\n0\n\n/workspace\n"},
		{[]string{"-u", "root", "-e", "K=V", "-w", "/tmp"}, "0\n0\nV\n/tmp\n"},
		{[]string{"--user", "2000:3000"}, "2000\n3000\n\n/workspace\n"},
	} {
		args := append(append(append([]string{"exec"}, tt.flags...), id), script...)
		out, errOut, code := berthCLI(t, nil, args...)
		if code != 0 || out != tt.want {
			t.Errorf("berth %q = %q, %q, exit %d; want %q", args, out, errOut, code, tt.want)
		}
	}
	if _, errOut, code := berthCLI(t, nil, "exec", "-u", "nosuchuser", id, "true"); code != 125 || !strings.Contains(errOut, "process.user") {
		t.Errorf("berth exec -u nosuchuser: %q, exit %d; want 125 naming process.user", errOut, code)
	}
}

// execSendBlocked reports whether a goroutine of this process serving
// Exec (server.(*Service).Exec) waits in grpc's SendMsg: the caller
// stopped reading and the stream's flow-control window is full.
func execSendBlocked() bool {
	buf := make([]byte, 8<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "[select") && strings.Contains(g, "server.(*Service).Exec(") &&
			strings.Contains(g, "(*serverStream).SendMsg(") {
			return true
		}
	}
	return false
}
