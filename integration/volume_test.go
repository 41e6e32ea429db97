package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// createVolumeOn makes a volume of quota bytes on svc with a fresh name,
// deleted at cleanup (after the sandboxes registered later).
func createVolumeOn(t *testing.T, svc berthv1.SandboxServiceClient, quota uint64) *berthv1.Volume {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "v-" + sandboxid.New("", 8)
	resp, err := svc.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: name, QuotaBytes: quota})
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	t.Cleanup(func() { svc.DeleteVolume(context.Background(), &berthv1.DeleteVolumeRequest{Name: name}) })
	return resp.GetVolume()
}

// runShell runs cmd in sandbox id and returns its result, stdout and
// stderr, whatever its exit code.
func runShell(t *testing.T, svc berthv1.SandboxServiceClient, id, cmd string) (int32, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	if err != nil {
		t.Fatalf("Run(%q) in %s: %v", cmd, id, err)
	}
	return r.GetResult().GetExitCode(), string(r.GetStdout()), string(r.GetStderr())
}

// badField is the field a BadRequest detail of err names, or "".
func badField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestVolumeShared: a volume written by uid 1000 of one sandbox is read
// and written by uid 1000 of another sandbox of a different id range (an
// idmapped mount each) and outlives both; a read-only mount refuses
// writes; a write past the quota fails in the sandbox with EDQUOT while
// the sandbox's own disk still takes writes; deleting the volume while
// sandboxes mount it is FAILED_PRECONDITION VOLUME_IN_USE naming them;
// GetSandbox lists the mounts, GetVolume the usage and the users.
func TestVolumeShared(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const quota = 8 << 20
	vol := createVolumeOn(t, svc, quota)
	name := vol.GetName()
	if vol.GetQuotaBytes() != quota || vol.GetUsedBytes() > 64<<10 || len(vol.GetSandboxIds()) != 0 {
		t.Errorf("new volume = %v; want quota %d, nearly nothing used, no sandboxes", vol, quota)
	}

	a := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000", Volumes: []*berthv1.VolumeMount{{Name: name, Path: "/data"}}})
	b := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000", Volumes: []*berthv1.VolumeMount{{Name: name, Path: "/mnt/vol"}}})
	ro := newSandbox(t, &berthv1.CreateSandboxRequest{Volumes: []*berthv1.VolumeMount{{Name: name, Path: "/ro", ReadOnly: true}}})
	if a.GetHostIdBase() == b.GetHostIdBase() || a.GetHostIdBase() == 0 {
		t.Fatalf("sandboxes share host id base %d: the test needs two ranges", a.GetHostIdBase())
	}
	if got := b.GetVolumes(); len(got) != 1 || got[0].GetName() != name || got[0].GetPath() != "/mnt/vol" || got[0].GetReadOnly() {
		t.Errorf("CreateSandbox's volumes = %v, want %s at /mnt/vol read-write", got, name)
	}

	if got := shellOut(t, svc, a.GetId(), "echo hello > /data/f && stat -c %u:%g /data/f"); got != "1000:1000\n" {
		t.Errorf("owner of a file uid 1000 wrote in sandbox a = %q, want 1000:1000", got)
	}
	if got := shellOut(t, svc, b.GetId(), "stat -c %u:%g /mnt/vol/f && echo more >> /mnt/vol/f && cat /mnt/vol/f"); got != "1000:1000\nhello\nmore\n" {
		t.Errorf("sandbox b (another id range) reads and appends: %q, want the owner 1000:1000 and both lines", got)
	}
	if got := shellOut(t, svc, ro.GetId(), "cat /ro/f"); got != "hello\nmore\n" {
		t.Errorf("read-only mount reads %q", got)
	}
	if code, _, stderr := runShell(t, svc, ro.GetId(), "echo x > /ro/g"); code == 0 || !strings.Contains(stderr, "Read-only file system") {
		t.Errorf("write into a read-only mount: exit %d, stderr %q; want a failure with EROFS", code, stderr)
	}

	// Past the quota: EDQUOT in the sandbox, the sandbox's own disk
	// still writable.
	code, _, stderr := runShell(t, svc, a.GetId(), "dd if=/dev/zero of=/data/big bs=1M count=32 conv=fsync")
	if code == 0 || !strings.Contains(stderr, "quota") {
		t.Errorf("dd of 32 MiB into an 8 MiB volume: exit %d, stderr %q; want a failure with EDQUOT", code, stderr)
	}
	shellOut(t, svc, a.GetId(), "echo fine > /tmp/own")
	got, err := svc.GetVolume(ctx, &berthv1.GetVolumeRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if used := got.GetVolume().GetUsedBytes(); used < 4<<20 || used > quota {
		t.Errorf("used_bytes after filling = %d, want within (4 MiB, %d]", used, quota)
	}
	want := []string{a.GetId(), b.GetId(), ro.GetId()}
	slices.Sort(want)
	if ids := got.GetVolume().GetSandboxIds(); !slices.Equal(ids, want) {
		t.Errorf("GetVolume sandbox_ids = %v, want %v", ids, want)
	}
	shellOut(t, svc, a.GetId(), "rm /data/big")

	_, err = svc.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: name})
	if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeInUse || !strings.Contains(err.Error(), a.GetId()) {
		t.Fatalf("DeleteVolume in use: %v, want FAILED_PRECONDITION VOLUME_IN_USE naming %s", err, a.GetId())
	}

	for _, id := range []string{a.GetId(), b.GetId(), ro.GetId()} {
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Outlives them: a new sandbox reads what they wrote.
	d := newSandbox(t, &berthv1.CreateSandboxRequest{Volumes: []*berthv1.VolumeMount{{Name: name, Path: "/w"}}})
	if got := shellOut(t, svc, d.GetId(), "cat /w/f; ls /w"); got != "hello\nmore\nf\n" {
		t.Errorf("after the sandboxes went, a new one reads %q", got)
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: d.GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: name}); err != nil {
		t.Fatalf("DeleteVolume once unused: %v", err)
	}
	if _, err := svc.GetVolume(ctx, &berthv1.GetVolumeRequest{Name: name}); status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeNotFound {
		t.Errorf("GetVolume after delete: %v, want NOT_FOUND VOLUME_NOT_FOUND", err)
	}
}

// TestVolumeOwnership: another principal's volume is NOT_FOUND to every
// call and to a create that mounts it, and missing from their list.
func TestVolumeOwnership(t *testing.T) {
	need(t)
	s := startAuthServer(t)
	alice, bob := berthv1.NewSandboxServiceClient(s.conn(t, aliceToken)), berthv1.NewSandboxServiceClient(s.conn(t, bobToken))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vol := createVolumeOn(t, alice, 4<<20)
	if vol.GetOwner() != "alice" {
		t.Errorf("owner %q, want alice", vol.GetOwner())
	}
	notFound := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeNotFound {
			t.Errorf("bob's %s of alice's volume: %v, want NOT_FOUND VOLUME_NOT_FOUND", what, err)
		}
	}
	_, err := bob.GetVolume(ctx, &berthv1.GetVolumeRequest{Name: vol.GetName()})
	notFound("GetVolume", err)
	_, err = bob.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: vol.GetName()})
	notFound("DeleteVolume", err)
	_, err = bob.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Volumes: []*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/data"}}})
	notFound("CreateSandbox mounting", err)
	if list, err := bob.ListVolumes(ctx, &berthv1.ListVolumesRequest{}); err != nil || len(list.GetVolumes()) != 0 {
		t.Errorf("bob's ListVolumes = %v, %v; want none", list.GetVolumes(), err)
	}
	list, err := alice.ListVolumes(ctx, &berthv1.ListVolumesRequest{})
	if err != nil || len(list.GetVolumes()) != 1 || list.GetVolumes()[0].GetName() != vol.GetName() {
		t.Errorf("alice's ListVolumes = %v, %v; want her volume", list.GetVolumes(), err)
	}
	// Names are the owner's: bob may hold one of the same name.
	if _, err := bob.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: vol.GetName(), QuotaBytes: 2 << 20}); err != nil {
		t.Errorf("bob's CreateVolume of alice's volume's name: %v", err)
	}
	bob.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: vol.GetName()})
	if _, err := alice.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: vol.GetName(), QuotaBytes: 2 << 20}); status.Code(err) != codes.AlreadyExists || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeExists {
		t.Errorf("alice's second CreateVolume of a name: %v, want ALREADY_EXISTS VOLUME_EXISTS", err)
	}
}

// TestVolumeBadInput: bad names, quotas and mount paths are
// INVALID_ARGUMENT naming the field; nothing is created.
func TestVolumeBadInput(t *testing.T) {
	need(t)
	svc := env.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name  string
		quota uint64
		field string
	}{
		{"", 1 << 20, "name"},
		{"Upper", 1 << 20, "name"},
		{"a/b", 1 << 20, "name"},
		{"..", 1 << 20, "name"},
		{strings.Repeat("a", 64), 1 << 20, "name"},
		{"ok", 1000, "quota_bytes"},
	} {
		_, err := svc.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: tc.name, QuotaBytes: tc.quota})
		if status.Code(err) != codes.InvalidArgument || badField(err) != tc.field {
			t.Errorf("CreateVolume(%q, %d): %v, want INVALID_ARGUMENT naming %s", tc.name, tc.quota, err, tc.field)
		}
	}
	vol := createVolumeOn(t, svc, 2<<20)
	for _, tc := range []struct {
		mounts []*berthv1.VolumeMount
		field  string
	}{
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "data"}}, "volumes[0].path"},
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/"}}, "volumes[0].path"},
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/proc/x"}}, "volumes[0].path"},
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/a/../b"}}, "volumes[0].path"},
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/.berth-run"}}, "volumes[0].path"},
		{[]*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/a"}, {Name: vol.GetName(), Path: "/a/b"}}, "volumes[1].path"},
		{[]*berthv1.VolumeMount{{Name: "BAD", Path: "/a"}}, "volumes[0].name"},
	} {
		_, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Volumes: tc.mounts})
		if status.Code(err) != codes.InvalidArgument || badField(err) != tc.field {
			t.Errorf("CreateSandbox with volumes %v: %v, want INVALID_ARGUMENT naming %s", tc.mounts, err, tc.field)
		}
	}
	_, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Volumes: []*berthv1.VolumeMount{{Name: "nope", Path: "/a"}}})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeNotFound {
		t.Errorf("CreateSandbox with a missing volume: %v, want NOT_FOUND VOLUME_NOT_FOUND", err)
	}
}

// TestVolumeGVisor: a gVisor sandbox (no user namespace of berthd's; its
// gofer serves the bind mount) reads what a runc sandbox's uid 1000 wrote
// as uid 1000's and writes files that the runc sandbox reads back.
func TestVolumeGVisor(t *testing.T) {
	needGVisor(t)
	svc := env.sandboxes
	vol := createVolumeOn(t, svc, 4<<20)
	mounts := []*berthv1.VolumeMount{{Name: vol.GetName(), Path: "/data"}}
	r := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000", Volumes: mounts})
	g := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor", User: "1000:1000", Volumes: mounts})
	shellOut(t, svc, r.GetId(), "echo from-runc > /data/r")
	if got := shellOut(t, svc, g.GetId(), "cat /data/r && stat -c %u /data/r && echo from-gvisor > /data/g"); got != "from-runc\n1000\n" {
		t.Errorf("gVisor sandbox reads %q, want the runc sandbox's line and owner 1000", got)
	}
	if got := shellOut(t, svc, r.GetId(), "cat /data/g && stat -c %u /data/g"); got != "from-gvisor\n1000\n" {
		t.Errorf("runc sandbox reads the gVisor sandbox's file as %q, want its line and owner 1000", got)
	}
}

// TestVolumeRestart: volumes and their count against the principal's disk
// cap survive a berthd killed with SIGKILL; the new berthd lists the
// sandbox that mounts a volume, and when that sandbox's task dies (its
// volume mount taken off the host first, as a reboot would) the restarted
// task mounts the volume again and reads what was written before.
func TestVolumeRestart(t *testing.T) {
	need(t)
	const quota = 8 << 20
	// Room for the volume and the sandbox's own 16 MiB quota, not for a
	// second volume.
	flags := []string{"--max-disk-bytes-per-principal", fmt.Sprint(28 << 20)}
	e := newBinaryEnv(t, "volrs")
	p1 := startBerthd(t, e, flags...)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := e.sandboxes.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: "keep", QuotaBytes: quota}); err != nil {
		t.Fatal(err)
	}
	overCap := func(when string) {
		t.Helper()
		_, err := e.sandboxes.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: "more", QuotaBytes: quota})
		if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonFleetBusy {
			t.Errorf("%s: a second 8 MiB volume under a 28 MiB cap holding 24: %v, want RESOURCE_EXHAUSTED FLEET_BUSY", when, err)
		}
	}
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "volrs", Image: baseImage,
		Resources: &berthv1.Resources{DiskBytes: 16 << 20},
		Volumes:   []*berthv1.VolumeMount{{Name: "keep", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	overCap("first berthd")
	id := created.GetSandbox().GetId()
	t.Cleanup(func() { e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id}) })
	shellOut(t, e.sandboxes, id, "echo kept > /data/f")
	if err := p1.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("berthd exited cleanly after SIGKILL?")
	}

	p2 := startBerthd(t, e, flags...)
	defer p2.signal(t, syscall.SIGTERM)
	v, err := e.sandboxes.GetVolume(ctx, &berthv1.GetVolumeRequest{Name: "keep"})
	if err != nil || !slices.Equal(v.GetVolume().GetSandboxIds(), []string{id}) || v.GetVolume().GetQuotaBytes() != quota {
		t.Fatalf("GetVolume after the restart = %v, %v; want quota %d mounted by %s", v, err, quota, id)
	}
	overCap("restarted berthd")

	// A reboot's unmount, then the task dies: its restart mounts again.
	mnt := filepath.Join(e.stateDir, "s", id, "volumes", "0")
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatalf("unmount %s: %v", mnt, err)
	}
	if err := unix.Kill(int(created.GetSandbox().GetRuntime().GetTaskPid()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// berthd restarts the task; a Run during the restart is refused
	// (the task it was admitted to died): retry, bounded.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "cat /data/f && echo again >> /data/f"}})
		if err == nil {
			if got := string(r.GetStdout()); r.GetResult().GetExitCode() != 0 || got != "kept\n" {
				t.Errorf("after the task's restart the volume reads %q (exit %d, %q), want kept", got, r.GetResult().GetExitCode(), r.GetStderr())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s does not run commands 2 min after its task was killed: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	g, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	if err != nil || g.GetSandbox().GetRuntime().GetAgentBootId() == created.GetSandbox().GetRuntime().GetAgentBootId() {
		t.Errorf("GetSandbox after the kill = %v, %v; want a new agent", g.GetSandbox().GetRuntime(), err)
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sandboxes.DeleteVolume(ctx, &berthv1.DeleteVolumeRequest{Name: "keep"}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
}

// TestVolumeOverlayfs: on the overlayfs snapshotter (no quota for a
// directory, no btrfs subvolume) every volume call and a create that
// mounts a volume are FAILED_PRECONDITION VOLUME_UNSUPPORTED naming the
// snapshotter, never a volume without a quota; nothing is created.
func TestVolumeOverlayfs(t *testing.T) {
	e := attackEnv(t, "volovl", "overlayfs", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unsupported := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonVolumeUnsupported || !strings.Contains(err.Error(), "overlayfs") {
			t.Errorf("%s on overlayfs: %v, want FAILED_PRECONDITION VOLUME_UNSUPPORTED naming overlayfs", what, err)
		}
	}
	_, err := e.sandboxes.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: "v", QuotaBytes: 1 << 20})
	unsupported("CreateVolume", err)
	_, err = e.sandboxes.ListVolumes(ctx, &berthv1.ListVolumesRequest{})
	unsupported("ListVolumes", err)
	_, err = e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Volumes: []*berthv1.VolumeMount{{Name: "v", Path: "/data"}}})
	unsupported("CreateSandbox with a volume", err)
	if list, err := e.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{}); err != nil || len(list.GetSandboxes()) != 0 {
		t.Errorf("sandboxes after the refused create: %v, %v; want none", list.GetSandboxes(), err)
	}
}
