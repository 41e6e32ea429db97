package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// hostProcessesOf returns the host pids whose command line names sandbox
// id as a containerd shim's -id argument, or is pid itself: what of the
// sandbox still holds host memory.
func hostProcessesOf(id string, pid uint32) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if pid != 0 && e.Name() == strconv.Itoa(int(pid)) {
			found = append(found, e.Name()+" (the old task)")
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte("\x00-id\x00"+id+"\x00")) {
			found = append(found, e.Name()+" ("+strings.ReplaceAll(string(cmd), "\x00", " ")+")")
		}
	}
	return found
}

// processesLike counts the processes of sandbox id whose command line
// matches the grep pattern.
func processesLike(t *testing.T, id, pattern string) string {
	t.Helper()
	ps := run(t, id, "sh", "-c", "ps -o args | grep -c '"+pattern+"' || true")
	return strings.TrimSpace(string(ps.GetStdout()))
}

// hibernated checks that sandbox id is hibernated: containerd holds no
// task for it, no host process of it is left (its task's, whose host pid
// was pid, nor its shim), and GetSandbox says HIBERNATED.
func hibernated(t *testing.T, ctx context.Context, e *berthEnv, id string, pid uint32) {
	t.Helper()
	hibernatedIn(t, ctx, e.rt, e.sandboxes, id, pid)
}

// hibernatedIn is hibernated with rt and sandboxes.
func hibernatedIn(t *testing.T, ctx context.Context, rt *runtime.Runtime, sandboxes berthv1.SandboxServiceClient, id string, pid uint32) {
	t.Helper()
	rec, err := rt.Get(ctx, id)
	if err != nil {
		t.Fatalf("containerd's record of the hibernated sandbox: %v, want it kept", err)
	}
	if rec.TaskPID != 0 || rec.Running || rec.Paused || !rec.Hibernated {
		t.Errorf("containerd's record: task pid %d, running %v, paused %v, hibernated %v; want no task, hibernated",
			rec.TaskPID, rec.Running, rec.Paused, rec.Hibernated)
	}
	var left []string
	if !poll(10*time.Second, func() bool { left = hostProcessesOf(id, pid); return len(left) == 0 }) {
		t.Errorf("host processes of the hibernated sandbox: %v, want none", left)
	}
	got, err := sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil || got.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_HIBERNATED {
		t.Errorf("GetSandbox of the hibernated sandbox: %v, %v; want HIBERNATED", got.GetSandbox().GetState(), err)
	}
}

// TestHibernate hibernates a runc sandbox that wrote a file and runs a
// background process: the answer says what happened (processes ended,
// filesystem kept), containerd holds no task and no host process of the
// sandbox is left, GetSandbox, ListSandboxes and `berth sandbox ls` say
// HIBERNATED; a Run with berth-no-resume fails SANDBOX_HIBERNATED and
// leaves it so; a plain Run wakes it with a new agent (new boot id), the
// file is there, the old exec id is STALE_HANDLE; hibernating twice
// succeeds; the CLI hibernates; DeleteSandbox removes a hibernated
// sandbox.
func TestHibernate(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := newSandbox(t, nil)
	id := sb.GetId()
	if _, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, ExecId: "before",
		Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/workspace/kept"}}); err != nil {
		t.Fatal(err)
	}
	startDetached(t, id, "sleep", "1000")
	if n := processesLike(t, id, "^sleep 1000"); n != "1" {
		t.Fatalf("sleep processes before the hibernation: %q, want 1", n)
	}
	old, err := env.rt.Get(ctx, id)
	if err != nil || old.TaskPID == 0 {
		t.Fatalf("sandbox before: task pid %d, %v", old.TaskPID, err)
	}
	if shim := hostProcessesOf(id, 0); len(shim) == 0 {
		t.Fatalf("no containerd shim naming sandbox %s before the hibernation: the check after it would prove nothing", id)
	}

	resp, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("HibernateSandbox: %v", err)
	}
	if resp.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_HIBERNATED ||
		resp.GetHibernation() != berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED ||
		!strings.Contains(resp.GetDescription(), "processes ended, filesystem kept") {
		t.Errorf("HibernateSandbox answered state %v, hibernation %v, %q; want HIBERNATED, PROCESSES_ENDED, \"processes ended, filesystem kept\"",
			resp.GetSandbox().GetState(), resp.GetHibernation(), resp.GetDescription())
	}
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)
	list, err := env.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSandboxes() {
		if s.GetId() == id && s.GetState() != berthv1.SandboxState_SANDBOX_STATE_HIBERNATED {
			t.Errorf("ListSandboxes: %v, want HIBERNATED", s.GetState())
		}
	}
	if out, _, code := berthCLI(t, nil, "sandbox", "ls"); code != 0 || !strings.Contains(lineOf(out, id), " hibernated ") {
		t.Errorf("berth sandbox ls: line %q (exit %d), want hibernated", lineOf(out, id), code)
	}
	if _, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Errorf("HibernateSandbox of a hibernated sandbox: %v, want success", err)
	}

	_, err = env.sandboxes.Run(client.NoResume(ctx), &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonSandboxHibernated, "")
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, 0)

	got := run(t, id, "cat", "/workspace/kept")
	if string(got.GetStdout()) != "kept\n" {
		t.Errorf("the file written before the hibernation: %q, want kept", got.GetStdout())
	}
	after, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING ||
		after.GetSandbox().GetRuntime().GetAgentBootId() == sb.GetRuntime().GetAgentBootId() {
		t.Errorf("after the waking Run: state %v, boot id %s (before %s); want RUNNING with a new agent",
			after.GetSandbox().GetState(), after.GetSandbox().GetRuntime().GetAgentBootId(), sb.GetRuntime().GetAgentBootId())
	}
	if n := processesLike(t, id, "^sleep 1000"); n != "0" {
		t.Errorf("sleep processes after the wake: %q, want 0 (processes ended)", n)
	}
	_, err = env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, ExecId: "before", Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonStaleHandle, "")

	if out, stderr, code := berthCLI(t, nil, "sandbox", "hibernate", id); code != 0 || out != id+"\n" {
		t.Fatalf("berth sandbox hibernate: %q, exit %d, %s", out, code, stderr)
	}
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, 0)
	// newSandbox's cleanup deletes it, hibernated; check it is gone.
	if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("DeleteSandbox of a hibernated sandbox: %v", err)
	}
	if _, err := env.rt.Get(ctx, id); err == nil {
		t.Errorf("the hibernated sandbox's container after DeleteSandbox: still there")
	}
}

// TestHibernatePausedRaces hibernates a paused sandbox, then sends eight
// Runs at once: every one succeeds, all in the one new runtime (the
// sandbox was woken once).
func TestHibernatePausedRaces(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	if _, err := env.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	old, err := env.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("HibernateSandbox of a paused sandbox: %v", err)
	}
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Run %d of a hibernated sandbox: %v", i, err)
		}
	}
	rec, err := env.rt.Get(ctx, id)
	if err != nil || !rec.Running {
		t.Fatalf("after the Runs: running %v, %v", rec.Running, err)
	}
	got, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	run(t, id, "true")
	again, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil || again.GetSandbox().GetRuntime().GetAgentBootId() != got.GetSandbox().GetRuntime().GetAgentBootId() {
		t.Errorf("agent boot id %s after another Run, was %s (%v): woken more than once",
			again.GetSandbox().GetRuntime().GetAgentBootId(), got.GetSandbox().GetRuntime().GetAgentBootId(), err)
	}
}

// TestIdleActionHibernate: a sandbox created with idle_action HIBERNATE
// is hibernated (not removed) at its idle timeout, and the next call
// wakes it with its files.
func TestIdleActionHibernate(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{IdleTimeout: durationpb.New(2 * time.Second), IdleAction: berthv1.IdleAction_IDLE_ACTION_HIBERNATE})
	if sb.GetIdleAction() != berthv1.IdleAction_IDLE_ACTION_HIBERNATE {
		t.Errorf("idle_action %v, want HIBERNATE", sb.GetIdleAction())
	}
	id := sb.GetId()
	run(t, id, "sh", "-c", "echo idle >/workspace/idle")
	waitFor(t, 20*time.Second, "the idle sandbox hibernated", func() bool {
		rec, err := env.rt.Get(ctx, id)
		if err != nil {
			t.Fatalf("idle sandbox with idle_action HIBERNATE: %v, want it kept", err)
		}
		return rec.Hibernated && rec.TaskPID == 0 // marked first, then the task removed
	})
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, 0)
	if got := run(t, id, "cat", "/workspace/idle"); string(got.GetStdout()) != "idle\n" {
		t.Errorf("Run after the idle hibernation: %q, want idle", got.GetStdout())
	}
	if st := sandboxState(t, ctx, id); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after the waking Run: %v, want RUNNING", st)
	}
}

// TestHibernateSurvivesRestart: a hibernated sandbox (no task) is kept
// across a berthd restart (SIGKILL), not removed as an orphan: the new
// berthd reports HIBERNATED, the next Run wakes it with its files, and
// DeleteSandbox removes it.
func TestHibernateSurvivesRestart(t *testing.T) {
	need(t)
	e, p1, id := startBerthdWithSandbox(t, "hz", "hib-rs")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/workspace/kept"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e)
	hibernated(t, ctx, e, id, 0)
	resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/kept"}}})
	if err != nil || string(resp.GetStdout()) != "kept\n" {
		t.Errorf("Run after the restart: %q, %v; want kept", resp.GetStdout(), err)
	}
	if _, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestHibernateNetwork: a sandbox with a network keeps its address across
// a hibernation and the wake (its network namespace is kept).
func TestHibernateNetwork(t *testing.T) {
	need(t)
	ne := newNetEnv(t, "hnet")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := ne.create(t, egress("10.99.0.0/16"))
	addr := sb.GetNetworkAddress()
	if out, code := ne.sh(t, sb.GetId(), "ip -4 -o addr"); code != 0 || !strings.Contains(out, " "+addr+"/") {
		t.Fatalf("addresses before: %q (exit %d), want %s", out, code, addr)
	}
	if _, err := ne.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	hibernated(t, ctx, ne.berthEnv, sb.GetId(), 0)
	if out, code := ne.sh(t, sb.GetId(), "ip -4 -o addr"); code != 0 || !strings.Contains(out, " "+addr+"/") {
		t.Errorf("addresses after the wake: %q (exit %d), want %s", out, code, addr)
	}
	got, err := ne.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
	if err != nil || got.GetSandbox().GetNetworkAddress() != addr {
		t.Errorf("network_address after the wake: %q, %v; want %s", got.GetSandbox().GetNetworkAddress(), err, addr)
	}
}

// TestRuntimeReplacedWhenHibernated hibernates a sandbox under a running
// exec: its stream ends RUNTIME_REPLACED with cause SANDBOX_HIBERNATED, no
// new runtime named (none is started until a call wakes it).
func TestRuntimeReplacedWhenHibernated(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(t, nil)
	e, err := c.Exec(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.HibernateSandbox(ctx, sb.GetId()); err != nil {
		t.Fatal(err)
	}
	_, err = e.Wait()
	d := checkReplaced(t, err, sb.GetId(), e.ID(), sb.GetRuntime())
	if d.GetCause() != berthv1.ReplacedCause_REPLACED_CAUSE_SANDBOX_HIBERNATED || d.GetAfter() != nil || d.GetRestarting() {
		t.Errorf("detail = %v, want SANDBOX_HIBERNATED without an after", d)
	}
}

// TestWakeAfterImageDeleted: a hibernated sandbox keeps its files; its
// image deleted (and collected) meanwhile, the next call still wakes it.
func TestWakeAfterImageDeleted(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ref = "berth.test/wake-deleted:1"
	if err := importImageAs(ctx, archivePath(), ref); err != nil {
		t.Fatal(err)
	}
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref}).GetId()
	shellOut(t, env.sandboxes, id, "echo kept >/workspace/kept")
	if _, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("HibernateSandbox: %v", err)
	}
	if _, err := env.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: ref}); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, env.namespace)
	if got := shellOut(t, env.sandboxes, id, "cat /workspace/kept"); got != "kept\n" {
		t.Errorf("woken sandbox whose image was deleted shows %q, want kept", got)
	}
}

// TestHibernateSnapshotAndFork: CreateSnapshot and ForkSandbox of a
// hibernated sandbox copy its kept files without waking it (it had no
// task to freeze; the copy used to be refused SANDBOX_NOT_RUNNING, "has no
// task"): the snapshot and the child see the file written before the
// hibernation, and the sandbox is still hibernated, with no task, after
// both.
func TestHibernateSnapshotAndFork(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	shellOut(t, env.sandboxes, id, "echo before-hibernation >/workspace/kept")
	old, err := env.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)

	snap := createSnapshotOn(t, env.sandboxes, id, nil)
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)
	if got := shellOut(t, env.sandboxes, fromSnapshotOn(t, env.sandboxes, snap.GetId()), "cat /workspace/kept"); got != "before-hibernation\n" {
		t.Errorf("a sandbox from the hibernated sandbox's snapshot reads %q, want the file written before the hibernation", got)
	}

	resp, err := env.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1})
	if err != nil {
		t.Fatalf("ForkSandbox of a hibernated sandbox: %v", err)
	}
	child := resp.GetSandboxes()[0].GetId()
	t.Cleanup(func() {
		env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: child})
	})
	if got := shellOut(t, env.sandboxes, child, "cat /workspace/kept"); got != "before-hibernation\n" {
		t.Errorf("the hibernated sandbox's fork reads %q, want the file written before the hibernation", got)
	}
	hibernatedIn(t, ctx, env.rt, env.sandboxes, id, old.TaskPID)
}

// TestWorkloadSignalsAgent: under runc too, a workload's SIGUSR1 and
// SIGUSR2 to its PID 1 change nothing (signalAgentAsWorkload), and the
// sandbox still hibernates and wakes.
func TestWorkloadSignalsAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := newSandbox(t, nil).GetId()
	signalAgentAsWorkload(t, ctx, env.sandboxes, filepath.Join(env.dir, "st"), id)
	if _, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	signalAgentAsWorkload(t, ctx, env.sandboxes, filepath.Join(env.dir, "st"), id)
}

// TestHibernateWakeAdmission: under a memory budget of 200 MiB, a
// hibernated sandbox of 128 MiB holds none of it, so a second sandbox of
// 128 MiB is created in its place; the first one's wake then does not
// fit: the Run that would wake it (and ResumeSandbox) is RESOURCE_EXHAUSTED
// FLEET_BUSY naming the memory, and the sandbox stays hibernated, its
// files intact; once the second is deleted the wake goes through.
func TestHibernateWakeAdmission(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "hwa")
	p := startBerthd(t, e, "--memory-budget-bytes", strconv.Itoa(200<<20))
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	create := func() string {
		t.Helper()
		resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Resources: &berthv1.Resources{MemoryBytes: 128 << 20}})
		if err != nil {
			t.Fatalf("CreateSandbox of 128 MiB: %v", err)
		}
		return resp.GetSandbox().GetId()
	}
	id := create()
	if _, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "echo kept >/workspace/kept"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	other := create() // in the hibernated sandbox's memory
	_, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/kept"}}})
	wantStatus(t, err, codes.ResourceExhausted, "FLEET_BUSY", "", "memory", strconv.Itoa(128<<20))
	_, err = e.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id})
	wantStatus(t, err, codes.ResourceExhausted, "FLEET_BUSY", "", "memory")
	hibernated(t, ctx, e, id, 0)
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: other}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"cat", "/workspace/kept"}}})
	if err != nil || string(resp.GetStdout()) != "kept\n" {
		t.Fatalf("Run once the memory is free: %q, %v; want the file kept", resp.GetStdout(), err)
	}
	// Awake, it holds its memory again: a third sandbox does not fit.
	_, err = e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Resources: &berthv1.Resources{MemoryBytes: 128 << 20}})
	wantStatus(t, err, codes.ResourceExhausted, "FLEET_BUSY", "", "memory")
	p.signal(t, syscall.SIGTERM)
}
