package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
)

// newStandbyEnv is an in-process berthd keeping n fork standby members
// per parent (server.Config.ForkStandby), with a sandbox network of its
// own; at cleanup its sandboxes, then its network, are removed.
func newStandbyEnv(t *testing.T, name string, n int) (*berthEnv, *network.Manager) {
	t.Helper()
	return newStandbyEnvWith(t, name, server.Config{ForkStandby: n})
}

// newStandbyEnvWith is newStandbyEnv with cfg's limits (its ForkStandby
// standby members per parent).
func newStandbyEnvWith(t *testing.T, name string, cfg server.Config) (*berthEnv, *network.Manager) {
	t.Helper()
	ncfg := network.Config{Bridge: "bt" + randHex(4), Subnet: freeSubnet(t), StateDir: filepath.Join(t.TempDir(), "net"), DNSUpstreams: []string{startFakeDNS(t).addr}}
	nm, err := network.New(ncfg, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	var e *berthEnv
	// Registered first, so it runs last: after the service closed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if e != nil {
			sbs, _ := e.rt.List(ctx, nil)
			for _, sb := range sbs {
				e.rt.Delete(ctx, sb.ID)
			}
		}
		if err := nm.Remove(ctx); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
	})
	cfg.Network, cfg.DefaultDiskBytes = nm, testDiskQuota()
	e = newInProcessEnv(t, name, cfg)
	return e, nm
}

// standbyMembers returns the ids of the standby members of parent that
// containerd holds in rt's namespace.
func standbyMembers(t testing.TB, rt *runtime.Runtime, parent string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sbs, err := rt.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		if sb.Pooled && sb.Fork.Parent == parent {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// needIDMap fails the test when the environment's roots are not idmapped
// mounts: standby members need them, and this machine has them
// (RUNTIME-NOTES.md), so their absence is a broken setup, not a skip.
func needIDMap(t *testing.T) {
	t.Helper()
	if err := env.rt.IDMapped(); err != nil {
		t.Fatalf("standby members need idmapped roots: %v", err)
	}
}

// waitStandby waits until svc's pool holds n ready standby members of
// parent.
func waitStandby(t testing.TB, svc *server.Service, parent string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for svc.ForkStandbyReady(parent) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d standby members of %s ready after a minute, want %d", svc.ForkStandbyReady(parent), parent, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForkStandby: after a fork of one (cold: no standby member ready),
// berthd makes a standby member of the parent, not listed; the next fork
// of one is served by it (the child has the member's id) and the child is
// a fork's child in every way: the parent's files as of the fork, those
// written after the member was made included; its own writes seen by
// neither the parent nor its sibling; its own id range, its files owned
// as in the cold child; its own network address; its disk quota; a
// working exec; a root that is private (a mount the host makes under
// the child's root afterwards does not appear inside) with nothing of
// the placeholder left. A fork with a request_id is cold. Deleting the
// parent deletes its standby member.
func TestForkStandby(t *testing.T) {
	need(t)
	needIDMap(t)
	e, nm := newStandbyEnv(t, "fsb", 1)
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Network: egress(), Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := resp.GetSandbox().GetId()
	shellOut(t, svc, pid, "mkdir -p /workspace/d && echo one >/workspace/d/a")

	cold := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0]
	waitStandby(t, e.svc, pid, 1)
	members := standbyMembers(t, e.rt, pid)
	if len(members) != 1 {
		t.Fatalf("standby members of %s: %v, want one", pid, members)
	}
	if rec, err := e.rt.Get(ctx, members[0]); err == nil {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", rec.TaskPID))
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				t.Logf("standby member %s's waiting agent: %s", members[0], strings.Join(strings.Fields(line), " "))
			}
		}
	}
	list, err := svc.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.GetSandboxes() {
		if sb.GetId() == members[0] {
			t.Errorf("ListSandboxes lists standby member %s", members[0])
		}
	}
	if _, err := svc.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: members[0]}); err == nil {
		t.Errorf("GetSandbox of standby member %s answered", members[0])
	}

	// Written after the member was made: the fork must see it.
	shellOut(t, svc, pid, "echo two >/workspace/d/b")
	began := time.Now()
	child := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1, Labels: map[string]string{"child": "yes"}})[0]
	t.Logf("ForkSandbox of 1 from a standby member took %v", time.Since(began))
	id := child.GetId()
	if id != members[0] {
		t.Fatalf("fork child %s, want the standby member %s", id, members[0])
	}
	if child.GetForkedFrom() != pid || child.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING ||
		child.GetLabels()["team"] != "a" || child.GetLabels()["child"] != "yes" {
		t.Errorf("standby child %v: want forked from %s, RUNNING, labels team=a child=yes", child, pid)
	}
	if got := shellOut(t, svc, id, "cat /workspace/d/a /workspace/d/b; stat -c %u:%g /workspace/d/a /workspace/d"); got != shellOut(t, svc, cold.GetId(), "echo one; echo two; stat -c %u:%g /workspace/d/a /workspace/d") {
		t.Errorf("standby child reads %q, want the parent's files owned as in the cold child", got)
	}

	// Writes are each sandbox's own.
	shellOut(t, svc, id, "echo mine >/workspace/d/c")
	for _, other := range []string{pid, cold.GetId()} {
		if got := shellOut(t, svc, other, "ls /workspace/d/c 2>/dev/null | wc -l"); got != "0\n" {
			t.Errorf("%s sees the standby child's write: %q", other, got)
		}
	}

	// Its own id range: the host sees its files in it.
	rec, err := e.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	coldRec, err := e.rt.Get(ctx, cold.GetId())
	if err != nil {
		t.Fatal(err)
	}
	parentRec, err := e.rt.Get(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.IDBase == coldRec.IDBase || rec.IDBase == parentRec.IDBase || rec.Pooled || rec.Owner != coldRec.Owner || rec.Fork.Parent != pid {
		t.Errorf("standby child's record: base %d (cold child %d, parent %d), pooled %v, owner %q (cold %q), fork of %q", rec.IDBase, coldRec.IDBase, parentRec.IDBase, rec.Pooled, rec.Owner, coldRec.Owner, rec.Fork.Parent)
	}
	root := filepath.Join(e.stateDir, "s", id, "root")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "workspace/d/c"), &st); err != nil || st.Uid != rec.IDBase || st.Gid != rec.IDBase {
		t.Errorf("host stat of the child's new file: %d:%d, %v; want its range's root %d", st.Uid, st.Gid, err, rec.IDBase)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "s", id, "standby", ".berth-next", "workspace")); err == nil {
		t.Error("the child's root is still mounted at its placeholder on the host")
	}

	// Its own address.
	addr, ok := nm.Addr(id)
	coldAddr, _ := nm.Addr(cold.GetId())
	parentAddr, _ := nm.Addr(pid)
	if !ok || addr == coldAddr || addr == parentAddr {
		t.Errorf("standby child's address %v (%v), cold child's %v, parent's %v: want one of its own", addr, ok, coldAddr, parentAddr)
	}
	if got := shellOut(t, svc, id, "grep -c '"+addr.String()+"' /proc/net/fib_trie || true"); got == "0\n" {
		t.Errorf("standby child's interfaces lack its address %v", addr)
	}

	// Its quota.
	if q := testDiskQuota(); q > 0 {
		mib := q>>20 + 8
		r, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: fmt.Sprintf("dd if=/dev/zero of=/workspace/big bs=1M count=%d conv=fsync 2>&1; echo rc=$?", mib)}})
		if err != nil {
			t.Fatal(err)
		}
		if out := string(r.GetStdout()); strings.Contains(out, "rc=0") || !strings.Contains(out, "quota") && !strings.Contains(out, "space") {
			t.Errorf("writing %d MiB past the quota of %d bytes in the standby child: %q; want a quota or space error", mib, q, out)
		}
		shellOut(t, svc, id, "rm -f /workspace/big")
	}

	// Private: a mount the host makes under the child's root does not
	// reach it, and no mount of its is anyone's slave or peer.
	shellOut(t, svc, id, "mkdir -p /workspace/m")
	m := filepath.Join(root, "workspace/m")
	if err := unix.Mount("berth-standby-test", m, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(m, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(m, "from-host"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := shellOut(t, svc, id, "ls -A /workspace/m | wc -l; grep -cE 'shared:|master:|berth-next|/standby' /proc/self/mountinfo || true"); got != "0\n0\n" {
		t.Errorf("in the standby child, a host mount under its root and propagation marks: %q, want 0 and 0", got)
	}

	// A fork with a request_id takes the cold path; the member stays.
	waitStandby(t, e.svc, pid, 1)
	refill := standbyMembers(t, e.rt, pid)
	byReq := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1, RequestId: "standby-req"})[0]
	if byReq.GetId() == refill[0] || e.svc.ForkStandbyReady(pid) != 1 {
		t.Errorf("fork with a request_id made %s (member %v, %d ready); want a cold child, the member kept", byReq.GetId(), refill, e.svc.ForkStandbyReady(pid))
	}

	// A member whose mount points the parent's workload turned into
	// symbolic links is not switched through them: the fork makes its
	// child the cold way, under an id of its own, and removes the member.
	shellOut(t, svc, pid, "mv /etc /etc.real && ln -s etc.real /etc")
	linked := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0]
	if linked.GetId() == refill[0] {
		t.Errorf("fork of a parent whose /etc is a link used standby member %s", refill[0])
	}
	if got := shellOut(t, svc, linked.GetId(), "readlink /etc; cat /workspace/d/a"); got != "etc.real\none\n" {
		t.Errorf("cold child of the linked parent: %q", got)
	}
	if _, err := e.rt.Get(ctx, refill[0]); !errors.Is(err, runtime.ErrSandboxNotFound) {
		t.Errorf("Get of the unusable standby member %s: %v, want not found", refill[0], err)
	}
	waitStandby(t, e.svc, pid, 1)
	refill = standbyMembers(t, e.rt, pid)

	// Deleting the parent deletes its member.
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: pid}); err != nil {
		t.Fatal(err)
	}
	if left := standbyMembers(t, e.rt, pid); len(left) != 0 {
		t.Errorf("standby members of deleted %s: %v, want none", pid, left)
	}
	if _, err := e.rt.Get(ctx, refill[0]); err == nil {
		t.Errorf("standby member %s outlived its parent", refill[0])
	} else if !errors.Is(err, runtime.ErrSandboxNotFound) {
		t.Errorf("Get of standby member %s after its parent's deletion: %v, want not found", refill[0], err)
	}
}

// switchers returns the pids of the processes running `berth-agent
// switch-root` on this host (standby members' switchers).
func switchers(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.HasSuffix(string(cmdline), "\x00switch-root\x00") && strings.Contains(string(cmdline), runtime.AgentPath) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestForkStandbyRestart: berthd (the binary, --fork-standby 1) makes a standby member after a fork of one; killed (SIGKILL),
// it leaves no switcher running, and the next berthd removes the member
// at its start; the parent's next fork of one works.
func TestForkStandbyRestart(t *testing.T) {
	need(t)
	needIDMap(t)
	e := newBinaryEnv(t, "fsr")
	p1 := startBerthd(t, e, "--fork-standby", "1")
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fsb-rs", Image: baseImage})
	if err != nil {
		t.Fatalf("create sandbox fsb-rs: %v", err)
	}
	pid := created.GetSandbox().GetId()
	forkOn(t, e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	var member string
	for deadline := time.Now().Add(time.Minute); member == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no standby member of the parent a minute after its fork")
		}
		if ids := standbyMembers(t, e.rt, pid); len(ids) == 1 {
			if sb, err := e.rt.Get(ctx, ids[0]); err == nil && sb.Running {
				member = ids[0]
			}
		}
	}
	p1.signal(t, syscall.SIGKILL)
	for deadline := time.Now().Add(30 * time.Second); len(switchers(t)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("switchers %v still run 30 s after berthd was killed", switchers(t))
		}
	}
	p2 := startBerthd(t, e, "--fork-standby", "1")
	if _, err := e.rt.Get(ctx, member); !errors.Is(err, runtime.ErrSandboxNotFound) {
		t.Errorf("standby member %s after berthd's restart: %v, want removed", member, err)
	}
	again := forkOn(t, e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0]
	if got := shellOut(t, e.sandboxes, again.GetId(), "echo ok"); got != "ok\n" {
		t.Errorf("child forked after the restart printed %q", got)
	}
	p2.signal(t, syscall.SIGTERM)
}

// TestForkStandbyMany: a berthd keeping up to 3 standby members per
// parent makes as many as the parent's largest fork had children (3
// after a fork of 3, none more after a fork of 1); a fork of 3 is
// served by all three, each child with the parent's files, its own
// writes and its own address; a fork of 5 takes the 3 members for its
// first children and creates 2 the cold way beside them, all of them
// working.
func TestForkStandbyMany(t *testing.T) {
	need(t)
	needIDMap(t)
	e, nm := newStandbyEnv(t, "fsbmany", 3)
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Network: egress()})
	if err != nil {
		t.Fatal(err)
	}
	pid := resp.GetSandbox().GetId()
	shellOut(t, svc, pid, "echo parent >/workspace/f")

	forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	waitStandby(t, e.svc, pid, 1)
	forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 3})
	waitStandby(t, e.svc, pid, 3)
	forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1}) // takes one; the count stays 3
	waitStandby(t, e.svc, pid, 3)
	members := standbyMembers(t, e.rt, pid)
	if len(members) != 3 {
		t.Fatalf("standby members of %s after forks of 1, 3 and 1: %v, want three", pid, members)
	}

	shellOut(t, svc, pid, "echo later >>/workspace/f")
	three := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 3})
	var ids []string
	addrs := map[string]bool{}
	for i, c := range three {
		ids = append(ids, c.GetId())
		if got := shellOut(t, svc, c.GetId(), fmt.Sprintf("cat /workspace/f; echo %d >/workspace/mine; cat /workspace/mine", i)); got != fmt.Sprintf("parent\nlater\n%d\n", i) {
			t.Errorf("child %s of the fork of 3 printed %q, want the parent's file then its own write %d", c.GetId(), got, i)
		}
		a, ok := nm.Addr(c.GetId())
		if !ok || addrs[a.String()] {
			t.Errorf("child %s's address %v (%v): want one of its own", c.GetId(), a, ok)
		}
		addrs[a.String()] = true
	}
	if !sameSet(ids, members) {
		t.Errorf("the fork of 3 made %v, want its three standby members %v", ids, members)
	}
	if got := shellOut(t, svc, pid, "cat /workspace/mine 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Errorf("the parent sees a child's write: %q", got)
	}

	waitStandby(t, e.svc, pid, 3)
	members = standbyMembers(t, e.rt, pid)
	five := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 5})
	served := 0
	for _, c := range five {
		if slices.Contains(members, c.GetId()) {
			served++
		}
		if got := shellOut(t, svc, c.GetId(), "cat /workspace/f"); got != "parent\nlater\n" {
			t.Errorf("child %s of the fork of 5 printed %q, want the parent's file", c.GetId(), got)
		}
	}
	if served != 3 {
		t.Errorf("%d of the fork of 5's children were standby members (%v), want 3", served, members)
	}
}

// TestForkStandbyCaps: a standby member counts against its parent's
// owner's caps and gives way to that owner's sandboxes. With a cap of 3
// sandboxes: the parent, a fork's child and the member fill it; a create
// then removes the member and is admitted; no member is made while the
// cap is full, so the next fork of the parent is refused as at any cap;
// after deletes the member is made again and serves the next fork.
func TestForkStandbyCaps(t *testing.T) {
	need(t)
	needIDMap(t)
	e, _ := newStandbyEnvWith(t, "fsbcap", server.Config{ForkStandby: 1, MaxSandboxesPerPrincipal: 3, TaskRestartLimit: -1})
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid := createSandboxOn(t, svc, &berthv1.CreateSandboxRequest{Image: env.image, Network: egress()}).GetId()
	first := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0].GetId()
	waitStandby(t, e.svc, pid, 1)
	member := standbyMembers(t, e.rt, pid)
	if len(member) != 1 {
		t.Fatalf("standby members of %s: %v, want one", pid, member)
	}

	// The parent, its child and the member fill the cap: the owner's
	// create is admitted in the member's place.
	other := createSandboxOn(t, svc, &berthv1.CreateSandboxRequest{Image: env.image, Network: egress()}).GetId()
	if left := standbyMembers(t, e.rt, pid); len(left) != 0 {
		t.Errorf("standby members of %s after the create at the cap: %v, want none (it gives way)", pid, left)
	}
	if n := e.svc.ForkStandbyReady(pid); n != 0 {
		t.Errorf("%d standby members of %s ready with the cap full, want 0", n, pid)
	}
	_, err := svc.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	if b := fleetBusyOf(err); b == nil || b.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_SANDBOXES {
		t.Fatalf("ForkSandbox with the cap full: %v, want FLEET_BUSY PRINCIPAL_SANDBOXES", err)
	}

	// Room again: the member is made again and serves the next fork.
	for _, id := range []string{other, first} {
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	waitStandby(t, e.svc, pid, 1)
	member = standbyMembers(t, e.rt, pid)
	child := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0].GetId()
	if len(member) != 1 || child != member[0] {
		t.Errorf("the fork after the deletes made %s, want its standby member %v", child, member)
	}
	// Parent, child and the next member: the cap, not past it.
	waitStandby(t, e.svc, pid, 1)
	if n := countSandboxes(t, e); n != 3 {
		t.Errorf("containerd holds %d sandboxes of the principal, want 3 (its cap)", n)
	}
}

// countSandboxes returns how many sandboxes containerd holds in e's
// namespace, standby members included.
func countSandboxes(t *testing.T, e *berthEnv) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sbs, err := e.rt.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return len(sbs)
}

// fleetBusyOf returns the FleetBusy detail of gRPC error err, nil when it
// carries none.
func fleetBusyOf(err error) *berthv1.FleetBusy {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if b, ok := d.(*berthv1.FleetBusy); ok {
			return b
		}
	}
	return nil
}

// TestForkStandbyPrivateImage: a standby member of a sandbox made from a
// private image (its principal's commit) is made — it runs none of the
// image's files, its root a placeholder until the fork — and serves the
// next fork, whose child has the image's files. (A warm-pool member of
// the image is still refused: TestCommittedImagePrivate.)
func TestForkStandbyPrivateImage(t *testing.T) {
	need(t)
	needIDMap(t)
	e, _ := newStandbyEnvWith(t, "fsbpriv", server.Config{ForkStandby: 1, TaskRestartLimit: -1})
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base := createSandboxOn(t, svc, &berthv1.CreateSandboxRequest{Image: env.image}).GetId()
	shellOut(t, svc, base, "echo private >/workspace/f")
	snap := createSnapshotOn(t, svc, base, nil)
	ref := "berth.test/standby-" + base + "/img:1"
	if _, err := e.rt.CommitSnapshot(ctx, snap.GetId(), runtime.CommitOptions{Ref: ref, Owner: auth.RootPrincipal, Private: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.images.DeleteImage(context.Background(), &berthv1.DeleteImageRequest{Name: ref}) })

	pid := createSandboxOn(t, svc, &berthv1.CreateSandboxRequest{Image: ref}).GetId()
	forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	waitStandby(t, e.svc, pid, 1)
	member := standbyMembers(t, e.rt, pid)
	child := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0].GetId()
	if len(member) != 1 || child != member[0] {
		t.Errorf("the fork of a private image's sandbox made %s, want its standby member %v", child, member)
	}
	if got := shellOut(t, svc, child, "cat /workspace/f"); got != "private\n" {
		t.Errorf("the child served by the member printed %q, want the private image's file", got)
	}
}

// diskCapStandby makes env name whose principal's disk cap is three
// default disk quotas (ForkStandby 1), a parent with 1 MiB written, its
// fork's child and the parent's member, which fill that cap; it returns
// the env, the parent's and the child's ids and the quota in bytes.
func diskCapStandby(t *testing.T, name string) (e *berthEnv, pid, child string, quota uint64) {
	t.Helper()
	need(t)
	needIDMap(t)
	if quota = testDiskQuota(); quota == 0 {
		t.Fatal("disk quotas unsupported here: the member holds no disk to give")
	}
	e, _ = newStandbyEnvWith(t, name, server.Config{ForkStandby: 1, MaxDiskBytesPerPrincipal: 3 * quota, TaskRestartLimit: -1})
	pid = createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{Image: env.image, Network: egress()}).GetId()
	shellOut(t, e.sandboxes, pid, "head -c 1048576 /dev/urandom >/workspace/f && sync")
	child = forkOn(t, e.sandboxes, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})[0].GetId()
	waitStandby(t, e.svc, pid, 1)
	return e, pid, child, quota
}

// TestForkStandbyGivesWayToStoredDisk: a standby member holds its
// parent's disk quota against its owner's disk cap (and the server's disk
// budget), so a snapshot or a volume refused for that room must remove
// it, as a create does: with a cap of three quotas, the parent, a fork's
// child and the member fill it, and the owner's snapshot, then (the
// member made again) volume, are admitted in the member's place.
func TestForkStandbyGivesWayToStoredDisk(t *testing.T) {
	e, pid, child, _ := diskCapStandby(t, "fsbdisk")
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	resp, err := svc.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: pid})
	if err != nil {
		t.Fatalf("CreateSnapshot with the cap full of the parent, its child and its member: %v (FLEET_BUSY %v), want the member to give way", err, fleetBusyOf(err))
	}
	if left := standbyMembers(t, e.rt, pid); len(left) != 0 {
		t.Errorf("standby members of %s after the snapshot at the cap: %v, want none (it gives way)", pid, left)
	}
	if _, err := svc.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: resp.GetSnapshot().GetId()}); err != nil {
		t.Fatal(err)
	}

	// A delete lets the member be made again; the next fork takes it and
	// a new member fills the cap again.
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: child}); err != nil {
		t.Fatal(err)
	}
	waitStandby(t, e.svc, pid, 1)
	forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 1})
	waitStandby(t, e.svc, pid, 1)
	name := "v-" + randHex(4)
	if _, err := svc.CreateVolume(ctx, &berthv1.CreateVolumeRequest{Name: name, QuotaBytes: 2 << 20}); err != nil {
		t.Fatalf("CreateVolume with the cap full of the parent, its child and its member: %v (FLEET_BUSY %v), want the member to give way", err, fleetBusyOf(err))
	}
	t.Cleanup(func() { svc.DeleteVolume(context.Background(), &berthv1.DeleteVolumeRequest{Name: name}) })
	if left := standbyMembers(t, e.rt, pid); len(left) != 0 {
		t.Errorf("standby members of %s after the volume at the cap: %v, want none (it gives way)", pid, left)
	}
}

// TestForkStandbyKeptWhenNoHelp: a refusal that removing members cannot
// cure removes none: with a cap of three disk quotas filled by the
// parent, a fork's child and the member, a create asking for two quotas
// is refused (the member frees one) and the member stays. Else any
// caller — another tenant at the server's budget too — could make berthd
// remove every member with creates that never fit, at its request rate.
func TestForkStandbyKeptWhenNoHelp(t *testing.T) {
	e, pid, _, quota := diskCapStandby(t, "fsbkeep")
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	member := standbyMembers(t, e.rt, pid)

	_, err := svc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{DiskBytes: 2 * quota}})
	if b := fleetBusyOf(err); b == nil || b.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_PRINCIPAL_DISK {
		t.Fatalf("CreateSandbox of two quotas with one free and one in a member: %v, want FLEET_BUSY PRINCIPAL_DISK", err)
	}
	if left := standbyMembers(t, e.rt, pid); len(left) != 1 || left[0] != member[0] || e.svc.ForkStandbyReady(pid) != 1 {
		t.Errorf("standby members of %s after a create they could not make room for: %v (%d ready), want %v kept", pid, left, e.svc.ForkStandbyReady(pid), member)
	}
}

// TestForkStandbyAfterSnapshotDeleted: a member that gave way to a
// snapshot is made again once that snapshot is deleted (the room is
// back), not only after a sandbox's delete.
func TestForkStandbyAfterSnapshotDeleted(t *testing.T) {
	e, pid, _, _ := diskCapStandby(t, "fsbsnapdel")
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := svc.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: pid})
	if err != nil {
		t.Fatalf("CreateSnapshot at the cap: %v", err)
	}
	if n := e.svc.ForkStandbyReady(pid); n != 0 {
		t.Fatalf("%d standby members of %s after the snapshot at the cap, want 0 (it gave way)", n, pid)
	}
	if _, err := svc.DeleteSnapshot(ctx, &berthv1.DeleteSnapshotRequest{SnapshotId: resp.GetSnapshot().GetId()}); err != nil {
		t.Fatal(err)
	}
	waitStandby(t, e.svc, pid, 1)
}
