package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCreateExecDelete runs echo in a fresh sandbox and checks that delete
// leaves no container, task, snapshot or host directory behind.
func TestCreateExecDelete(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := shortID("ced")
	created, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Labels: map[string]string{"team": "berth"}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	sb := created.GetSandbox()
	if sb.GetId() != id || sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING || sb.GetRuntime().GetAgentBootId() == "" || sb.GetImage() != env.image {
		t.Errorf("CreateSandbox = %v, want id %s running from %s with an agent boot id", sb, id, env.image)
	}

	got := run(t, id, "echo", "hello", "world")
	if string(got.GetStdout()) != "hello world\n" || len(got.GetStderr()) != 0 || got.GetResult().GetExitCode() != 0 {
		t.Errorf("Run(echo) = stdout %q stderr %q exit %d, want %q, \"\", 0", got.GetStdout(), got.GetStderr(), got.GetResult().GetExitCode(), "hello world\n")
	}
	got = run(t, id, "sh", "-c", "echo out; echo err >&2; exit 3")
	if string(got.GetStdout()) != "out\n" || string(got.GetStderr()) != "err\n" || got.GetResult().GetExitCode() != 3 {
		t.Errorf("Run(sh exit 3) = stdout %q stderr %q exit %d, want \"out\\n\", \"err\\n\", 3", got.GetStdout(), got.GetStderr(), got.GetResult().GetExitCode())
	}

	listed, err := env.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{LabelSelector: map[string]string{"team": "berth"}})
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	if len(listed.GetSandboxes()) != 1 || listed.GetSandboxes()[0].GetId() != id {
		t.Errorf("ListSandboxes(team=berth) = %v, want only %s", listed.GetSandboxes(), id)
	}

	hostDir := strings.TrimSuffix(env.rt.SocketPath(id), "/run/agent.sock")
	if _, err := os.Stat(hostDir); err != nil {
		t.Fatalf("host directory %s before delete: %v", hostDir, err)
	}
	if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	assertGone(t, id, hostDir)

	// Delete is idempotent; Get of a deleted sandbox is NOT_FOUND.
	if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Errorf("second DeleteSandbox: %v, want success", err)
	}
	_, err = env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxNotFound {
		t.Errorf("GetSandbox(deleted) = %v, want NOT_FOUND with reason %s", err, rpcstatus.ReasonSandboxNotFound)
	}
}

// assertGone checks containerd directly: no container, task or snapshot of
// id, and no host directory.
func assertGone(t *testing.T, id, hostDir string) {
	t.Helper()
	client, err := containerd.New(env.containerd)
	if err != nil {
		t.Fatalf("connect to containerd: %v", err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), env.namespace)
	if _, err := client.LoadContainer(ctx, id); err == nil {
		t.Errorf("container %s still exists after delete", id)
	}
	tasks, err := client.TaskService().List(ctx, nil)
	if err != nil {
		t.Fatalf("list tasks: %v", err)
	}
	for _, task := range tasks.GetTasks() {
		if task.GetID() == id {
			t.Errorf("task %s still exists after delete", id)
		}
	}
	if _, err := client.SnapshotService("overlayfs").Stat(ctx, id); err == nil {
		t.Errorf("snapshot %s still exists after delete", id)
	}
	if _, err := os.Stat(hostDir); !os.IsNotExist(err) {
		t.Errorf("host directory %s after delete: stat error %v, want not-exist", hostDir, err)
	}
}

// TestSandboxSecurityDefaults checks the defaults of SPEC.md section 6: only
// a loopback interface, no capabilities, no_new_privs, seccomp filtering,
// and the pids limit in force.
func TestSandboxSecurityDefaults(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{PidsLimit: 64}})

	if got := run(t, sb.GetId(), "ls", "/sys/class/net"); string(got.GetStdout()) != "lo\n" {
		t.Errorf("network interfaces = %q (stderr %q), want only \"lo\\n\"", got.GetStdout(), got.GetStderr())
	}

	st := run(t, sb.GetId(), "cat", "/proc/self/status")
	fields := map[string]string{}
	for _, line := range strings.Split(string(st.GetStdout()), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	for k, want := range map[string]string{
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2",
	} {
		if fields[k] != want {
			t.Errorf("/proc/self/status %s = %q, want %q", k, fields[k], want)
		}
	}

	// Starting 100 background sleeps under a limit of 64 must fail: ash
	// reports "can't fork" and gives up.
	got := run(t, sb.GetId(), "sh", "-c", "for i in $(seq 100); do sleep 5 & done; echo all started")
	if !strings.Contains(string(got.GetStderr()), "can't fork") || strings.Contains(string(got.GetStdout()), "all started") {
		t.Errorf("100 processes under pids_limit 64: stdout %q stderr %q, want a fork failure", got.GetStdout(), got.GetStderr())
	}
	if sb.GetResources().GetPidsLimit() != 64 {
		t.Errorf("CreateSandbox resources = %v, want pids_limit 64", sb.GetResources())
	}
}

// TestConcurrentSandboxes runs commands in two sandboxes at once and checks
// that each sees only its own output and hostname.
func TestConcurrentSandboxes(t *testing.T) {
	need(t)
	a := newSandbox(t, nil)
	b := newSandbox(t, nil)
	var wg sync.WaitGroup
	for _, sb := range []*berthv1.Sandbox{a, b} {
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{
					ShellCommand: "for i in $(seq 200); do echo $(hostname); done",
				}})
				if err != nil {
					t.Errorf("Run in %s: %v", sb.GetId(), err)
					return
				}
				want := strings.Repeat(sb.GetId()+"\n", 200)
				if string(resp.GetStdout()) != want {
					t.Errorf("Run in %s: stdout has %d bytes, want %d lines of %q", sb.GetId(), len(resp.GetStdout()), 200, sb.GetId())
				}
			}()
		}
	}
	wg.Wait()
}

// TestErrors checks the codes and reasons of requests that cannot succeed.
func TestErrors(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tests := []struct {
		name       string
		call       func() error
		wantCode   codes.Code
		wantReason string
	}{
		{"unknown sandbox", func() error {
			_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: "no-such-sandbox", Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
			return err
		}, codes.NotFound, rpcstatus.ReasonSandboxNotFound},
		{"missing image", func() error {
			_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: "berth.dev/missing:latest"})
			return err
		}, codes.NotFound, rpcstatus.ReasonImageNotFound},
		{"bad sandbox id", func() error {
			_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "Bad_ID", Image: env.image})
			return err
		}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument},
		{"reserved label", func() error {
			_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Labels: map[string]string{"berth.dev/x": "y"}})
			return err
		}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument},
		{"empty image", func() error {
			_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{})
			return err
		}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != tt.wantCode || rpcstatus.Reason(err) != tt.wantReason || status.Convert(err).Message() == "" {
				t.Errorf("got %v (reason %q), want code %v reason %s and a message", err, rpcstatus.Reason(err), tt.wantCode, tt.wantReason)
			}
		})
	}
}

// TestResourceLimits checks that CPU and memory caps reach the sandbox's
// cgroup (read on the host: cgroup v1 paths /sys/fs/cgroup/<controller>/
// <namespace>/<id>/, see RUNTIME-NOTES.md; on cgroup v2 the task's own
// cgroup, from /proc/<pid>/cgroup) and are reported back.
func TestResourceLimits(t *testing.T) {
	need(t)
	const mem = 64 << 20
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{CpuMillis: 500, MemoryBytes: mem}})
	if r := sb.GetResources(); r.GetCpuMillis() != 500 || r.GetMemoryBytes() != mem {
		t.Errorf("CreateSandbox resources = %v, want cpu_millis 500, memory_bytes %d", r, mem)
	}
	var files map[string]string
	switch {
	case fileExists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
		files = map[string]string{
			"memory/" + env.namespace + "/" + sb.GetId() + "/memory.limit_in_bytes":       "67108864",
			"memory/" + env.namespace + "/" + sb.GetId() + "/memory.memsw.limit_in_bytes": "67108864",
			"cpu/" + env.namespace + "/" + sb.GetId() + "/cpu.cfs_quota_us":               "50000",
			"cpu/" + env.namespace + "/" + sb.GetId() + "/cpu.cfs_period_us":              "100000",
		}
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.GetRuntime().GetTaskPid()))
		if err != nil {
			t.Fatal(err)
		}
		path, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "0::")
		if !ok {
			t.Fatalf("/proc/%d/cgroup = %q, want one cgroup v2 line", sb.GetRuntime().GetTaskPid(), b)
		}
		files = map[string]string{
			path + "/memory.max":      "67108864",
			path + "/memory.swap.max": "0",
			path + "/cpu.max":         "50000 100000",
		}
	default:
		e2e.Missing(t, "neither cgroup v1 controllers nor cgroup v2 at /sys/fs/cgroup")
	}
	for file, want := range files {
		b, err := os.ReadFile("/sys/fs/cgroup/" + file)
		if err != nil {
			t.Errorf("read %s: %v", file, err)
			continue
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{CpuMillis: 1 << 40}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateSandbox(cpu_millis 2^40) = %v, want INVALID_ARGUMENT", err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
