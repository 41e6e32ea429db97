package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// gvisorFromSnapshot creates a sandbox of runtime from snapshot snapID
// and returns its id; it is deleted at cleanup.
func gvisorFromSnapshot(t *testing.T, snapID, runtime string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{FromSnapshot: snapID, Runtime: runtime})
	if err != nil {
		t.Fatalf("CreateSandbox (runtime %s) from snapshot %s: %v", runtime, snapID, err)
	}
	id := resp.GetSandbox().GetId()
	t.Cleanup(func() {
		env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	})
	return id
}

// gvisorWrites is what the gVisor snapshot and fork tests write in their
// parent, none of it synced: a file of random data, a file with mode
// 640, a symlink, and a line written by a process that
// still holds its file open (the sentry may keep such data in its own
// cache: the copy must have it all the same).
const gvisorWrites = `mkdir -p /workspace/d && head -c 8388608 /dev/urandom >/workspace/d/data && echo mine >/workspace/d/owned && chmod 640 /workspace/d/owned && ln -s d/owned /workspace/link`

// gvisorWritten returns a new gVisor sandbox holding gvisorWrites.
func gvisorWritten(t *testing.T) string {
	t.Helper()
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"}).GetId()
	shellOut(t, env.sandboxes, id, gvisorWrites)
	return id
}

// TestGVisorSnapshot: a snapshot of a running gVisor sandbox holds every
// write acknowledged before the call (a file still held open by its
// writer included), under the workload's ids; a gVisor sandbox and a runc
// sandbox made from it see the files byte for byte with their owners and
// modes, and their writes are their own; the source runs on.
func TestGVisorSnapshot(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	src := gvisorWritten(t)
	// A file of a workload user other than root: the copy keeps its owner.
	if r, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: src, Process: &berthv1.ProcessSpec{ShellCommand: "echo theirs >/var/tmp/nobody && id -u", User: "65534"}}); err != nil || r.GetResult().GetExitCode() != 0 || string(r.GetStdout()) != "65534\n" {
		t.Fatalf("Run as user 65534: %v, %v %q", err, r.GetResult(), r.GetStdout())
	}
	startDetached(t, src, "sh", "-c", "exec 3>/workspace/held; echo held-open >&3; touch /workspace/held.written; exec sleep 100000")
	waitFor(t, time.Minute, "the held-open write", func() bool {
		return shellOut(t, svc, src, "test -e /workspace/held.written && echo yes || true") == "yes\n"
	})
	want := shellOut(t, svc, src, treeListing)

	snap := createSnapshotOn(t, svc, src, nil)
	if snap.GetSandboxId() != src || snap.GetSizeBytes() < 8<<20 {
		t.Errorf("snapshot %v: want sandbox_id %s and size_bytes at least the 8 MiB written", snap, src)
	}
	if st := sandboxState(t, ctx, src); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("source after CreateSnapshot: %v, want RUNNING (resumed)", st)
	}
	for _, rt := range []string{"gvisor", "runc"} {
		child := gvisorFromSnapshot(t, snap.GetId(), rt)
		if got := shellOut(t, svc, child, treeListing); got != want {
			t.Errorf("%s sandbox from the gVisor snapshot: /workspace listing hash %q, want the source's %q", rt, got, want)
		}
		if got := shellOut(t, svc, child, "stat -c '%u:%g %a' /workspace/d/owned /var/tmp/nobody; cat /workspace/held /var/tmp/nobody"); got != "0:0 640\n65534:65534 644\nheld-open\ntheirs\n" {
			t.Errorf("%s sandbox from the gVisor snapshot: owners and contents read %q, want 0:0 640 and 65534:65534 644 (as written), held-open and theirs", rt, got)
		}
		shellOut(t, svc, child, "echo "+rt+" >/workspace/child && rm /workspace/d/data")
	}
	if got := shellOut(t, svc, src, "ls /workspace/child 2>/dev/null | wc -l; test -e /workspace/d/data && echo kept"); got != "0\nkept\n" {
		t.Errorf("source after its children's writes: %q, want no child file and data kept", got)
	}
}

// TestGVisorFork: a fork of 2 from a running gVisor sandbox gives gVisor
// children whose /workspace tree is the parent's at the call, byte for
// byte, and whose writes no other sees; the parent runs on.
func TestGVisorFork(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	parent := gvisorWritten(t)
	want := shellOut(t, svc, parent, treeListing)
	before := forkCopies(t, env.namespace)

	children := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: parent, Count: 2})
	if len(children) != 2 {
		t.Fatalf("ForkSandbox made %d children, want 2", len(children))
	}
	if st := sandboxState(t, ctx, parent); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("parent after ForkSandbox: %v, want RUNNING", st)
	}
	var ids []string
	for _, c := range children {
		ids = append(ids, c.GetId())
		if c.GetRuntimeName() != "gvisor" || c.GetForkedFrom() != parent {
			t.Errorf("child %s: runtime %q, forked_from %q; want gvisor, %s", c.GetId(), c.GetRuntimeName(), c.GetForkedFrom(), parent)
		}
		if got := shellOut(t, svc, c.GetId(), treeListing); got != want {
			t.Errorf("child %s's /workspace listing hash %q, want the parent's %q", c.GetId(), got, want)
		}
		if got := shellOut(t, svc, c.GetId(), "uname -r"); got != "4.4.0\n" {
			t.Errorf("child %s's uname -r %q, want gVisor's 4.4.0", c.GetId(), got)
		}
	}
	shellOut(t, svc, parent, "echo parent >/workspace/after")
	shellOut(t, svc, ids[0], "echo child >/workspace/after-0 && echo changed >/workspace/d/owned")
	for _, c := range []struct{ id, cmd, want string }{
		{parent, "cat /workspace/after /workspace/d/owned; ls /workspace/after-0 2>/dev/null | wc -l", "parent\nmine\n0\n"},
		{ids[0], "cat /workspace/after-0 /workspace/d/owned; ls /workspace/after 2>/dev/null | wc -l", "child\nchanged\n0\n"},
		{ids[1], "cat /workspace/d/owned; ls /workspace/after /workspace/after-0 2>/dev/null | wc -l", "mine\n0\n"},
	} {
		if got := shellOut(t, svc, c.id, c.cmd); got != c.want {
			t.Errorf("in %s after the writes, %q printed %q, want %q", c.id, c.cmd, got, c.want)
		}
	}
	if copies := forkCopies(t, env.namespace); !slices.Equal(copies, before) {
		t.Errorf("fork copies %v after the fork, %v before: want none left", copies, before)
	}
}
