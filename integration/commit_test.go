package integration

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// writeCommitChanges writes in sandbox id what TestCommitSnapshot checks
// in the committed image: a regular file in a new directory, a symlink, a
// file of mode 0750 that uid 1234 gid 2345 created (a sandbox's processes
// hold no CAP_CHOWN), a changed base file and a deleted one.
func writeCommitChanges(t *testing.T, svc berthv1.SandboxServiceClient, id string) {
	t.Helper()
	shellOut(t, svc, id, `mkdir -p /workspace/d /workspace/u && chmod 0777 /workspace/u && echo hello >/workspace/d/f &&
ln -s d/f /workspace/link && rm /etc/shells && echo changed >/etc/profile`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{User: "1234:2345", ShellCommand: "echo secret >/workspace/u/priv && chmod 0750 /workspace/u/priv"}})
	if err != nil || r.GetResult().GetExitCode() != 0 {
		t.Fatalf("write /workspace/u/priv as 1234:2345: %v, exit %d, stderr %q", err, r.GetResult().GetExitCode(), r.GetStderr())
	}
}

// commitCheck prints what writeCommitChanges left; commitWant is its output.
const (
	commitCheck = `cat /workspace/d/f; readlink /workspace/link; stat -c '%u:%g %a' /workspace/u/priv;
if test -e /etc/shells; then echo shells-back; else echo shells-gone; fi; cat /etc/profile`
	commitWant = "hello\nd/f\n1234:2345 750\nshells-gone\nchanged\n"
)

// commitOn commits snapshot snapID as ref on svc; the image is deleted at
// cleanup through images.
func commitOn(t *testing.T, svc berthv1.SandboxServiceClient, images berthv1.ImageServiceClient, snapID, ref string, changes *berthv1.ImageConfigChanges) *berthv1.CommitSnapshotResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := svc.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snapID, Reference: ref, Changes: changes})
	if err != nil {
		t.Fatalf("CommitSnapshot(%s, %s): %v", snapID, ref, err)
	}
	t.Cleanup(func() { images.DeleteImage(context.Background(), &berthv1.DeleteImageRequest{Name: ref}) })
	if resp.GetImage().GetName() != ref || !strings.HasPrefix(resp.GetLayerDigest(), "sha256:") || resp.GetLayerSizeBytes() <= 0 {
		t.Errorf("CommitSnapshot answered %v, want image %s and its new layer", resp, ref)
	}
	return resp
}

// listedImage returns the digest ListImages shows for name, or "".
func listedImage(t *testing.T, images berthv1.ImageServiceClient, name string) string {
	return listed(t, images, name).GetDigest()
}

// listed returns the image ListImages shows as name, or nil.
func listed(t *testing.T, images berthv1.ImageServiceClient, name string) *berthv1.Image {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := images.ListImages(ctx, &berthv1.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range list.GetImages() {
		if img.GetName() == name {
			return img
		}
	}
	return nil
}

// TestCommitSnapshot: a committed snapshot is an image that ListImages
// shows and CreateSandbox runs, holding the snapshot's files with their
// owners and modes, its symlinks, and the base file it deleted still
// deleted (a whiteout); a snapshot of a sandbox made from a snapshot
// commits with both snapshots' changes (its diff is against the image, not
// its parent snapshot).
func TestCommitSnapshot(t *testing.T) {
	need(t)
	svc := env.sandboxes
	src := newSandbox(t, nil).GetId()
	writeCommitChanges(t, svc, src)
	snap := createSnapshotOn(t, svc, src, nil)
	ref := "berth.test/commit-" + src + ":v1"
	resp := commitOn(t, svc, env.images, snap.GetId(), ref, &berthv1.ImageConfigChanges{Env: []string{"COMMITTED=yes"}, WorkingDir: "/workspace/d"})
	if got := listedImage(t, env.images, ref); got != resp.GetImage().GetDigest() {
		t.Errorf("ListImages shows %s with digest %q, want %s", ref, got, resp.GetImage().GetDigest())
	}
	child := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref}).GetId()
	if got := shellOut(t, svc, child, commitCheck); got != commitWant {
		t.Errorf("sandbox of the committed image shows\n%q\nwant\n%q", got, commitWant)
	}
	if got := shellOut(t, svc, child, `echo "$COMMITTED $PATH"`); !strings.HasPrefix(got, "yes /") {
		t.Errorf("environment of the committed image: %q, want COMMITTED=yes beside the base image's PATH", got)
	}

	// A chain: a sandbox from the snapshot, a change, a snapshot, a commit.
	grand := fromSnapshotOn(t, svc, snap.GetId())
	shellOut(t, svc, grand, "echo second >/workspace/second && rm /workspace/d/f")
	snap2 := createSnapshotOn(t, svc, grand, nil)
	ref2 := "berth.test/commit-" + src + ":v2"
	commitOn(t, svc, env.images, snap2.GetId(), ref2, nil)
	child2 := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref2}).GetId()
	const want2 = "second\nmissing\nd/f\nshells-gone\n"
	if got := shellOut(t, svc, child2, "cat /workspace/second; test -e /workspace/d/f || echo missing; readlink /workspace/link; test -e /etc/shells || echo shells-gone"); got != want2 {
		t.Errorf("sandbox of the image committed from a chained snapshot shows %q, want %q", got, want2)
	}
}

// TestCommitSnapshotRefusals: another principal's snapshot is NOT_FOUND
// SNAPSHOT_NOT_FOUND, a malformed reference INVALID_ARGUMENT naming
// reference, a stored reference ALREADY_EXISTS IMAGE_EXISTS, and replace
// PERMISSION_DENIED for a principal that is not an admin but allowed for
// an admin.
func TestCommitSnapshotRefusals(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	aliceConn := a.conn(t, aliceToken)
	alice, bob := berthv1.NewSandboxServiceClient(aliceConn), berthv1.NewSandboxServiceClient(a.conn(t, bobToken))
	opsConn := a.conn(t, opsToken)
	ops, opsImages := berthv1.NewSandboxServiceClient(opsConn), berthv1.NewImageServiceClient(opsConn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := createSandboxOn(t, alice, &berthv1.CreateSandboxRequest{}).GetId()
	snap := createSnapshotOn(t, alice, id, nil)
	ref := "berth.test/commit-" + id + ":v1"

	_, err := bob.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: ref})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotNotFound {
		t.Errorf("bob's CommitSnapshot of alice's snapshot: %v, want NOT_FOUND SNAPSHOT_NOT_FOUND", err)
	}
	for _, bad := range []string{"", "Upper/Case", "no spaces", "a:b:c", "berth.test/x@sha256:00"} {
		_, err = alice.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: bad})
		if status.Code(err) != codes.InvalidArgument || badRequestField(err) != "reference" {
			t.Errorf("CommitSnapshot to %q: %v, want INVALID_ARGUMENT naming reference", bad, err)
		}
	}
	if listedImage(t, opsImages, ref) != "" {
		t.Fatalf("%s is stored after refused commits", ref)
	}
	commitOn(t, alice, opsImages, snap.GetId(), ref, nil)
	_, err = alice.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: ref})
	if status.Code(err) != codes.AlreadyExists || rpcstatus.Reason(err) != rpcstatus.ReasonImageExists {
		t.Errorf("second CommitSnapshot to %s: %v, want ALREADY_EXISTS IMAGE_EXISTS", ref, err)
	}
	_, err = alice.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: ref, Replace: true})
	if status.Code(err) != codes.PermissionDenied || rpcstatus.Reason(err) != rpcstatus.ReasonNotPermitted {
		t.Errorf("alice's CommitSnapshot with replace: %v, want PERMISSION_DENIED NOT_PERMITTED", err)
	}
	before := listedImage(t, opsImages, ref)
	replaced, err := ops.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: ref, Replace: true,
		Changes: &berthv1.ImageConfigChanges{Env: []string{"COMMITTED=again"}}})
	if err != nil {
		t.Fatalf("the admin's CommitSnapshot with replace: %v", err)
	}
	if d := listedImage(t, opsImages, ref); d != replaced.GetImage().GetDigest() || d == before {
		t.Errorf("after the replace ListImages shows %s at %s; want the new %s (was %s)", ref, d, replaced.GetImage().GetDigest(), before)
	}
}

// TestCommittedImageSurvivesRestart: a committed image outlives a berthd
// killed with SIGKILL, then its snapshot's and source's deletion and
// containerd's garbage collection: a sandbox made from it still has the
// files.
func TestCommittedImageSurvivesRestart(t *testing.T) {
	need(t)
	e, p1, src := startBerthdWithSandbox(t, "cmr", "commit-rs")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	writeCommitChanges(t, e.sandboxes, src)
	snap := createSnapshotOn(t, e.sandboxes, src, nil)
	ref := "berth.test/commit-restart:v1"
	commitOn(t, e.sandboxes, e.images, snap.GetId(), ref, nil)
	// content_size_bytes is 0 when a blob of the image is missing.
	size := listed(t, e.images, ref).GetContentSizeBytes()
	if size == 0 {
		t.Fatalf("%s: no content size right after the commit", ref)
	}
	p1.signal(t, syscall.SIGKILL)
	p2 := startBerthd(t, e)
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: src}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: snap.GetId()}); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, e.ns)
	if got := listed(t, e.images, ref).GetContentSizeBytes(); got != size {
		t.Fatalf("%s after the restart and garbage collection: content of %d bytes, want %d (every blob kept)", ref, got, size)
	}
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: ref})
	if err != nil {
		t.Fatalf("CreateSandbox of %s after the restart: %v", ref, err)
	}
	child := created.GetSandbox().GetId()
	if got := shellOut(t, e.sandboxes, child, commitCheck); got != commitWant {
		t.Errorf("sandbox of the committed image after the restart shows\n%q\nwant\n%q", got, commitWant)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: child}); err != nil {
		t.Error(err)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestCommittedImagePrivate: an image a principal that is not an admin
// commits is that principal's: another tenant neither lists it nor
// creates a sandbox from it (by name, with a user name, with a
// request_id: NOT_FOUND IMAGE_NOT_FOUND as for a missing image) nor
// deletes it, and cannot commit over it; its committer lists, runs and
// deletes it; an admin lists it. An admin's commit is shared. Without
// this a tenant could plant "python:3" before an admin imports it and run
// its files in every other tenant's sandboxes.
func TestCommittedImagePrivate(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	aliceConn, bobConn, opsConn := a.conn(t, aliceToken), a.conn(t, bobToken), a.conn(t, opsToken)
	alice, bob, ops := berthv1.NewSandboxServiceClient(aliceConn), berthv1.NewSandboxServiceClient(bobConn), berthv1.NewSandboxServiceClient(opsConn)
	aliceImages, bobImages, opsImages := berthv1.NewImageServiceClient(aliceConn), berthv1.NewImageServiceClient(bobConn), berthv1.NewImageServiceClient(opsConn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := createSandboxOn(t, alice, &berthv1.CreateSandboxRequest{}).GetId()
	snap := createSnapshotOn(t, alice, id, nil)
	ref := "berth.test/x-" + id + "/y:1"
	commitOn(t, alice, opsImages, snap.GetId(), ref, nil)

	if listed(t, aliceImages, ref) == nil || listed(t, opsImages, ref) == nil {
		t.Errorf("%s is not listed to its committer alice or to admin ops", ref)
	}
	if listed(t, bobImages, ref) != nil {
		t.Errorf("bob's ListImages shows alice's committed image %s", ref)
	}
	for _, req := range []*berthv1.CreateSandboxRequest{
		{Image: ref},
		{Image: ref, User: "root"},
		{Image: ref, RequestId: "private-image"},
	} {
		resp, err := bob.CreateSandbox(ctx, req)
		if err == nil {
			bob.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
		}
		if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonImageNotFound {
			t.Errorf("bob's CreateSandbox(%v) of alice's image: %v, want NOT_FOUND IMAGE_NOT_FOUND", req, err)
		}
	}
	bobSandbox := createSandboxOn(t, bob, &berthv1.CreateSandboxRequest{}).GetId()
	bobSnap := createSnapshotOn(t, bob, bobSandbox, nil)
	_, err := bob.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: bobSnap.GetId(), Reference: ref})
	if status.Code(err) != codes.AlreadyExists || rpcstatus.Reason(err) != rpcstatus.ReasonImageExists {
		t.Errorf("bob's CommitSnapshot to alice's %s: %v, want ALREADY_EXISTS IMAGE_EXISTS", ref, err)
	}
	_, err = bobImages.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: ref})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonImageNotFound {
		t.Errorf("bob's DeleteImage of alice's image: %v, want NOT_FOUND IMAGE_NOT_FOUND", err)
	}
	_, err = bobImages.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: env.image})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("bob's DeleteImage of the shared %s: %v, want PERMISSION_DENIED", env.image, err)
	}
	createSandboxOn(t, alice, &berthv1.CreateSandboxRequest{Image: ref})

	// An admin's commit is shared.
	shared := "berth.test/x-" + id + "/shared:1"
	opsSandbox := createSandboxOn(t, ops, &berthv1.CreateSandboxRequest{}).GetId()
	commitOn(t, ops, opsImages, createSnapshotOn(t, ops, opsSandbox, nil).GetId(), shared, nil)
	if listed(t, bobImages, shared) == nil {
		t.Errorf("bob's ListImages does not show admin ops's committed image %s", shared)
	}
	createSandboxOn(t, bob, &berthv1.CreateSandboxRequest{Image: shared})

	if _, err := aliceImages.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: ref}); err != nil {
		t.Errorf("alice's DeleteImage of her own %s: %v", ref, err)
	}
	if listed(t, opsImages, ref) != nil {
		t.Errorf("%s is still listed after alice deleted it", ref)
	}

	// An admin's import under the name of a private image makes it the
	// admin's shared image: the tenant's claim on the name does not hide it.
	squat := "berth.test/x-" + id + "/squat:1"
	commitOn(t, alice, opsImages, snap.GetId(), squat, nil)
	if err := importImageTo(ctx, opsImages, os.Getenv("BERTH_TEST_IMAGE"), squat); err != nil {
		t.Fatalf("admin ops's import of %s over alice's private image: %v", squat, err)
	}
	if listed(t, bobImages, squat) == nil {
		t.Errorf("bob's ListImages does not show %s, imported by admin ops over alice's private image", squat)
	}
	createSandboxOn(t, bob, &berthv1.CreateSandboxRequest{Image: squat})
	_, err = aliceImages.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: squat})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("alice's DeleteImage of %s after ops imported it: %v, want PERMISSION_DENIED", squat, err)
	}
}

// TestCommitSparseFileBounded: a snapshot holding a 1 GiB sparse file
// takes no disk, and its layer compresses to about a megabyte, but
// unpacking the committed image writes the gigabyte in full. Under
// --max-image-store-bytes the commit counts the layer's uncompressed
// bytes, as an import counts an archive's, and is refused RESOURCE_EXHAUSTED
// NO_SPACE before containerd's diff reads the file; nothing is stored.
func TestCommitSparseFileBounded(t *testing.T) {
	need(t)
	st, err := os.Stat(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	e := newInProcessEnvWith(t, "commit-sparse", server.Config{TaskRestartLimit: -1}, func(c *runtime.Config) {
		c.MaxImageStoreBytes = uint64(st.Size()) + 64<<20
	}, nil)
	e.importBase(t)
	id := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{}).GetId()
	shellOut(t, e.sandboxes, id, "dd if=/dev/zero of=/workspace/sparse bs=1 count=0 seek=1073741824 2>/dev/null; echo more >/workspace/small")
	snap := createSnapshotOn(t, e.sandboxes, id, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ref = "berth.test/sparse:1"
	_, err = e.sandboxes.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap.GetId(), Reference: ref})
	if err == nil {
		e.images.DeleteImage(context.Background(), &berthv1.DeleteImageRequest{Name: ref})
	}
	if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonNoSpace {
		t.Errorf("CommitSnapshot of a snapshot holding a 1 GiB sparse file under a 64 MiB image store room: %v, want RESOURCE_EXHAUSTED NO_SPACE", err)
	}
	if listed(t, e.images, ref) != nil {
		t.Errorf("%s is stored after a refused commit", ref)
	}
	// Without the sparse file the commit fits.
	shellOut(t, e.sandboxes, id, "rm /workspace/sparse")
	commitOn(t, e.sandboxes, e.images, createSnapshotOn(t, e.sandboxes, id, nil).GetId(), ref, nil)
}

// TestPrivateImagesCapped: one snapshot can be committed under any number
// of names, each a private image that every ListImages walks; a
// principal that is not an admin holds at most
// --max-snapshots-per-principal of them (RESOURCE_EXHAUSTED
// SNAPSHOT_LIMIT), and deleting one makes room. An admin's shared commits
// are not counted.
func TestPrivateImagesCapped(t *testing.T) {
	need(t)
	a := startAuthServerWith(t, server.Config{TaskRestartLimit: -1, MaxSnapshotsPerPrincipal: 2})
	aliceConn, opsConn := a.conn(t, aliceToken), a.conn(t, opsToken)
	alice, aliceImages, opsImages := berthv1.NewSandboxServiceClient(aliceConn), berthv1.NewImageServiceClient(aliceConn), berthv1.NewImageServiceClient(opsConn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := createSandboxOn(t, alice, &berthv1.CreateSandboxRequest{}).GetId()
	snap := createSnapshotOn(t, alice, id, nil).GetId()
	prefix := "berth.test/cap-" + id + "/x:"
	commitOn(t, alice, opsImages, snap, prefix+"1", nil)
	commitOn(t, alice, opsImages, snap, prefix+"2", nil)
	_, err := alice.CommitSnapshot(ctx, &berthv1.CommitSnapshotRequest{SnapshotId: snap, Reference: prefix + "3"})
	if err == nil {
		opsImages.DeleteImage(context.Background(), &berthv1.DeleteImageRequest{Name: prefix + "3"})
	}
	if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonSnapshotLimit {
		t.Errorf("alice's third private image under a cap of 2: %v, want RESOURCE_EXHAUSTED SNAPSHOT_LIMIT", err)
	}
	if _, err := aliceImages.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: prefix + "1"}); err != nil {
		t.Fatal(err)
	}
	commitOn(t, alice, opsImages, snap, prefix+"3", nil)
}
