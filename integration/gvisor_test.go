package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// needGVisor is need for a test that runs gVisor sandboxes: it also needs
// Debian's runsc, which scripts/runsc-berth runs and scripts/deps.sh
// installs. Without it the test fails under BERTH_E2E=1 and is skipped
// otherwise.
func needGVisor(t *testing.T) {
	t.Helper()
	need(t)
	if _, err := os.Stat(runscBinary); err != nil {
		if os.Getenv("BERTH_E2E") == "1" {
			t.Fatalf("BERTH_E2E=1 but gVisor cannot run: %v (scripts/deps.sh installs Debian's runsc)", err)
		}
		t.Skipf("gVisor unavailable: %v (scripts/deps.sh installs Debian's runsc)", err)
	}
}

// runscBinary is the runsc that scripts/runsc-berth runs.
const runscBinary = "/usr/bin/runsc"

// TestGVisorSandbox runs a sandbox under gVisor (runtime "gvisor"): the
// agent starts inside runsc's user-space kernel, berthd reaches it through
// its host socket and verifies it by its secret, and commands run there
// (uname reports gVisor's 4.4.0, not the host's kernel).
func TestGVisorSandbox(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	if sb.GetRuntimeName() != "gvisor" || sb.GetHostUsers() || sb.GetHostIdBase() != 0 {
		t.Errorf("sandbox runtime %q host_users %v host_id_base %d, want gvisor without a host id range", sb.GetRuntimeName(), sb.GetHostUsers(), sb.GetHostIdBase())
	}
	got := run(t, sb.GetId(), "sh", "-c", "uname -r; echo hi")
	if out := string(got.GetStdout()); out != "4.4.0\nhi\n" || got.GetResult().GetExitCode() != 0 {
		t.Errorf("uname -r; echo hi under gVisor: %q (stderr %q, exit %d), want 4.4.0 and hi", out, got.GetStderr(), got.GetResult().GetExitCode())
	}
	// gVisor's kernel ignores CLONE_PARENT: the first launcher hands its
	// process to the agent (PID 1) by exiting; the next starts come from a
	// reaping launcher (TestGVisorReapingLauncher).
	for i := range 3 {
		got = run(t, sb.GetId(), "sh", "-c", "echo x; exit 3")
		if out := string(got.GetStdout()); out != "x\n" || got.GetResult().GetExitCode() != 3 {
			t.Errorf("start %d under gVisor: %q, exit %d; want x and 3", i, out, got.GetResult().GetExitCode())
		}
	}
	// The agent read and removed berthd's secret before anything ran: a
	// workload finds it neither in the run directory nor in PID 1's
	// environment (which gVisor lets a process of the same uid read).
	got = run(t, sb.GetId(), "sh", "-c", "ls -a /.berth-run; tr '\\0' '\\n' </proc/1/environ")
	if out := string(got.GetStdout()); !strings.HasPrefix(out, ".\n..\nagent.sock\n") || strings.Contains(out, "SECRET") {
		log, _ := os.ReadFile(env.rt.LogPath(sb.GetId()))
		t.Errorf("run directory and PID 1's environment under gVisor: %q, want only agent.sock and no secret\nagent log:\n%s", out, log)
	}
}

// TestGVisorFiles runs the file service in a gVisor sandbox with a workload
// user: write, read, stat, list, rename, remove, and an Upload and
// Download of a tar with a directory, a file and a symlink (gVisor's 2022
// kernel has no openat2(2): the agent resolves names without it).
func TestGVisorFiles(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	c := dialClient(t, env.berthdAddr)
	ctx := t.Context()
	if _, err := c.WriteFile(ctx, sb.GetId(), "/workspace/a/b.txt", strings.NewReader("hello"), client.WithCreateParents()); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	var buf bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.GetId(), "/workspace/a/b.txt", &buf); err != nil || buf.String() != "hello" {
		t.Fatalf("ReadFile = %q, %v; want hello", buf.String(), err)
	}
	fi, err := c.Stat(ctx, sb.GetId(), "/workspace/a/b.txt")
	if err != nil || fi.GetSizeBytes() != 5 || fi.GetUid() != 0 {
		t.Fatalf("Stat = %v, %v; want 5 bytes owned by 0", fi, err)
	}
	if err := c.Rename(ctx, sb.GetId(), "/workspace/a/b.txt", "/workspace/a/c.txt", false); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("abc"))
	tw.WriteHeader(&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "f"})
	tw.Close()
	if _, err := c.Upload(ctx, sb.GetId(), "/workspace/up", &tarball, client.WithCreateParents()); err != nil {
		t.Fatalf("Upload: %v", err)
	}
	entries, _, err := c.ListDir(ctx, sb.GetId(), "/workspace", 3)
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.GetDisplayPath())
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "up/d/f") || !strings.Contains(got, "up/d/l") || !strings.Contains(got, "a/c.txt") {
		t.Errorf("ListDir(/workspace) = %s, want a/c.txt, up/d/f and up/d/l", got)
	}
	var out bytes.Buffer
	if _, err := c.Download(ctx, sb.GetId(), "/workspace/up", &out); err != nil || out.Len() == 0 {
		t.Errorf("Download: %d bytes, %v", out.Len(), err)
	}
	if err := c.Remove(ctx, sb.GetId(), "/workspace/up", true); err != nil {
		t.Errorf("Remove: %v", err)
	}
}

// TestGVisorWorkloadUser pins the one difference of gVisor's 2022 kernel
// for a workload user other than root: processes run as it, but the file
// service cannot act as it (that kernel has no setfsuid(2)), and says so
// with FAILED_PRECONDITION WORKLOAD_USER_UNAVAILABLE instead of acting as
// root.
func TestGVisorWorkloadUser(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor", User: "1000:1000"})
	if got := run(t, sb.GetId(), "id", "-u"); string(got.GetStdout()) != "1000\n" {
		t.Errorf("id -u under gVisor with user 1000 = %q (stderr %q), want 1000", got.GetStdout(), got.GetStderr())
	}
	c := dialClient(t, env.berthdAddr)
	_, err := c.WriteFile(t.Context(), sb.GetId(), "/workspace/f", strings.NewReader("x"))
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonAgentCannotActAsUser, "")
}

// TestGVisorFailedStartCleanup starts a gVisor sandbox whose agent cannot
// be executed (a bind-mounted file without the execute bit): runsc creates
// the container but its start fails, which leaves it "created", a state in
// which runsc cannot kill it. The create must fail and remove everything:
// the container, runsc's container state and its sandbox processes.
func TestGVisorFailedStartCleanup(t *testing.T) {
	needGVisor(t)
	notExec := filepath.Join(env.dir, "not-an-agent")
	if err := os.WriteFile(notExec, []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := env.namespace + "-gf"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := runtime.New(ctx, runtime.Config{Address: env.containerd, Namespace: ns, StateDir: filepath.Join(env.dir, "gf"),
		AgentBinary: notExec, GVisorBinary: filepath.Join(env.repo, "scripts", "runsc-berth")})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	f, err := os.Open(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := rt.ImportImage(ctx, f, ""); err != nil {
		t.Fatal(err)
	}
	err = rt.Create(ctx, runtime.SandboxSpec{ID: "gf", Image: baseImage, PidsLimit: 64, Runtime: runtime.RuntimeGVisor})
	if err == nil || !strings.Contains(err.Error(), "start task gf") || strings.Contains(err.Error(), "cleanup failed") {
		t.Fatalf("Create with an agent that cannot run = %v, want a failed start, cleaned up", err)
	}
	if _, err := rt.Get(ctx, "gf"); !errors.Is(err, runtime.ErrSandboxNotFound) {
		t.Errorf("Get after the failed create = %v, want ErrSandboxNotFound", err)
	}
	if _, err := os.Stat(filepath.Join("/run/containerd/runc", ns, "gf_sandbox:gf.state")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runsc state of gf after the failed create: %v, want none", err)
	}
	out, _ := exec.Command("pgrep", "-f", "runsc-sandbox --root=/run/containerd/runc/"+ns+" ").Output()
	if len(out) > 0 {
		t.Errorf("runsc sandbox processes of %s left: %s", ns, out)
	}
}

// TestGVisorOOM pins how a memory cap ends under gVisor: the host's OOM
// killer takes the sandbox's gVisor kernel, not one process in it, so the
// exec ends with ABORTED RUNTIME_REPLACED whose detail says oom_killed;
// berthd restarts the task and the sandbox works again.
func TestGVisorOOM(t *testing.T) {
	needGVisor(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor", Resources: &berthv1.Resources{MemoryBytes: 64 << 20}})
	c := dialClient(t, env.berthdAddr)
	_, err := c.Run(t.Context(), sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"bash", "-c", `x=$(head -c 200000000 /dev/zero | tr '\0' a); echo ${#x}`}})
	var re *client.RuntimeReplacedError
	if !errors.As(err, &re) || !re.Detail.GetOomKilled() {
		t.Fatalf("a 200 MB string in a 64 MiB gVisor sandbox: %v, want RUNTIME_REPLACED with oom_killed", err)
	}
	waitRuntime(t, c, sb.GetId(), sb.GetRuntime().GetAgentBootId())
	if got := run(t, sb.GetId(), "echo", "back"); string(got.GetStdout()) != "back\n" {
		t.Errorf("after the OOM: %q, want back", got.GetStdout())
	}
}
