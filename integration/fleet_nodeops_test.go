package integration

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// TestFleetNodeOps runs the operator's side of a lost node (issue 22) with
// real containerd and etcd: the node credential cannot act as an admin
// while an admin's routed call still is one; RemoveNode refuses a live
// node; a lost node's sandbox is deleted by its owner; `berth node rm
// --dry-run` and `berth node rm` forget the node and its records; the
// node, started again with its sandboxes still running, deletes the one
// deleted while it was lost and records the other again, and so it does
// after its removal.
//
// Cost: two nodes on the suite's containerd, two sandboxes, two restarts.
func TestFleetNodeOps(t *testing.T) {
	need(t)
	f := startFleet(t, []int{4, 4}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n1, n2 := f.node("n1"), f.node("n2")
	for _, id := range []string{"no-1", "no-2"} {
		sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Labels: map[string]string{"node.berth.dev/id": "n2"}})
		if err != nil || sb.GetNodeId() != "n2" {
			t.Fatalf("create %s pinned to n2 = %v on %q", id, err, sb.GetNodeId())
		}
	}
	// ops, an admin by token, sees alice's sandbox on n2 through n1: the
	// forwarded call carries ops's token, and n2 accepts ops as an admin.
	if sb, err := f.ops.GetSandbox(ctx, "no-1"); err != nil || sb.GetNodeId() != "n2" {
		t.Errorf("admin ops's GetSandbox of alice's no-1 through n1 = %v, %v; want it from n2", sb, err)
	}

	// The node credential (berth-node's client certificate) on n1: no
	// admin call, neither as itself nor naming the admin ops.
	certFile, keyFile, err := f.certs.ClientFiles("berth-node")
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := client.TLSConfigFromFiles(f.certs.CAFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	asOps := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, auth.ForwardedHeader, "ops"), method, req, reply, cc, opts...)
	})
	for name, opts := range map[string][]client.Option{
		"as itself":  {client.WithTLS(tlsCfg)},
		"naming ops": {client.WithTLS(tlsCfg), client.WithDialOptions(asOps)},
	} {
		c, err := client.Dial(ctx, n1.addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ListNodes(ctx); fleetReason(err) != client.ReasonNotPermitted {
			t.Errorf("ListNodes with the node credential %s = %v, want NOT_PERMITTED", name, err)
		}
		if _, err := c.RemoveNode(ctx, "n2", true); fleetReason(err) != client.ReasonNotPermitted {
			t.Errorf("RemoveNode with the node credential %s = %v, want NOT_PERMITTED", name, err)
		}
		c.Close()
	}

	if _, err := f.ops.RemoveNode(ctx, "n2", true); fleetReason(err) != client.ReasonNodeLive {
		t.Errorf("RemoveNode of the live n2 = %v, want NODE_LIVE", err)
	}

	// n2 stops (its lease is revoked): its sandboxes keep running.
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	f.waitNodes(t, "n2 lost", func(nodes []*berthv1.Node) bool {
		for _, n := range nodes {
			if n.GetId() == "n2" {
				return n.GetState() == berthv1.NodeState_NODE_STATE_LOST && n.GetPlacedSandboxes() == 2
			}
		}
		return false
	})
	_, err = f.alice[0].GetSandbox(ctx, "no-1")
	var u *client.UnreachableError
	if !errors.As(err, &u) || u.Detail.GetCause() != berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST || u.RetryDelay <= 0 {
		t.Errorf("GetSandbox of no-1 on the lost n2 = %v, want NODE_LOST with a RetryInfo", err)
	}
	if err := f.alice[0].DeleteSandbox(ctx, "no-1"); err != nil {
		t.Errorf("alice's DeleteSandbox of no-1 on the lost n2 = %v, want success", err)
	}
	if _, err := f.alice[0].GetSandbox(ctx, "no-1"); fleetReason(err) != client.ReasonSandboxNotFound {
		t.Errorf("GetSandbox of the deleted no-1 = %v, want SANDBOX_NOT_FOUND", err)
	}

	// n2 comes back with both sandboxes still running: the delete of no-1
	// made while it was lost is honoured (it deletes no-1 in its
	// containerd), no-2 is recorded again.
	n2.start(t)
	waitOnN2 := func(when string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			deadline := time.Now().Add(time.Minute)
			for {
				sb, err := f.alice[0].GetSandbox(ctx, id)
				if err == nil && sb.GetNodeId() == "n2" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("GetSandbox of %s %s = %v, %v; want it on n2", id, when, sb, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	waitOnN2("after n2 came back", "no-2")
	if _, err := f.alice[0].GetSandbox(ctx, "no-1"); fleetReason(err) != client.ReasonSandboxNotFound {
		t.Errorf("GetSandbox of no-1, deleted while n2 was lost, after n2 came back = %v, want SANDBOX_NOT_FOUND", err)
	}
	// no-2's record named n2 all along, so it is served as soon as n2
	// holds a lease; n2 deletes no-1 when it reconciles, a moment later.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		sbs, err := n2.rt.List(ctx, nil)
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		logged := n2.proc.logLines("deleted a sandbox deleted through the fleet while this node was lost", `"no-1"`)
		if err == nil && strings.Join(ids, ",") == "no-2" && len(logged) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n2's containerd 30s after it came back holds %v (%v), want no-2 alone: no-1 was deleted while n2 was lost; its delete logged %d times, want once", ids, err, len(logged))
		}
	}

	// Stopped again, n2 is forgotten by `berth node rm`.
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	f.waitNodes(t, "n2 lost again", func(nodes []*berthv1.Node) bool {
		for _, n := range nodes {
			if n.GetId() == "n2" {
				return n.GetState() == berthv1.NodeState_NODE_STATE_LOST
			}
		}
		return false
	})
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, env.cliBinary, append([]string{"--addr", "unix://" + n1.sock, "node"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("berth node %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out, want := cli("rm", "n2", "--dry-run"), "would remove node n2 and 1 sandbox records\nno-2\n"; out != want {
		t.Errorf("berth node rm n2 --dry-run printed %q, want %q", out, want)
	}
	if out, want := cli("rm", "n2"), "removed node n2 and 1 sandbox records\nno-2\n"; out != want {
		t.Errorf("berth node rm n2 printed %q, want %q", out, want)
	}
	if out := cli("ls"); strings.Contains(out, "n2") || !strings.Contains(out, "CONFLICTS") {
		t.Errorf("berth node ls after the removal:\n%s\nwant n1 only, with a CONFLICTS column", out)
	}
	if _, err := f.alice[0].GetSandbox(ctx, "no-2"); fleetReason(err) != client.ReasonSandboxNotFound {
		t.Errorf("GetSandbox of no-2 after n2 was removed = %v, want SANDBOX_NOT_FOUND", err)
	}

	// n2 comes back after the removal: the sandbox its containerd still
	// runs is recorded again.
	n2.start(t)
	waitOnN2("after n2 came back from its removal", "no-2")
}
