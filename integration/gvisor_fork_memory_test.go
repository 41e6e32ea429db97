package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestGVisorForkMemory: a fork with memory of a gVisor sandbox running a
// counter loop whose count lives in a shell variable gives 2 children in
// which the loop goes on from where the parent's stood (not from 1, and
// counting: the process was restored, not started anew), under the
// parent's exec id, RUNNING; each child's agent has a boot id of its own
// (neither the parent's nor its sibling's) and berthd reaches it (its
// Info proved the child's own secret); the same request id returns them
// again, and names another fork without memory; a child hibernates with
// its memory and wakes (its agent quiesced for the child's secret); their
// writes are their own; the
// parent runs on with its loop, exec and boot id, and no memory image of
// the fork is left in its host directory.
func TestGVisorForkMemory(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	parent := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	id := parent.GetId()
	shellOut(t, svc, id, "echo kept >/workspace/kept")
	loop := startDetachedIn(t, svc, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, svc, id); return before >= 10 }) {
		t.Fatalf("the counter before the fork: %d, want it counting", before)
	}
	began := time.Now()
	req := &berthv1.ForkSandboxRequest{SandboxId: id, Count: 2, Memory: true, RequestId: "memory-" + id}
	children := forkOn(t, svc, req)
	t.Logf("fork of 2 with memory took %v", time.Since(began))
	if len(children) != 2 {
		t.Fatalf("ForkSandbox made %d children, want 2", len(children))
	}
	boots := map[string]string{parent.GetRuntime().GetAgentBootId(): id}
	for _, c := range children {
		cid := c.GetId()
		boot := c.GetRuntime().GetAgentBootId()
		if other, seen := boots[boot]; seen || boot == "" {
			t.Errorf("child %s's agent boot id %q: the same as %s's; want one of its own", cid, boot, other)
		}
		boots[boot] = cid
		if c.GetRuntimeName() != "gvisor" || c.GetForkedFrom() != id {
			t.Errorf("child %s: runtime %q, forked_from %q; want gvisor, %s", cid, c.GetRuntimeName(), c.GetForkedFrom(), id)
		}
		first := readCount(t, ctx, svc, cid)
		if first < before {
			t.Errorf("child %s's counter %d, want at least %d (where the parent's stood: its memory)", cid, first, before)
		}
		var later int
		if !poll(time.Minute, func() bool { later = readCount(t, ctx, svc, cid); return later > first }) {
			t.Errorf("child %s's counter %d then %d, want it counting on (the loop restored)", cid, first, later)
		}
		if state := execState(t, ctx, svc, cid, loop); state != berthv1.ExecState_EXEC_STATE_RUNNING {
			t.Errorf("the parent's loop exec %s in child %s: %v, want RUNNING", loop, cid, state)
		}
		if got := shellOut(t, svc, cid, "cat /workspace/kept"); got != "kept\n" {
			t.Errorf("child %s's /workspace/kept %q, want kept", cid, got)
		}
	}
	// The same request again returns the same children; without memory
	// it names another fork.
	again, err := svc.ForkSandbox(ctx, req)
	if err != nil || len(again.GetSandboxes()) != 2 || again.GetSandboxes()[0].GetId() != children[0].GetId() {
		t.Errorf("the same fork again: %v, %v; want the same 2 children", again.GetSandboxes(), err)
	}
	filesOnly := &berthv1.ForkSandboxRequest{SandboxId: id, Count: 2, RequestId: req.GetRequestId()}
	if _, err := svc.ForkSandbox(ctx, filesOnly); status.Code(err) != codes.AlreadyExists || errorMeta(err)["fields"] != "memory" {
		t.Errorf("the request id again without memory: %v (fields %q), want ALREADY_EXISTS naming memory", err, errorMeta(err)["fields"])
	}
	// A child hibernates and wakes with its memory: its agent quiesces
	// for berthd's proof of the child's own secret.
	hib, err := svc.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: children[1].GetId()})
	if err != nil || hib.GetHibernation() != berthv1.Hibernation_HIBERNATION_MEMORY_KEPT {
		t.Errorf("HibernateSandbox of child %s: %v, %v; want MEMORY_KEPT", children[1].GetId(), hib.GetHibernation(), err)
	}
	if n := readCount(t, ctx, svc, children[1].GetId()); n < before {
		t.Errorf("child %s's counter after its wake: %d, want at least %d", children[1].GetId(), n, before)
	}
	shellOut(t, svc, children[0].GetId(), "echo mine >/workspace/mine")
	for _, other := range []string{id, children[1].GetId()} {
		if got := shellOut(t, svc, other, "ls /workspace/mine 2>/dev/null | wc -l"); got != "0\n" {
			t.Errorf("%s sees child %s's write: %q", other, children[0].GetId(), got)
		}
	}
	after := readCount(t, ctx, svc, id)
	var later int
	if !poll(time.Minute, func() bool { later = readCount(t, ctx, svc, id); return later > after }) || after < before {
		t.Errorf("the parent's counter: %d before the fork, %d and %d after; want it going on", before, after, later)
	}
	if state := execState(t, ctx, svc, id, loop); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the parent's loop exec %s after the fork: %v, want RUNNING", loop, state)
	}
	got, err := svc.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil || got.GetSandbox().GetRuntime().GetAgentBootId() != parent.GetRuntime().GetAgentBootId() || got.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("the parent after the fork: %v, %v; want RUNNING with boot id %s", got.GetSandbox(), err, parent.GetRuntime().GetAgentBootId())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(env.rt.SocketPath(id))), "fork-memory-*")); len(left) != 0 {
		t.Errorf("memory images left after the fork: %v", left)
	}
}

// TestForkMemoryRefused: a fork with memory of a runc sandbox, and of a
// gVisor sandbox whose workload holds a unix socket bound on the host
// (which runsc cannot checkpoint), is FAILED_PRECONDITION
// SNAPSHOT_UNSUPPORTED saying why; no child is made and the parent runs
// on as it was: its processes (the socket's holder) alive, its agent
// answering with the same boot id (the checkpoint, which this runsc
// follows with the sandbox's end when it fails, was not tried:
// runtime's hostSockets).
func TestForkMemoryRefused(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runc := newSandbox(t, nil).GetId()
	gvisorSB := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	gvisor := gvisorSB.GetId()
	holder := holdHostSocket(t, gvisor)
	before, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, parent := range []string{runc, gvisor} {
		_, err := svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: parent, Count: 1, Memory: true})
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotUnsupported {
			t.Errorf("ForkSandbox with memory of %s: %v, want FAILED_PRECONDITION %s", parent, err, rpcstatus.ReasonSnapshotUnsupported)
		}
		t.Logf("%s: %v", parent, err)
		if got := shellOut(t, svc, parent, "echo here"); got != "here\n" {
			t.Errorf("%s after the refused fork: %q, want its agent answering", parent, got)
		}
	}
	if state := execState(t, ctx, svc, gvisor, holder); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the socket's holder %s after the refused fork: %v, want RUNNING (the parent untouched)", holder, state)
	}
	if got, err := svc.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: gvisor}); err != nil || got.GetSandbox().GetRuntime().GetAgentBootId() != gvisorSB.GetRuntime().GetAgentBootId() {
		t.Errorf("the gVisor parent's agent boot id after the refused fork: %q, %v; want %q (the same task and agent)", got.GetSandbox().GetRuntime().GetAgentBootId(), err, gvisorSB.GetRuntime().GetAgentBootId())
	}
	after, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.GetSandboxes()) != len(before.GetSandboxes()) {
		t.Errorf("%d sandboxes after the refused forks, %d before: want no child left", len(after.GetSandboxes()), len(before.GetSandboxes()))
	}
}

// TestForkMemorySurvivesRestart: the children of a fork with memory
// outlive a berthd killed with SIGKILL: the next berthd adopts them (their
// agents prove the child's own secret, recorded on the container), their
// counter loops go on, their boot ids are unchanged, and they delete. A
// fork's memory image left in the parent's host directory (a berthd
// killed during the fork) is removed at the next berthd's start.
func TestForkMemorySurvivesRestart(t *testing.T) {
	needGVisor(t)
	e, p1, gvisorFlags := startGVisorBerthd(t, "fmr")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	startDetachedIn(t, e.sandboxes, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, e.sandboxes, id); return before >= 5 }) {
		t.Fatalf("the counter before the fork: %d, want it counting", before)
	}
	children := forkOn(t, e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Memory: true})
	child := children[0]
	// What a berthd killed during a fork with memory leaves: the fork's
	// image in the parent's host directory. The next berthd removes it.
	stale := filepath.Join(filepath.Dir(filepath.Dir(e.rt.SocketPath(id))), "fork-memory-fork-stale")
	if err := os.MkdirAll(filepath.Join(stale, "image"), 0o700); err != nil {
		t.Fatal(err)
	}
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e, gvisorFlags...)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a fork's memory image left by the killed berthd, after the next one's start: %v, want it removed", err)
	}
	first := readCount(t, ctx, e.sandboxes, child.GetId())
	var later int
	if first < before || !poll(time.Minute, func() bool { later = readCount(t, ctx, e.sandboxes, child.GetId()); return later > first }) {
		t.Errorf("the child's counter after berthd's restart: %d then %d, want at least %d and counting", first, later, before)
	}
	got, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: child.GetId()})
	if err != nil || got.GetSandbox().GetRuntime().GetAgentBootId() != child.GetRuntime().GetAgentBootId() {
		t.Errorf("the child's boot id after berthd's restart: %q, %v; want %q", got.GetSandbox().GetRuntime().GetAgentBootId(), err, child.GetRuntime().GetAgentBootId())
	}
	for _, sb := range []string{child.GetId(), id} {
		if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb}); err != nil {
			t.Errorf("delete %s: %v", sb, err)
		}
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestForkMemoryRefusedPaused: a paused gVisor sandbox whose workload
// holds a unix socket bound on the host is refused a fork with memory
// (FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED) and stays paused: its task
// held paused by containerd (runsc pause), not only recorded so — the
// checkpoint resumes a paused task for its agent to quiesce, and the
// refusal must pause it again — and PAUSED in GetSandbox; it resumes with
// its socket's holder RUNNING.
func TestForkMemoryRefusedPaused(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"}).GetId()
	holder := holdHostSocket(t, id)
	if _, err := svc.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Memory: true})
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotUnsupported {
		t.Errorf("ForkSandbox with memory of paused %s: %v, want FAILED_PRECONDITION %s", id, err, rpcstatus.ReasonSnapshotUnsupported)
	}
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("the paused parent after the refused fork: %v, want PAUSED", got)
	}
	if st := taskStatusOf(t, ctx, id); st != containerd.Paused {
		t.Errorf("containerd's task status of the paused parent after the refused fork: %v, want paused (runsc pause)", st)
	}
	if _, err := svc.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if state := execState(t, ctx, svc, id, holder); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the socket's holder %s after the resume: %v, want RUNNING", holder, state)
	}
	if got := shellOut(t, svc, id, "echo here"); got != "here\n" {
		t.Errorf("after the resume: %q, want its agent answering", got)
	}
}

// TestForkMemoryParentDeleted: a DeleteSandbox of the parent sent while
// its fork with memory runs (once the checkpoint image is linked for the
// fork) waits for the parent's lifecycle lock and deletes it; the fork
// either gives children that run on from the parent's memory (their
// counter loops counting) — the image they restore from is theirs, not
// taken away with the parent's directory — or fails leaving no child.
func TestForkMemoryParentDeleted(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	created, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	hostDir := filepath.Dir(filepath.Dir(env.rt.SocketPath(id)))
	startDetachedIn(t, svc, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, svc, id); return before >= 5 }) {
		t.Fatalf("the counter before the fork: %d, want it counting", before)
	}
	listed, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type forked struct {
		resp *berthv1.ForkSandboxResponse
		err  error
	}
	done := make(chan forked, 1)
	go func() {
		resp, err := svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 2, Memory: true})
		done <- forked{resp, err}
	}()
	if !poll(2*time.Minute, func() bool {
		left, _ := filepath.Glob(filepath.Join(hostDir, "fork-memory-*"))
		return len(left) > 0
	}) {
		t.Fatal("the fork's memory image never appeared in the parent's host directory")
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Errorf("DeleteSandbox of the parent during its fork: %v", err)
	}
	f := <-done
	t.Logf("the fork: %v", f.err)
	for _, c := range f.resp.GetSandboxes() {
		t.Cleanup(func() { svc.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: c.GetId()}) })
		countsOn(t, ctx, svc, c.GetId(), before)
	}
	after, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(listed.GetSandboxes()) - 1 + len(f.resp.GetSandboxes()); len(after.GetSandboxes()) != want {
		t.Errorf("%d sandboxes after the fork and the parent's delete, want %d (%d before, the parent gone, %d children)", len(after.GetSandboxes()), want, len(listed.GetSandboxes()), len(f.resp.GetSandboxes()))
	}
	if _, err := os.Stat(hostDir); !os.IsNotExist(err) {
		t.Errorf("the deleted parent's host directory: %v, want it gone", err)
	}
}

// TestForkMemoryChains: forks with memory of a paused parent, of a child
// (a grandchild) and of a hibernated parent, and a files-only fork of a
// child. The paused parent is paused again after the fork (containerd
// holds its task paused, GetSandbox says PAUSED) while its child counts
// on; the grandchild counts on from its parent's count; the files-only
// fork of a child has the child's files and no process of its; the
// hibernated parent is woken and its child counts on.
func TestForkMemoryChains(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"}).GetId()
	loop := startDetachedIn(t, svc, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, svc, id); return before >= 5 }) {
		t.Fatalf("the counter before the fork: %d, want it counting", before)
	}
	if _, err := svc.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	child := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Memory: true})[0].GetId()
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("the paused parent after its fork with memory: %v, want PAUSED", got)
	}
	if st := taskStatusOf(t, ctx, id); st != containerd.Paused {
		t.Errorf("containerd's task status of the paused parent after its fork: %v, want paused", st)
	}
	countsOn(t, ctx, svc, child, before)
	childCount := readCount(t, ctx, svc, child)
	grandchild := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: child, Count: 1, Memory: true})[0].GetId()
	countsOn(t, ctx, svc, grandchild, childCount)
	if state := execState(t, ctx, svc, grandchild, loop); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the first parent's loop exec %s in the grandchild: %v, want RUNNING", loop, state)
	}
	shellOut(t, svc, child, "echo child >/workspace/mark")
	files := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: child, Count: 1})[0].GetId()
	if got := shellOut(t, svc, files, "cat /workspace/mark"); got != "child\n" {
		t.Errorf("the files-only fork of child %s: mark %q, want child's", child, got)
	}
	if state := execState(t, ctx, svc, files, loop); state == berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the loop exec %s in the files-only fork of child %s: RUNNING, want no process of its", loop, child)
	}
	if _, err := svc.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if hib, err := svc.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil || hib.GetHibernation() != berthv1.Hibernation_HIBERNATION_MEMORY_KEPT {
		t.Fatalf("HibernateSandbox of %s: %v, %v; want MEMORY_KEPT", id, hib.GetHibernation(), err)
	}
	woken := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Memory: true})[0].GetId()
	if got := sandboxState(t, ctx, id); got != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("the hibernated parent after its fork with memory: %v, want RUNNING (woken)", got)
	}
	countsOn(t, ctx, svc, woken, before)
	countsOn(t, ctx, svc, id, before)
}

// TestForkMemoryRestoreKilled: a fork with memory whose child's runsc
// restore is killed (SIGKILL to the first process whose command line
// names the fork's memory image) fails, leaving no child, no memory image
// in the parent's host directory, and the parent running on: its counter
// counting, its loop exec RUNNING, the same boot id.
func TestForkMemoryRestoreKilled(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	parent := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	id := parent.GetId()
	hostDir := filepath.Dir(filepath.Dir(env.rt.SocketPath(id)))
	loop := startDetachedIn(t, svc, id, "sh", "-c", counterLoop)
	var before int
	if !poll(time.Minute, func() bool { before = readCount(t, ctx, svc, id); return before >= 5 }) {
		t.Fatalf("the counter before the fork: %d, want it counting", before)
	}
	listed, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		defer close(killed)
		for {
			select {
			case <-stop:
				return
			default:
			}
			procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			for _, p := range procs {
				b, err := os.ReadFile(p)
				if err != nil || !strings.Contains(string(b), hostDir+"/fork-memory-") {
					continue
				}
				pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				if err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
					killed <- strings.ReplaceAll(string(b), "\x00", " ")
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err = svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 2, Memory: true})
	close(stop)
	what, ok := <-killed
	if !ok {
		t.Skipf("no process naming the fork's memory image was seen to kill (the fork: %v)", err)
	}
	t.Logf("killed %q; the fork: %v", what, err)
	if err == nil {
		t.Errorf("ForkSandbox with a child's restore killed: no error")
	}
	after, lerr := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(after.GetSandboxes()) != len(listed.GetSandboxes()) {
		t.Errorf("%d sandboxes after the failed fork, %d before: want no child left", len(after.GetSandboxes()), len(listed.GetSandboxes()))
	}
	if left, _ := filepath.Glob(filepath.Join(hostDir, "fork-memory-*")); len(left) != 0 {
		t.Errorf("memory images left after the failed fork: %v", left)
	}
	// No process of the child whose restore was killed is left (its
	// runsc sandbox and gofer name its bundle, named by its id).
	fields := strings.Fields(what)
	child := "/" + fields[len(fields)-1]
	var left []string
	if !poll(time.Minute, func() bool {
		left = nil
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), child+"\x00") {
				left = append(left, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		return len(left) == 0
	}) {
		t.Errorf("processes of the failed child %s left: %q", child, left)
	}
	countsOn(t, ctx, svc, id, before)
	if state := execState(t, ctx, svc, id, loop); state != berthv1.ExecState_EXEC_STATE_RUNNING {
		t.Errorf("the parent's loop exec %s after the failed fork: %v, want RUNNING", loop, state)
	}
	got, gerr := svc.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if gerr != nil || got.GetSandbox().GetRuntime().GetAgentBootId() != parent.GetRuntime().GetAgentBootId() || got.GetSandbox().GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("the parent after the failed fork: %v, %v; want RUNNING with boot id %s", got.GetSandbox(), gerr, parent.GetRuntime().GetAgentBootId())
	}
}

// TestForkMemoryRequestRepeated: the same fork with memory (one request
// id) sent twice at once makes one set of children: both calls return
// the same 2 ids, and 2 sandboxes are added in all.
func TestForkMemoryRequestRepeated(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"}).GetId()
	startDetachedIn(t, svc, id, "sh", "-c", counterLoop)
	listed, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	req := &berthv1.ForkSandboxRequest{SandboxId: id, Count: 2, Memory: true, RequestId: "repeated-" + id}
	resps := make([]*berthv1.ForkSandboxResponse, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range resps {
		wg.Go(func() { resps[i], errs[i] = svc.ForkSandbox(ctx, req) })
	}
	wg.Wait()
	ids := map[string]bool{}
	for i, r := range resps {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
		}
		for _, sb := range r.GetSandboxes() {
			if !ids[sb.GetId()] {
				t.Cleanup(func() { svc.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}) })
			}
			ids[sb.GetId()] = true
		}
	}
	if len(ids) != 2 {
		t.Errorf("the two calls returned children %v, want the same 2", ids)
	}
	after, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.GetSandboxes()) != len(listed.GetSandboxes())+2 {
		t.Errorf("%d sandboxes after, %d before: want 2 more", len(after.GetSandboxes()), len(listed.GetSandboxes()))
	}
}

// countsOn checks that sandbox sb's counter loop (counterLoop) stands at
// least at from and goes on counting.
func countsOn(t *testing.T, ctx context.Context, svc berthv1.SandboxServiceClient, sb string, from int) {
	t.Helper()
	first := readCount(t, ctx, svc, sb)
	var later int
	if first < from || !poll(time.Minute, func() bool { later = readCount(t, ctx, svc, sb); return later > first }) {
		t.Errorf("%s's counter: %d then %d, want at least %d and counting", sb, first, later, from)
	}
}

// taskStatusOf returns containerd's status of sandbox id's task.
func taskStatusOf(t *testing.T, ctx context.Context, id string) containerd.ProcessStatus {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(env.rt.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.Status
}
