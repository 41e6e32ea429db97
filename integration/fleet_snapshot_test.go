package integration

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFleetSnapshots runs the snapshot calls and fork across two nodes
// (btrfs, one containerd in two namespaces): a snapshot taken through the
// node that does not hold its sandbox, listed through both, a sandbox
// created from it through the other node (placed on the snapshot's),
// a fork through the other node (children on the parent's node, reachable
// through both, idempotent by request id), another principal answered
// NOT_FOUND word for word as for a missing snapshot, the holder restarted
// keeping its snapshot listed, and deletes through either node.
func TestFleetSnapshots(t *testing.T) {
	need(t)
	f := startFleetSnapshotter(t, []int{8, 8}, true, "", true, env.snapshotter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tlsCfg, err := client.TLSConfigFromFiles(f.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := client.Dial(ctx, f.nodes[1].addr, client.WithTLS(tlsCfg), client.WithToken(bobToken))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()

	// Two sandboxes: the second placed on n2 (the least loaded), the one
	// this test snapshots. n2 holds it; n1 (index 0) is the other node.
	var src string
	for _, id := range []string{"fs-a", "fs-b"} {
		sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image})
		if err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		if sb.GetNodeId() == "n2" {
			src = id
		}
	}
	if src == "" {
		t.Fatal("neither sandbox was placed on n2")
	}
	holder, other := f.alice[1], f.alice[0]
	run := func(c *client.Client, id, cmd string) string {
		t.Helper()
		res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: cmd})
		if err != nil || res.GetResult().GetExitCode() != 0 {
			t.Fatalf("run %q in %s: %v, %v (stderr %q)", cmd, id, res.GetResult(), err, res.GetStderr())
		}
		return string(res.GetStdout())
	}
	run(other, src, "echo one >/workspace/f")

	// Snapshot through n1, which does not hold the sandbox.
	snap, err := other.CreateSnapshot(ctx, src, map[string]string{"k": "v"})
	if err != nil {
		t.Fatalf("CreateSnapshot of %s through n1: %v", src, err)
	}
	if snap.GetSandboxId() != src || snap.GetOwner() != "alice" || snap.GetLabels()["k"] != "v" {
		t.Errorf("snapshot = %v, want of %s, owned by alice, labelled k=v", snap, src)
	}
	// It is on n2's containerd, not n1's.
	for _, n := range f.nodes {
		_, err := n.rt.GetSnapshot(ctx, snap.GetId())
		if want := n.id == "n2"; (err == nil) != want {
			t.Errorf("snapshot on %s's containerd: %v, want it there %v", n.id, err, want)
		}
	}
	listed := func(c *client.Client) bool {
		t.Helper()
		snaps, err := c.ListSnapshots(ctx)
		if err != nil {
			t.Fatalf("ListSnapshots: %v", err)
		}
		for _, s := range snaps {
			if s.GetId() == snap.GetId() {
				return true
			}
		}
		return false
	}
	for i, c := range f.alice {
		if !listed(c) {
			t.Errorf("ListSnapshots through n%d lacks %s", i+1, snap.GetId())
		}
	}

	// A sandbox from it through n1: placed on n2, with the snapshot's files.
	child, err := other.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "fs-child", FromSnapshot: snap.GetId()})
	if err != nil {
		t.Fatalf("CreateSandbox from %s through n1: %v", snap.GetId(), err)
	}
	if child.GetNodeId() != "n2" {
		t.Errorf("sandbox from the snapshot placed on %s, want n2 (the snapshot's node)", child.GetNodeId())
	}
	if got := run(other, "fs-child", "cat /workspace/f"); got != "one\n" {
		t.Errorf("file in the sandbox from the snapshot, through n1: %q, want one", got)
	}

	// Fork through n1: the children are n2's, reachable through both
	// nodes, and the same request gives the same children.
	kids, err := other.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: src, Count: 2, RequestId: "fork-1"})
	if err != nil {
		t.Fatalf("ForkSandbox of %s through n1: %v", src, err)
	}
	if len(kids) != 2 {
		t.Fatalf("fork made %d children, want 2", len(kids))
	}
	for _, k := range kids {
		if k.GetNodeId() != "n2" {
			t.Errorf("child %s on %s, want n2 (the parent's node)", k.GetId(), k.GetNodeId())
		}
		for i, c := range f.alice {
			if got := run(c, k.GetId(), "cat /workspace/f"); got != "one\n" {
				t.Errorf("child %s's file through n%d: %q, want one", k.GetId(), i+1, got)
			}
		}
	}
	again, err := f.alice[0].ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: src, Count: 2, RequestId: "fork-1"})
	if err != nil || len(again) != 2 || again[0].GetId() != kids[0].GetId() || again[1].GetId() != kids[1].GetId() {
		t.Errorf("the fork again with its request id: %v, %v; want the same children %s, %s", again, err, kids[0].GetId(), kids[1].GetId())
	}
	// bob may not fork alice's sandbox, through either node.
	if _, err := bob.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{SandboxId: src, Count: 1}); status.Code(err) != codes.NotFound {
		t.Errorf("bob's fork of alice's sandbox through n2: %v, want NOT_FOUND", err)
	}

	// bob: alice's snapshot is NOT_FOUND through either node, word for
	// word as a snapshot that does not exist.
	const missing = "snap-0000000000000000beef"
	bobOn1, err := client.Dial(ctx, f.nodes[0].addr, client.WithTLS(tlsCfg), client.WithToken(bobToken))
	if err != nil {
		t.Fatal(err)
	}
	defer bobOn1.Close()
	for i, b := range []*client.Client{bobOn1, bob} {
		errOf := func(id string) error { return b.DeleteSnapshot(ctx, id) }
		fromOf := func(id string) error {
			_, err := b.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{FromSnapshot: id})
			return err
		}
		for what, call := range map[string]func(string) error{"DeleteSnapshot": errOf, "CreateSandbox from_snapshot": fromOf} {
			theirs, none := call(snap.GetId()), call(missing)
			if status.Code(theirs) != codes.NotFound || strings.ReplaceAll(status.Convert(theirs).Message(), snap.GetId(), missing) != status.Convert(none).Message() {
				t.Errorf("bob's %s of alice's snapshot through n%d: %v; of a missing one: %v; want the same NOT_FOUND", what, i+1, theirs, none)
			}
		}
		if snaps, err := b.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
			t.Errorf("bob's ListSnapshots through n%d: %v, %v; want none", i+1, snaps, err)
		}
	}

	// n2 restarted: its snapshot stays listed through n1 once it is back.
	n2 := f.node("n2")
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	n2.start(t)
	deadline := time.Now().Add(time.Minute)
	for !listed(other) {
		if time.Now().After(deadline) {
			t.Fatalf("ListSnapshots through n1 lacks %s a minute after n2 restarted", snap.GetId())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Deletes: the child from the snapshot first (it uses it), then the
	// snapshot through n1; a second snapshot through n2 itself.
	for _, id := range []string{"fs-child", kids[0].GetId(), kids[1].GetId()} {
		if err := other.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s through n1: %v", id, err)
		}
	}
	if err := other.DeleteSnapshot(ctx, snap.GetId()); err != nil {
		t.Fatalf("DeleteSnapshot through n1: %v", err)
	}
	second, err := holder.CreateSnapshot(ctx, src, nil)
	if err != nil {
		t.Fatalf("CreateSnapshot through n2: %v", err)
	}
	if err := holder.DeleteSnapshot(ctx, second.GetId()); err != nil {
		t.Fatalf("DeleteSnapshot through n2: %v", err)
	}
	for i, c := range f.alice {
		snaps, err := c.ListSnapshots(ctx)
		if err != nil || len(snaps) != 0 {
			t.Errorf("ListSnapshots through n%d after the deletes: %v, %v; want none", i+1, snaps, err)
		}
		if err := c.DeleteSnapshot(ctx, snap.GetId()); status.Code(err) != codes.NotFound {
			t.Errorf("DeleteSnapshot of the deleted snapshot through n%d: %v, want NOT_FOUND", i+1, err)
		}
	}
	if _, err := n2.rt.GetSnapshot(ctx, snap.GetId()); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the deleted snapshot is still on n2's containerd: %v", err)
	}
}
