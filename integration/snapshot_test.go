package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// createSnapshotOn snapshots sandbox id on svc; the snapshot is deleted at
// cleanup (after the sandboxes made from it, registered later).
func createSnapshotOn(t *testing.T, svc berthv1.SandboxServiceClient, id string, labels map[string]string) *berthv1.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := svc.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: id, Labels: labels})
	if err != nil {
		t.Fatalf("CreateSnapshot(%s): %v", id, err)
	}
	snap := resp.GetSnapshot()
	t.Cleanup(func() {
		svc.DeleteSnapshot(context.Background(), &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()})
	})
	return snap
}

// fromSnapshotOn creates a sandbox on svc from snapshot snapID, naming no
// image, deleted at cleanup.
func fromSnapshotOn(t *testing.T, svc berthv1.SandboxServiceClient, snapID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{FromSnapshot: snapID})
	if err != nil {
		t.Fatalf("CreateSandbox from snapshot %s: %v", snapID, err)
	}
	id := resp.GetSandbox().GetId()
	t.Cleanup(func() { svc.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}) })
	return id
}

// shellOut runs a shell command in sandbox id and returns its stdout,
// failing the test unless it exits 0.
func shellOut(t *testing.T, svc berthv1.SandboxServiceClient, id, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	if err != nil {
		t.Fatalf("Run(%q) in %s: %v", cmd, id, err)
	}
	if r.GetResult().GetExitCode() != 0 {
		t.Fatalf("Run(%q) in %s: exit %d, stderr %q", cmd, id, r.GetResult().GetExitCode(), r.GetStderr())
	}
	return string(r.GetStdout())
}

// TestSnapshotPointInTime: a snapshot has every byte dd wrote (without
// fsync) before the call, and every line a concurrent writer had
// appended, as a whole prefix; a sandbox created from it sees the files
// and its writes reach neither the source nor the snapshot; the snapshot
// outlives its source and is refused deletion while a sandbox made from it
// exists.
func TestSnapshotPointInTime(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	src := newSandbox(t, nil).GetId()
	// 64 MiB in page cache only: dd exits before any of it is on disk.
	want := shellOut(t, svc, src, "dd if=/dev/urandom of=/workspace/data bs=1M count=64 2>/dev/null && sha256sum /workspace/data")
	// A writer that appends a counter line as fast as it can.
	startDetached(t, src, "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i >>/workspace/log; done")
	waitFor(t, 30*time.Second, "the writer's first lines", func() bool {
		n, _ := strconv.Atoi(strings.TrimSpace(shellOut(t, svc, src, "cat /workspace/log 2>/dev/null | wc -l")))
		return n > 100
	})
	acked, _ := strconv.Atoi(strings.TrimSpace(shellOut(t, svc, src, "cat /workspace/log 2>/dev/null | wc -l")))

	began := time.Now()
	snap := createSnapshotOn(t, svc, src, map[string]string{"step": "one"})
	t.Logf("CreateSnapshot of a sandbox with 64 MiB written took %v (size %d bytes)", time.Since(began), snap.GetSizeBytes())
	if snap.GetSandboxId() != src || snap.GetLabels()["step"] != "one" || snap.GetCreated() == nil || snap.GetImage() == "" {
		t.Errorf("snapshot %v: want sandbox_id %s, label step=one, created and image set", snap, src)
	}
	if snap.GetSizeBytes() < 64<<20 {
		t.Errorf("snapshot size_bytes %d, want at least the 64 MiB written", snap.GetSizeBytes())
	}
	if st := sandboxState(t, ctx, src); st != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("source after CreateSnapshot: %v, want RUNNING (resumed)", st)
	}
	list, err := svc.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list.GetSnapshots() {
		found = found || s.GetId() == snap.GetId()
	}
	if !found {
		t.Errorf("ListSnapshots %v lacks %s", list.GetSnapshots(), snap.GetId())
	}

	began = time.Now()
	child := fromSnapshotOn(t, svc, snap.GetId())
	fromSnap := time.Since(began)
	began = time.Now()
	newSandbox(t, nil)
	t.Logf("CreateSandbox from the snapshot %v, a cold create of the base image %v (one run each)", fromSnap, time.Since(began))
	if got := shellOut(t, svc, child, "sha256sum /workspace/data"); got != want {
		t.Errorf("data in the sandbox from the snapshot: %q, want %q (what dd wrote before the call)", got, want)
	}
	// The log is a whole prefix 1..m of the writer's lines, m >= acked
	// (a line cut short at its end is the writer's in-flight write).
	lines := strings.Split(shellOut(t, svc, child, "cat /workspace/log"), "\n")
	complete := 0
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			if i < len(lines)-1 && l != "" {
				t.Errorf("snapshot's log line %d is %q, want %d", i+1, l, i+1)
			}
			break
		}
		complete = i + 1
	}
	if complete < acked {
		t.Errorf("snapshot's log has %d whole lines, want at least the %d the writer had written before the call", complete, acked)
	}
	t.Logf("writer had %d lines before the call; the snapshot holds %d", acked, complete)

	// The child's writes stay its own.
	shellOut(t, svc, child, "echo child >/workspace/child && rm /workspace/data")
	if out := shellOut(t, svc, src, "ls /workspace"); strings.Contains(out, "child") || !strings.Contains(out, "data") {
		t.Errorf("source's /workspace after the child's writes: %q", out)
	}
	// The source deleted, the snapshot still gives the same files.
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: src}); err != nil {
		t.Fatal(err)
	}
	second := fromSnapshotOn(t, svc, snap.GetId())
	if got := shellOut(t, svc, second, "sha256sum /workspace/data; test ! -e /workspace/child && echo clean"); got != want+"clean\n" {
		t.Errorf("second sandbox from the snapshot after the source's deletion: %q, want %q and clean", got, want)
	}

	_, err = svc.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()})
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotInUse {
		t.Errorf("DeleteSnapshot while sandboxes use it: %v, want FAILED_PRECONDITION SNAPSHOT_IN_USE", err)
	}
	for _, id := range []string{child, second} {
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()}); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	_, err = svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{FromSnapshot: snap.GetId()})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotNotFound {
		t.Errorf("CreateSandbox from a deleted snapshot: %v, want NOT_FOUND SNAPSHOT_NOT_FOUND", err)
	}
}

// TestSnapshotOfPausedSandbox: a paused sandbox stays paused through
// CreateSnapshot.
func TestSnapshotOfPausedSandbox(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := newSandbox(t, nil).GetId()
	shellOut(t, svc, src, "echo kept >/workspace/f")
	if _, err := svc.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: src}); err != nil {
		t.Fatal(err)
	}
	snap := createSnapshotOn(t, svc, src, nil)
	if rec, err := env.rt.Get(ctx, src); err != nil || !rec.Paused {
		t.Errorf("source after CreateSnapshot of it paused: paused %v, %v; want still paused", rec.Paused, err)
	}
	child := fromSnapshotOn(t, svc, snap.GetId())
	if got := shellOut(t, svc, child, "cat /workspace/f"); got != "kept\n" {
		t.Errorf("file in the sandbox from the snapshot: %q, want kept", got)
	}
}

// TestSnapshotOwnership: another principal's snapshot is NOT_FOUND to
// every call, and missing from their list; another principal's sandbox
// cannot be snapshotted nor forked (NOT_FOUND, nothing made).
func TestSnapshotOwnership(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	alice, bob := berthv1.NewSandboxServiceClient(a.conn(t, aliceToken)), berthv1.NewSandboxServiceClient(a.conn(t, bobToken))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := alice.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	t.Cleanup(func() { alice.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}) })
	if _, err := bob.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: id}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxNotFound {
		t.Errorf("bob's CreateSnapshot of alice's sandbox: %v, want NOT_FOUND SANDBOX_NOT_FOUND", err)
	}
	if _, err := bob.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxNotFound {
		t.Errorf("bob's ForkSandbox of alice's sandbox: %v, want NOT_FOUND SANDBOX_NOT_FOUND", err)
	}
	if list, err := bob.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{}); err != nil || len(list.GetSandboxes()) != 0 {
		t.Errorf("bob's sandboxes after the refused fork: %v, %v; want none", list.GetSandboxes(), err)
	}
	snap := createSnapshotOn(t, alice, id, nil)
	if snap.GetOwner() != "alice" {
		t.Errorf("snapshot owner %q, want alice", snap.GetOwner())
	}
	if _, err := bob.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotNotFound {
		t.Errorf("bob's DeleteSnapshot of alice's snapshot: %v, want NOT_FOUND SNAPSHOT_NOT_FOUND", err)
	}
	if _, err := bob.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{FromSnapshot: snap.GetId()}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotNotFound {
		t.Errorf("bob's CreateSandbox from alice's snapshot: %v, want NOT_FOUND SNAPSHOT_NOT_FOUND", err)
	}
	for who, svc := range map[string]berthv1.SandboxServiceClient{"alice": alice, "bob": bob} {
		list, err := svc.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		has := false
		for _, s := range list.GetSnapshots() {
			has = has || s.GetId() == snap.GetId()
		}
		if has != (who == "alice") {
			t.Errorf("%s's ListSnapshots lists alice's snapshot: %v", who, has)
		}
	}
}

// TestSnapshotSurvivesRestart: a snapshot outlives a berthd killed with
// SIGKILL and its source's deletion after the restart (containerd's
// garbage collection included).
func TestSnapshotSurvivesRestart(t *testing.T) {
	need(t)
	e, p1, src := startBerthdWithSandbox(t, "snr", "snap-rs")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	shellOut(t, e.sandboxes, src, "echo survived >/workspace/f")
	snap := createSnapshotOn(t, e.sandboxes, src, nil)
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e)
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: src}); err != nil {
		t.Fatal(err)
	}
	list, err := e.sandboxes.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
	if err != nil || len(list.GetSnapshots()) != 1 || list.GetSnapshots()[0].GetId() != snap.GetId() {
		t.Fatalf("ListSnapshots after the restart: %v, %v; want %s", list.GetSnapshots(), err, snap.GetId())
	}
	child := fromSnapshotOn(t, e.sandboxes, snap.GetId())
	if got := shellOut(t, e.sandboxes, child, "cat /workspace/f"); got != "survived\n" {
		t.Errorf("file after the restart: %q, want survived", got)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: child}); err != nil {
		t.Error(err)
	}
	if _, err := e.sandboxes.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestSnapshotRefusedOnOverlayfs: with the overlayfs snapshotter the
// snapshot calls are FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED naming it,
// never a copy with other semantics.
func TestSnapshotRefusedOnOverlayfs(t *testing.T) {
	e := attackEnv(t, "snap-ov", "overlayfs", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := attackCreate(t, e, nil)
	for what, err := range map[string]error{
		"CreateSnapshot": func() error {
			_, err := e.sandboxes.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: sb.GetId()})
			return err
		}(),
		"ListSnapshots": func() error { _, err := e.sandboxes.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{}); return err }(),
		"CreateSandbox": func() error {
			_, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, FromSnapshot: "snap-0123456789abcdef0123"})
			return err
		}(),
	} {
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotUnsupported || !strings.Contains(fmt.Sprint(err), "overlayfs") {
			t.Errorf("%s on overlayfs: %v, want FAILED_PRECONDITION SNAPSHOT_UNSUPPORTED naming overlayfs", what, err)
		}
	}
}

// TestSnapshotLimit: a principal holding --max-snapshots-per-principal
// snapshots is refused RESOURCE_EXHAUSTED SNAPSHOT_LIMIT, nothing stored,
// and may take one again after deleting one.
func TestSnapshotLimit(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "snaplimit", server.Config{TaskRestartLimit: -1, MaxSnapshotsPerPrincipal: 2}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{}).GetId()
	first := createSnapshotOn(t, e.sandboxes, src, nil)
	createSnapshotOn(t, e.sandboxes, src, nil)
	_, err := e.sandboxes.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: src})
	if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotLimit {
		t.Fatalf("third CreateSnapshot with a cap of 2: %v, want RESOURCE_EXHAUSTED SNAPSHOT_LIMIT", err)
	}
	list, err := e.sandboxes.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
	if err != nil || len(list.GetSnapshots()) != 2 {
		t.Fatalf("ListSnapshots after the refusal: %d snapshots, %v; want 2", len(list.GetSnapshots()), err)
	}
	if _, err := e.sandboxes.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: first.GetId()}); err != nil {
		t.Fatal(err)
	}
	createSnapshotOn(t, e.sandboxes, src, nil)
}

// TestSnapshotLabels: labels a sandbox may carry but one containerd label
// cannot hold as JSON (4096 bytes) are INVALID_ARGUMENT before the source
// is touched, which stays running; labels up to that size, "<" and quotes
// included, come back as given.
func TestSnapshotLabels(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := newSandbox(t, nil).GetId()
	big := map[string]string{"a": strings.Repeat("v", 2100), "b": strings.Repeat("v", 2100)}
	if _, err := svc.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: src, Labels: big}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateSnapshot with 4 KB of labels: %v, want INVALID_ARGUMENT", err)
	}
	if rec, err := env.rt.Get(ctx, src); err != nil || rec.Paused {
		t.Errorf("source after the refused CreateSnapshot: paused %v, %v; want running", rec.Paused, err)
	}
	odd := map[string]string{"lt": strings.Repeat("<", 3000), "q": `"é\`}
	snap := createSnapshotOn(t, svc, src, odd)
	list, err := svc.ListSnapshots(ctx, &berthv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSnapshots() {
		if s.GetId() == snap.GetId() && (s.GetLabels()["lt"] != odd["lt"] || s.GetLabels()["q"] != odd["q"] || len(s.GetLabels()) != 2) {
			t.Errorf("listed labels %q, want %q", s.GetLabels(), odd)
		}
	}
}

// TestSnapshotFailureLeavesNothing: a CreateSnapshot that fails once the
// copy is under way (here the freeze) leaves no snapshot record behind.
// containerd 1.6's btrfs snapshotter removes a record whose subvolume is
// gone; newer ones (v2's Remove snapshots the subvolume first) would keep
// it, which is why the copy is made beside the temporary subvolume and
// only then put in its place.
func TestSnapshotFailureLeavesNothing(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "snapfail", server.Config{TaskRestartLimit: -1}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{}).GetId()
	failed := errors.New("the freeze failed on purpose")
	_, err := e.rt.CreateSnapshot(ctx, src, "root", nil, func(context.Context) (func(), error) { return nil, failed })
	if !errors.Is(err, failed) {
		t.Fatalf("CreateSnapshot with a failing freeze: %v, want %v", err, failed)
	}
	for _, name := range captureHostState(t, e, env.snapshotter).snapshots {
		if strings.HasPrefix(name, "berth-snapshot/") {
			t.Errorf("snapshot record %s is left after a failed CreateSnapshot", name)
		}
	}
}
