package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// forkEnvInt reads a positive integer from the environment variable name,
// def when it is unset.
func forkEnvInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// treeListing is a shell command printing one sha256 over /workspace's
// tree: every path with its type, mode, owner and size, and every regular
// file's content hash.
const treeListing = `cd /workspace && { find . -printf '%p %y %m %U:%G %s\n' | sort; find . -type f -exec sha256sum {} + | sort -k2; } | sha256sum`

// forkOn forks sandbox id on svc; the children are deleted at cleanup.
func forkOn(t *testing.T, svc berthv1.SandboxServiceClient, req *berthv1.ForkSandboxRequest) []*berthv1.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := svc.ForkSandbox(ctx, req)
	if err != nil {
		t.Fatalf("ForkSandbox(%s, count %d): %v", req.GetSandboxId(), req.GetCount(), err)
	}
	for _, sb := range resp.GetSandboxes() {
		t.Cleanup(func() { svc.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}) })
	}
	return resp.GetSandboxes()
}

// forkCopies returns the fork copies of containerd namespace ns: the
// directories of ForkSnapshot under the btrfs snapshotter's root, and the
// hidden containerd snapshots an earlier berthd made instead.
func forkCopies(t *testing.T, ns string) []string {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []string
	if err := cc.SnapshotService(env.snapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if strings.HasPrefix(i.Name, "berth-snapshot/fork-") {
			out = append(out, i.Name)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	plugins, err := cc.IntrospectionService().Plugins(ctx, "type==io.containerd.snapshotter.v1,id=="+env.snapshotter)
	if err != nil || len(plugins.GetPlugins()) != 1 || plugins.GetPlugins()[0].GetExports()["root"] == "" {
		t.Fatalf("the root of containerd's %s snapshotter: %v %v", env.snapshotter, plugins, err)
	}
	dir := filepath.Join(plugins.GetPlugins()[0].GetExports()["root"], "berth-forks", ns)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		out = append(out, filepath.Join(dir, e.Name()))
	}
	slices.Sort(out)
	return out
}

// TestForkSandbox: a fork of BERTH_FORK_COUNT (default 3) children of a
// sandbox with BERTH_FORK_MIB (default 32) MiB written gives children
// whose /workspace tree is the parent's at the call, byte for byte, each
// with the parent's env and labels (the request's added), its own id and
// user id range, and writes that no other sees; the parent runs on; a
// repeat with the same request_id returns the same children and makes
// none, with another count is ALREADY_EXISTS naming count; the fork's copy
// is no snapshot of the caller's and is gone when the call returns, the
// children keeping their files; a paused parent stays paused.
func TestForkSandbox(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	count, mib := forkEnvInt(t, "BERTH_FORK_COUNT", 3), forkEnvInt(t, "BERTH_FORK_MIB", 32)
	if count < 2 {
		t.Fatalf("BERTH_FORK_COUNT=%d: the test compares two children, want at least 2", count)
	}
	req := &berthv1.CreateSandboxRequest{Env: map[string]string{"FORK_ENV": "from the parent"}, Labels: map[string]string{"team": "a"}}
	if testDiskQuota() > 0 {
		req.Resources = &berthv1.Resources{DiskBytes: max(testDiskQuota(), uint64(2*mib)<<20)}
	}
	parent := newSandbox(t, req)
	pid := parent.GetId()
	// Written without fsync: the fork's sync must get it to the copy.
	shellOut(t, svc, pid, fmt.Sprintf("mkdir -p /workspace/d/e && head -c %d /dev/urandom >/workspace/d/data && echo hi >/workspace/d/e/f && chmod 600 /workspace/d/e/f && ln -s d/e/f /workspace/link", mib<<20))
	want := shellOut(t, svc, pid, treeListing)
	before := forkCopies(t, env.namespace)
	snaps, err := svc.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	children := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: uint32(count), RequestId: "fork-test-1", Labels: map[string]string{"child": "yes"}})
	t.Logf("ForkSandbox of %d with %d MiB written took %v", count, mib, time.Since(began))
	if len(children) != count {
		t.Fatalf("ForkSandbox made %d children, want %d", len(children), count)
	}
	if st := sandboxState(t, ctx, pid); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("parent after ForkSandbox: %v, want RUNNING", st)
	}
	bases := map[uint32]string{parent.GetHostIdBase(): pid}
	var ids []string
	for _, c := range children {
		ids = append(ids, c.GetId())
		if c.GetId() == pid || c.GetForkedFrom() != pid || c.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("child %s: forked_from %q, state %v; want a new id, forked from %s, RUNNING", c.GetId(), c.GetForkedFrom(), c.GetState(), pid)
		}
		if c.GetLabels()["team"] != "a" || c.GetLabels()["child"] != "yes" {
			t.Errorf("child %s labels %v, want team=a (the parent's) and child=yes (the request's)", c.GetId(), c.GetLabels())
		}
		if other, ok := bases[c.GetHostIdBase()]; ok {
			t.Errorf("child %s has host id base %d, as %s", c.GetId(), c.GetHostIdBase(), other)
		}
		bases[c.GetHostIdBase()] = c.GetId()
		if got := shellOut(t, svc, c.GetId(), treeListing); got != want {
			t.Errorf("child %s's /workspace listing hash %q, want the parent's %q", c.GetId(), got, want)
		}
		if got := shellOut(t, svc, c.GetId(), `echo "$FORK_ENV"`); got != "from the parent\n" {
			t.Errorf("child %s's FORK_ENV %q, want the parent's", c.GetId(), got)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != count {
		t.Errorf("children ids %v are not distinct", ids)
	}

	// Writes are each sandbox's own.
	shellOut(t, svc, pid, "echo parent >/workspace/after")
	shellOut(t, svc, ids[0], "echo child >/workspace/after-0 && echo changed >/workspace/d/e/f")
	for _, c := range []struct{ id, cmd, want string }{
		{pid, "cat /workspace/after; ls /workspace/after-0 2>&1 >/dev/null | wc -l; cat /workspace/d/e/f", "parent\n1\nhi\n"},
		{ids[0], "ls /workspace/after 2>/dev/null | wc -l; cat /workspace/after-0 /workspace/d/e/f", "0\nchild\nchanged\n"},
		{ids[1], "ls /workspace/after /workspace/after-0 2>/dev/null | wc -l; cat /workspace/d/e/f", "0\nhi\n"},
	} {
		if got := shellOut(t, svc, c.id, c.cmd); got != c.want {
			t.Errorf("in %s after the writes, %q printed %q, want %q", c.id, c.cmd, got, c.want)
		}
	}

	// Idempotent: the same request returns the same children.
	again := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: uint32(count), RequestId: "fork-test-1", Labels: map[string]string{"child": "yes"}})
	var againIDs []string
	for _, c := range again {
		againIDs = append(againIDs, c.GetId())
	}
	if !slices.Equal(againIDs, ids) {
		t.Errorf("repeated ForkSandbox returned %v, want the first call's %v", againIDs, ids)
	}
	if _, err := svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: uint32(count + 1), RequestId: "fork-test-1"}); status.Code(err) != codes.AlreadyExists ||
		rpcstatus.Reason(err) != rpcstatus.ReasonSandboxExists || !strings.Contains(fmt.Sprint(err), "count") {
		t.Errorf("ForkSandbox with the same request_id and another count: %v, want ALREADY_EXISTS SANDBOX_EXISTS naming count", err)
	}
	list, err := env.rt.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	forked := 0
	for _, sb := range list {
		if sb.Fork.Parent == pid {
			forked++
		}
	}
	if forked != count {
		t.Errorf("%d sandboxes forked from %s after the repeats, want %d", forked, pid, count)
	}

	// The copy is hidden (not the caller's snapshot) and gone once the
	// call has returned; the children do not need it.
	if after, err := svc.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{}); err != nil || len(after.GetSnapshots()) != len(snaps.GetSnapshots()) {
		t.Errorf("ListSnapshots after the fork: %d snapshots, %v; want %d as before", len(after.GetSnapshots()), err, len(snaps.GetSnapshots()))
	}
	if copies := forkCopies(t, env.namespace); !slices.Equal(copies, before) {
		t.Errorf("fork copies %v after the fork, %v before: want none left", copies, before)
	}
	if got := shellOut(t, svc, ids[1], treeListing); got != want {
		t.Errorf("child %s's /workspace listing hash %q once the copy is gone, want the parent's %q", ids[1], got, want)
	}

	// A paused parent stays paused.
	if _, err := svc.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: pid}); err != nil {
		t.Fatal(err)
	}
	one := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	if rec, err := env.rt.Get(ctx, pid); err != nil || !rec.Paused {
		t.Errorf("parent after ForkSandbox of it paused: paused %v, %v; want still paused", rec.Paused, err)
	}
	if got := shellOut(t, svc, one[0].GetId(), "cat /workspace/after"); got != "parent\n" {
		t.Errorf("child of the paused parent reads %q, want parent", got)
	}
}

// TestForkOfForkReclaims: a fork of a forked sandbox sees both forks'
// writes, and neither fork leaves a copy behind: deleting the child does
// not touch the grandchild's files, and a snapshot of the grandchild (and
// a sandbox from it) holds them.
func TestForkOfForkReclaims(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := forkCopies(t, env.namespace)
	pid := newSandbox(t, nil).GetId()
	shellOut(t, svc, pid, "echo one >/workspace/f")
	child := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0].GetId()
	shellOut(t, svc, child, "echo two >>/workspace/f")
	grandchild := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: child, Count: 1})[0].GetId()
	if got := shellOut(t, svc, grandchild, "cat /workspace/f"); got != "one\ntwo\n" {
		t.Errorf("grandchild's file %q, want one and two", got)
	}
	if left := forkCopies(t, env.namespace); !slices.Equal(left, before) {
		t.Errorf("fork copies %v after two forks, want %v (none left)", left, before)
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: child}); err != nil {
		t.Fatal(err)
	}
	if got := shellOut(t, svc, grandchild, "cat /workspace/f"); got != "one\ntwo\n" {
		t.Errorf("grandchild's file %q after its parent's deletion, want one and two", got)
	}
	// A snapshot of a forked sandbox, and a sandbox made from it, hold
	// its files; deleting them leaves no copy.
	snap := createSnapshotOn(t, svc, grandchild, nil)
	from := fromSnapshotOn(t, svc, snap.GetId())
	if got := shellOut(t, svc, from, "cat /workspace/f"); got != "one\ntwo\n" {
		t.Errorf("file of a sandbox from a snapshot of the grandchild %q, want one and two", got)
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: from}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()}); err != nil {
		t.Errorf("DeleteSnapshot of the grandchild's snapshot: %v", err)
	}
	if left := forkCopies(t, env.namespace); !slices.Equal(left, before) {
		t.Errorf("fork copies %v after the snapshot's deletion, want %v", left, before)
	}
}

// TestForkAllOrNothing: a fork whose last child the principal's sandbox
// cap refuses fails as that create does and leaves no child, nor its copy.
func TestForkAllOrNothing(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "forkcap", server.Config{TaskRestartLimit: -1, MaxSandboxesPerPrincipal: 3}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{}).GetId()
	_, err := e.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 3})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("ForkSandbox of 3 with room for 2 more sandboxes: %v, want RESOURCE_EXHAUSTED", err)
	}
	onlyParentLeft(ctx, t, e)
}

// onlyParentLeft fails t unless env e holds one sandbox (a failed fork's
// parent) and no fork copy.
func onlyParentLeft(ctx context.Context, t *testing.T, e *berthEnv) {
	t.Helper()
	list, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetSandboxes()); n != 1 {
		t.Errorf("%d sandboxes after the failed fork, want only the parent", n)
	}
	if copies := forkCopies(t, e.ns); len(copies) != 0 {
		t.Errorf("fork copies %v left after the failed fork", copies)
	}
}

// TestForkCopyFailsNoChild: the children's creates begin before the copy
// is taken; when the copy then fails (the parent's task is gone, so it
// cannot be paused for the copy), the call fails with the copy's error
// and leaves no child, nor its copy.
func TestForkCopyFailsNoChild(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "forkfail", server.Config{TaskRestartLimit: -1}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{}).GetId()
	if err := e.rt.Kill(ctx, pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, e, pid)
	_, err := e.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 3})
	if err == nil || !strings.Contains(err.Error(), "pause sandbox "+pid+" for its fork") {
		t.Fatalf("ForkSandbox of a sandbox whose task is gone: %v, want the pause for its copy to fail", err)
	}
	onlyParentLeft(ctx, t, e)
}

// TestForkSurvivesRestart: children outlive a berthd killed with SIGKILL
// and keep their files; no fork copy is left at any point; a copy that a
// berthd killed during a fork left (its holder gone) is removed when the
// next berthd starts.
func TestForkSurvivesRestart(t *testing.T) {
	need(t)
	e, p1, pid := startBerthdWithSandbox(t, "fkr", "fork-rs")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	shellOut(t, e.sandboxes, pid, "echo survived >/workspace/f")
	children := forkOn(t, e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 2})
	if copies := forkCopies(t, e.ns); len(copies) != 0 {
		t.Fatalf("fork copies %v after the fork, want none", copies)
	}
	orphan := orphanForkCopy(t, e.ns)
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e)
	if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("orphaned fork copy %s after berthd's start: %v, want removed", orphan, err)
	}
	for _, c := range children {
		if got := shellOut(t, e.sandboxes, c.GetId(), "cat /workspace/f"); got != "survived\n" {
			t.Errorf("child %s's file after the restart: %q, want survived", c.GetId(), got)
		}
		if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: c.GetId()}); err != nil {
			t.Error(err)
		}
	}
	if copies := forkCopies(t, e.ns); len(copies) != 0 {
		t.Errorf("fork copies %v after every child was deleted, want none", copies)
	}
	p2.signal(t, syscall.SIGTERM)
}

// orphanForkCopy makes, in containerd namespace ns, what a berthd killed
// during a fork leaves: a fork copy's directory with a read-only
// subvolume, whose holder no longer runs. It returns the directory.
func orphanForkCopy(t *testing.T, ns string) string {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	plugins, err := cc.IntrospectionService().Plugins(context.Background(), "type==io.containerd.snapshotter.v1,id=="+env.snapshotter)
	if err != nil || len(plugins.GetPlugins()) != 1 {
		t.Fatalf("containerd's %s snapshotter: %v", env.snapshotter, err)
	}
	dir := filepath.Join(plugins.GetPlugins()[0].GetExports()["root"], "berth-forks", ns, "fork-00000000000000000000")
	// This process's pid with another start time: no process runs so.
	hostShell(t, `mkdir -p "$1" && btrfs subvolume create "$1/root" >/dev/null && btrfs property set -ts "$1/root" ro true && printf %s "$2" >"$1/holder"`,
		dir, procfs.ProcessID(os.Getpid())+"0")
	return dir
}

// TestForkRefusedOnOverlayfs: with the overlayfs snapshotter ForkSandbox is
// FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED naming it, never a copy.
func TestForkRefusedOnOverlayfs(t *testing.T) {
	e := attackEnv(t, "fork-ov", "overlayfs", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := attackCreate(t, e, nil)
	_, err := e.sandboxes.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: sb.GetId(), Count: 2})
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotUnsupported || !strings.Contains(fmt.Sprint(err), "overlayfs") {
		t.Errorf("ForkSandbox on overlayfs: %v, want FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED naming overlayfs", err)
	}
	if list, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{}); err != nil || len(list.GetSandboxes()) != 1 {
		t.Errorf("sandboxes after the refused fork: %d, %v; want only the parent", len(list.GetSandboxes()), err)
	}
}
