package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/quiesce"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// counterLoop counts in a shell variable, writing each value to
// /workspace/count: only the process's memory knows where it stands.
const counterLoop = "i=0; while :; do i=$((i+1)); echo $i >/workspace/count; sleep 0.1; done"

// readCount returns the counter loop's last value, through sandboxes (a
// Run: it wakes a hibernated sandbox). The loop truncates the file before
// each write: an empty read is read again (bounded).
func readCount(t *testing.T, ctx context.Context, sandboxes berthv1.SandboxServiceClient, id string) int {
	t.Helper()
	var out []byte
	for range 50 {
		resp, err := sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/count"}}})
		if err != nil {
			t.Fatalf("read the counter: %v", err)
		}
		if out = resp.GetStdout(); len(out) > 0 {
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the counter %q: %v", out, err)
	}
	return n
}

// execState returns the state ListExecs reports for exec execID of
// sandbox id (a call that wakes a hibernated sandbox); unspecified when it
// is not listed.
func execState(t *testing.T, ctx context.Context, sandboxes berthv1.SandboxServiceClient, id, execID string) berthv1.ExecState {
	t.Helper()
	execs, err := sandboxes.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range execs.GetExecs() {
		if x.GetExecId() == execID {
			return x.GetState()
		}
	}
	return berthv1.ExecState_EXEC_STATE_UNSPECIFIED
}

// hostRSS returns the resident memory, in bytes, of the host processes
// of sandbox id (hostProcessesOf: its shim, and the sentry and gofer it
// runs) and of its task pid.
func hostRSS(id string, pid uint32) uint64 {
	var sum uint64
	seen := map[string]bool{}
	pids := hostProcessesOf(id, pid)
	for _, p := range pids {
		p = strings.Fields(p)[0]
		seen[p] = true
	}
	// The sentry and gofer are the shim's descendants.
	for changed := true; changed; {
		changed = false
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if seen[e.Name()] {
				continue
			}
			stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if err != nil {
				continue
			}
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(f) > 1 && seen[f[1]] {
				seen[e.Name()], changed = true, true
			}
		}
	}
	for p := range seen {
		status, _ := os.ReadFile(filepath.Join("/proc", p, "status"))
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				sum += kb << 10
			}
		}
	}
	return sum
}

// signalAgentAsWorkload has a process of sandbox id send its PID 1 (the
// agent) SIGUSR1 and SIGUSR2 — which quiesced and woke the agent before
// berth asked it by RPC — and checks that the agent still answers and
// made no quiesce mark: the signals change nothing.
func signalAgentAsWorkload(t *testing.T, ctx context.Context, sandboxes berthv1.SandboxServiceClient, stateDir, id string) {
	t.Helper()
	resp, err := sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "kill -USR1 1 && kill -USR2 1 && kill -USR1 1 && echo sent"}})
	if err != nil || string(resp.GetStdout()) != "sent\n" {
		t.Fatalf("the workload's signals to its PID 1: %q %q, %v; want them sent", resp.GetStdout(), resp.GetStderr(), err)
	}
	for i := range 3 {
		short, cancel := context.WithTimeout(ctx, time.Minute)
		resp, err := sandboxes.Run(short, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "here"}}})
		cancel()
		if err != nil || string(resp.GetStdout()) != "here\n" {
			t.Fatalf("Run %d after the workload signalled its agent: %q, %v; want the agent serving", i, resp.GetStdout(), err)
		}
	}
	if _, err := os.Lstat(filepath.Join(stateDir, "s", id, "run", quiesce.Mark)); !os.IsNotExist(err) {
		t.Errorf("the quiesce mark after the workload's signals: %v, want none", err)
	}
}

// startGVisorBerthd starts a berthd binary that runs gVisor sandboxes
// (agent ready timeout 2 minutes: a restore under load takes seconds) on
// a namespace of its own named name, with the base image imported, and
// returns it with the flags that start it again.
func startGVisorBerthd(t *testing.T, name string) (*berthEnv, *berthdProc, []string) {
	t.Helper()
	e := newBinaryEnv(t, name)
	flags := []string{"--gvisor-binary", filepath.Join(env.repo, "scripts", "runsc-berth"), "--agent-ready-timeout", "2m"}
	p := startBerthd(t, e, flags...)
	e.importBase(t)
	return e, p, flags
}

// holdHostSocket has gVisor sandbox id's workload listen on a unix
// socket bound on the host (runsc --host-uds=all: testdata/unixlisten on
// /workspace/held.sock), which runsc cannot checkpoint, and returns the
// listener's exec id once the socket is there.
func holdHostSocket(t *testing.T, id string) string {
	t.Helper()
	svc := env.sandboxes
	installProgram(t, dialClient(t, env.berthdAddr), id, "unixlisten", "/workspace/unixlisten")
	holder := startDetachedIn(t, svc, id, "/workspace/unixlisten", "/workspace/held.sock")
	if !poll(time.Minute, func() bool {
		return shellOut(t, svc, id, "test -S /workspace/held.sock && echo yes || true") == "yes\n"
	}) {
		t.Fatal("the workload's socket /workspace/held.sock never appeared")
	}
	return holder
}

// TestHibernateGVisorMemory hibernates a gVisor sandbox running a counter
// loop whose count lives in a shell variable: the answer says MEMORY_KEPT,
// containerd holds no task and no host process of the sandbox is left
// (shim, sentry, gofer: its host memory released); berthd is killed and
// started again; the next Run wakes it by restoring the checkpoint: the
// counter goes on from where it stopped (not from 1), the loop's exec id
// is still known and running, the agent's boot id is the same, the file
// written before is there. Before the hibernation and after the wake the
// workload signals its agent SIGUSR1 and SIGUSR2: nothing changes
// (signalAgentAsWorkload).
func TestHibernateGVisorMemory(t *testing.T) {
	needGVisor(t)
	e, p1, gvisorFlags := startGVisorBerthd(t, "hgm")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.GetSandbox()
	id := sb.GetId()
	if _, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/workspace/kept"}}); err != nil {
		t.Fatal(err)
	}
	loop := startDetachedIn(t, e.sandboxes, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, e.sandboxes, id); return before >= 3 }) {
		t.Fatalf("the counter before the hibernation: %d, want it counting", before)
	}
	signalAgentAsWorkload(t, ctx, e.sandboxes, e.stateDir, id)
	old, err := e.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rss := hostRSS(id, old.TaskPID)
	began := time.Now()
	resp, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("HibernateSandbox: %v", err)
	}
	t.Logf("hibernated in %v; host RSS of the sandbox before: %d KiB", time.Since(began), rss>>10)
	if resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_MEMORY_KEPT || !strings.Contains(resp.GetDescription(), "memory kept") {
		t.Fatalf("HibernateSandbox of a gVisor sandbox: %v %q, want MEMORY_KEPT", resp.GetHibernation(), resp.GetDescription())
	}
	hibernated(t, ctx, e, id, old.TaskPID)
	if after := hostRSS(id, old.TaskPID); after != 0 {
		t.Errorf("host RSS of the hibernated sandbox: %d KiB, want 0", after>>10)
	}
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e, gvisorFlags...)
	hibernated(t, ctx, e, id, 0)

	began = time.Now()
	woken := readCount(t, ctx, e.sandboxes, id)
	t.Logf("woken (restored) in %v", time.Since(began))
	if woken < before {
		t.Errorf("the counter after the wake: %d, want at least %d (where it stood)", woken, before)
	}
	var later int
	if !poll(time.Minute, func() bool { later = readCount(t, ctx, e.sandboxes, id); return later > woken }) {
		t.Errorf("the counter after the wake: %d then %d, want it counting on", woken, later)
	}
	got, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil || got.GetSandbox().GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId() {
		t.Errorf("agent boot id after the wake: %q, %v; want %q (the same agent, restored)", got.GetSandbox().GetRuntime().GetAgentBootId(), err, sb.GetRuntime().GetAgentBootId())
	}
	if state := execState(t, ctx, e.sandboxes, id, loop); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the loop's exec %s after the wake: %v, want RUNNING", loop, state)
	}
	if resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/kept"}}}); err != nil || string(resp.GetStdout()) != "kept\n" {
		t.Errorf("the file written before the hibernation: %q, %v; want kept", resp.GetStdout(), err)
	}
	for _, left := range []string{"checkpoint", "wake-token", "run/" + agentproof.SecretFile, "run/" + quiesce.Wake} {
		if _, err := os.Lstat(filepath.Join(e.stateDir, "s", id, left)); !os.IsNotExist(err) {
			t.Errorf("%s after the wake: %v, want it removed (the secret: never written for a restored agent)", left, err)
		}
	}
	signalAgentAsWorkload(t, ctx, e.sandboxes, e.stateDir, id)
	// A second hibernation of the restored sandbox keeps its memory too.
	if resp, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil || resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_MEMORY_KEPT {
		t.Errorf("the second HibernateSandbox: %v, %v; want MEMORY_KEPT", resp.GetHibernation(), err)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestHibernateGVisorCheckpointFails: a workload holding a unix socket
// bound on the host (under runsc --host-uds=all a socket bound on the
// sandbox's root is one; here testdata/unixlisten listening in
// /workspace) cannot be checkpointed ("Cannot save endpoint with bound
// host socket"): the hibernation falls back to ending the processes, the
// answer says PROCESSES_ENDED and why, no host process of the sandbox is
// left, and the wake finds the files, the loop gone.
func TestHibernateGVisorCheckpointFails(t *testing.T) {
	needGVisor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	id := sb.GetId()
	run(t, id, "sh", "-c", "echo kept >/workspace/kept")
	holdHostSocket(t, id)
	old, err := env.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("HibernateSandbox: %v", err)
	}
	if resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED || !strings.Contains(resp.GetDescription(), "memory checkpoint failed") {
		t.Errorf("HibernateSandbox with a host socket held: %v %q, want PROCESSES_ENDED saying the checkpoint failed", resp.GetHibernation(), resp.GetDescription())
	}
	t.Logf("description: %s", resp.GetDescription())
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)
	if got := run(t, id, "cat", "/workspace/kept"); string(got.GetStdout()) != "kept\n" {
		t.Errorf("the file written before the hibernation: %q, want kept", got.GetStdout())
	}
	if n := processesLike(t, id, "^/workspace/unixlisten"); n != "0" {
		t.Errorf("the workload's agent after the wake: %q, want 0 (processes ended)", n)
	}
}

// TestRuntimeReplacedWhenHibernatedGVisor: an Exec stream attached when a
// gVisor sandbox's memory is checkpointed ends RUNTIME_REPLACED with cause
// SANDBOX_HIBERNATED (its agent closed the connection for the
// checkpoint), as under runc; the exec itself survives: after the wake
// its id is still running.
func TestRuntimeReplacedWhenHibernatedGVisor(t *testing.T) {
	needGVisor(t)
	c := dialClient(t, env.berthdAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	e, err := c.Exec(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: sb.GetId()})
	if err != nil || resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_MEMORY_KEPT {
		t.Fatalf("HibernateSandbox: %v (%s), %v; want MEMORY_KEPT", resp.GetHibernation(), resp.GetDescription(), err)
	}
	_, err = e.Wait()
	d := checkReplaced(t, err, sb.GetId(), e.ID(), sb.GetRuntime())
	if d.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_HIBERNATED {
		t.Errorf("detail = %v, want SANDBOX_HIBERNATED", d)
	}
	if state := execState(t, ctx, env.sandboxes, sb.GetId(), e.ID()); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the exec %s after the wake: %v, want RUNNING (restored)", e.ID(), state)
	}
}

// TestHibernateGVisorImageDoesNotFit: with --max-disk-bytes-per-principal
// 100 MiB, a gVisor sandbox holding a 64 MiB disk quota and a 128 MiB
// memory cap has no room for its checkpoint image (admitted as its memory
// cap): the hibernation falls back to ending its processes, the answer
// naming the principal's disk, no image is left, and the wake finds the
// files.
func TestHibernateGVisorImageDoesNotFit(t *testing.T) {
	needGVisor(t)
	e := newBinaryEnv(t, "hgf")
	p := startBerthd(t, e, "--gvisor-binary", filepath.Join(env.repo, "scripts", "runsc-berth"), "--agent-ready-timeout", "2m",
		"--max-disk-bytes-per-principal", strconv.Itoa(100<<20))
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Runtime: "gvisor",
		Resources: &berthv1.Resources{MemoryBytes: 128 << 20, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	if _, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/workspace/kept"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("HibernateSandbox: %v", err)
	}
	if resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED || !strings.Contains(resp.GetDescription(), "would not fit") || !strings.Contains(resp.GetDescription(), "disk") {
		t.Errorf("HibernateSandbox past the principal's disk: %v %q, want PROCESSES_ENDED naming the disk that the image would not fit", resp.GetHibernation(), resp.GetDescription())
	}
	t.Logf("description: %s", resp.GetDescription())
	if _, err := os.Stat(filepath.Join(e.stateDir, "s", id, "checkpoint")); !os.IsNotExist(err) {
		t.Errorf("a checkpoint image: %v, want none", err)
	}
	got, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/kept"}}})
	if err != nil || string(got.GetStdout()) != "kept\n" {
		t.Errorf("the file after the wake: %q, %v; want kept", got.GetStdout(), err)
	}
	p.signal(t, syscall.SIGTERM)
}
