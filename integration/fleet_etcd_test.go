package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestFleetEtcdOutage stops the fleet's etcd (SIGSTOP: it holds its
// connections and answers nothing, as a frozen or partitioned etcd) under
// two nodes, twice for 10 s (issue 22 part 3):
//
//   - calls through the node that does not hold their sandbox, and creates,
//     fail UNAVAILABLE CLUSTER_UNAVAILABLE within the 2 s etcd budget (plus
//     a margin), while calls straight to the holder keep working;
//   - a routed exec stream running across the outage, and the re-registration
//     of both nodes after it (their 3 s leases lapse in etcd), goes on to
//     its end with all of its output;
//   - a call made with the Go client's retry policy during the outage
//     succeeds once etcd is back;
//   - a node restarted during the outage starts, serves its own sandboxes
//     on its socket and straight to callers, and joins when etcd is back;
//   - after each outage routing works again within 10 s (measured and
//     logged), and no sandbox was deleted or moved.
//
// Cost: one etcd process, two nodes on the suite's containerd, two
// sandboxes, one node restart, two outages of 10 s.
func TestFleetEtcdOutage(t *testing.T) {
	need(t)
	dir, err := os.MkdirTemp("/tmp", "be")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	etcd := startEtcdProc(t, dir)
	f := startFleetOn(t, []int{4, 4}, true, etcd.url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n1, n2 := f.node("n1"), f.node("n2")
	through, direct := f.alice[0], f.alice[1] // n1 routes; n2 holds eo-2
	for id, node := range map[string]string{"eo-1": "n1", "eo-2": "n2"} {
		sb, err := through.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Labels: map[string]string{"node.berth.dev/id": node}})
		if err != nil || sb.GetNodeId() != node {
			t.Fatalf("create %s pinned to %s = %v on %q", id, node, err, sb.GetNodeId())
		}
	}
	const budget, margin = 2 * time.Second, 1500 * time.Millisecond
	run := func(c *client.Client, id string, timeout time.Duration) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		start := time.Now()
		res, err := c.Run(cctx, id, &berthv1.ProcessSpec{Argv: []string{"echo", id}})
		if err == nil && string(res.GetStdout()) != id+"\n" {
			err = fmt.Errorf("stdout %q, want %q", res.GetStdout(), id+"\n")
		}
		return time.Since(start), err
	}
	// unavailable checks what the fleet answers while etcd is stopped.
	unavailable := func(when string) {
		t.Helper()
		took, err := run(through, "eo-2", 30*time.Second)
		if fleetReason(err) != client.ReasonClusterUnavailable || took > budget+margin {
			t.Errorf("Run in eo-2 through n1 %s = %v after %v; want CLUSTER_UNAVAILABLE within %v", when, err, took, budget+margin)
		}
		var e *client.Error
		if !client.IsRetryable(err) || !errors.As(err, &e) || e.RetryDelay <= 0 {
			t.Errorf("Run through n1 %s = %v: want it retryable with a retry delay", when, err)
		}
		start := time.Now()
		_, err = through.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "eo-new", Image: env.image})
		if fleetReason(err) != client.ReasonClusterUnavailable || time.Since(start) > budget+margin {
			t.Errorf("create through n1 %s = %v after %v; want CLUSTER_UNAVAILABLE within %v", when, err, time.Since(start), budget+margin)
		}
		if took, err := run(direct, "eo-2", 10*time.Second); err != nil || took > time.Second {
			t.Errorf("Run in eo-2 straight to n2 %s = %v after %v; want it served at once", when, err, took)
		}
	}
	// leases waits until both nodes are ready, and until ok holds, and
	// returns their leases by node id.
	leases := func(what string, ok func(map[string]string) bool) map[string]string {
		t.Helper()
		out := map[string]string{}
		f.waitNodes(t, what, func(nodes []*berthv1.Node) bool {
			clear(out)
			for _, n := range nodes {
				if n.GetState() == berthv1.NodeState_NODE_STATE_READY {
					out[n.GetId()] = n.GetLeaseId()
				}
			}
			return len(out) == 2 && (ok == nil || ok(out))
		})
		return out
	}
	// recovered waits until both nodes are ready — renewed, when named,
	// under another lease than it had in old (a berthd restarted during
	// the outage registered) — and a routed call each way works, and
	// returns how long that took after etcd was resumed.
	recovered := func(resumed time.Time, what string, old map[string]string, renewed string) time.Duration {
		t.Helper()
		leases(what+": both nodes ready", func(now map[string]string) bool { return renewed == "" || now[renewed] != old[renewed] })
		for _, p := range []struct {
			c  *client.Client
			id string
		}{{through, "eo-2"}, {direct, "eo-1"}} {
			for {
				_, err := run(p.c, p.id, 5*time.Second)
				if err == nil {
					break
				}
				if time.Since(resumed) > 30*time.Second {
					t.Fatalf("%s: routed Run in %s still fails 30s after etcd was resumed: %v", what, p.id, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		took := time.Since(resumed)
		t.Logf("%s: routing worked again %v after etcd was resumed", what, took.Round(10*time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("%s: routing came back %v after etcd was resumed, want within 10s", what, took)
		}
		return took
	}

	// A blip shorter than the lease time: no lease lapses.
	before := leases("both nodes ready", nil)
	etcd.signal(t, syscall.SIGSTOP)
	time.Sleep(time.Second)
	etcd.signal(t, syscall.SIGCONT)
	time.Sleep(fleetLeaseTTL) // past any lease that would have lapsed
	if after := leases("both nodes ready after a blip", nil); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("leases after a 1s blip = %v, want those before it kept: %v", after, before)
	}

	// Outage 1: a routed exec stream runs across it.
	var out bytes.Buffer
	ex, err := through.Exec(ctx, "eo-2", &berthv1.ProcessSpec{ShellCommand: "for i in $(seq 1 25); do echo $i; sleep 1; done"}, client.WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	etcd.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	unavailable("while etcd is stopped")
	retried := make(chan error, 1)
	tlsCfg, err := client.TLSConfigFromFiles(f.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	retrying, err := client.Dial(ctx, n1.addr, client.WithTLS(tlsCfg), client.WithToken(aliceToken), client.WithRetry(client.RetryPolicy{MaxAttempts: 100}))
	if err != nil {
		t.Fatal(err)
	}
	defer retrying.Close()
	time.Sleep(time.Until(stopped.Add(8 * time.Second)))
	go func() { _, err := run(retrying, "eo-2", 40*time.Second); retried <- err }()
	time.Sleep(time.Until(stopped.Add(10 * time.Second)))
	etcd.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	// A create at once: while the leases that lapsed in etcd are taken
	// again it may fail, but only retryably (never FLEET_BUSY with no
	// capacity counted), and it succeeds within 10 s.
	var refusals []string
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := through.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{SandboxId: "eo-3", Image: env.image})
		cancel()
		if err == nil {
			break
		}
		refusals = append(refusals, fleetReason(err))
		if busy := (*client.FleetBusyError)(nil); !client.IsRetryable(err) || errors.As(err, &busy) || fleetReason(err) == client.ReasonFleetBusy {
			t.Errorf("create at once after outage 1 = %v, want success or a retryable refusal other than FLEET_BUSY", err)
		}
		if time.Since(resumed) > 10*time.Second {
			t.Fatalf("create after outage 1 still fails 10s after etcd was resumed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after outage 1: a create succeeded %v after etcd was resumed (refused before: %v)", time.Since(resumed).Round(10*time.Millisecond), refusals)
	if err := through.DeleteSandbox(ctx, "eo-3"); err != nil {
		t.Fatal(err)
	}
	recovered(resumed, "after outage 1", nil, "")
	if err := <-retried; err != nil {
		t.Errorf("Run with the Go client's retry policy started during the outage = %v, want it to succeed once etcd is back", err)
	}
	res, err := ex.Wait()
	want := ""
	for i := 1; i <= 25; i++ {
		want += fmt.Sprintf("%d\n", i)
	}
	if err != nil || res.GetExitCode() != 0 || out.String() != want {
		t.Errorf("the routed exec across the outage and the nodes' re-registration = %v, %v, output %q; want exit 0 and 1..25", res, err, out.String())
	}

	// Outage 2: n2 restarted while etcd is stopped.
	before = leases("both nodes ready before outage 2", nil)
	etcd.signal(t, syscall.SIGSTOP)
	stopped = time.Now()
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	n2.start(t) // it serves on its socket: start waits for that
	if lines := n2.proc.logLines("waiting for etcd"); len(lines) == 0 {
		t.Errorf("n2 restarted without etcd did not log that it waits for etcd:\n%s", tail(n2.proc.log.String(), 8<<10))
	}
	sock, err := client.Dial(ctx, "unix://"+n2.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	if took, err := run(sock, "eo-2", 10*time.Second); err != nil || took > time.Second {
		t.Errorf("Run in eo-2 on the socket of n2 restarted during the outage = %v after %v; want it served at once", err, took)
	}
	unavailable("while etcd is stopped and n2 restarted")
	time.Sleep(time.Until(stopped.Add(10 * time.Second)))
	etcd.signal(t, syscall.SIGCONT)
	recovered(time.Now(), "after outage 2 with n2 restarted", before, "n2")

	// Nothing deleted or moved.
	for id, node := range map[string]*fleetNode{"eo-1": n1, "eo-2": n2} {
		sbs, err := node.rt.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for _, sb := range sbs {
			held = append(held, sb.ID)
		}
		if !slices.Contains(held, id) || len(held) != 1 {
			t.Errorf("%s's containerd holds %v, want %s alone", node.id, held, id)
		}
		for _, c := range []*client.Client{through, direct} {
			if sb, err := c.GetSandbox(ctx, id); err != nil || sb.GetNodeId() != node.id {
				t.Errorf("GetSandbox %s = node %q, %v; want on %s", id, sb.GetNodeId(), err, node.id)
			}
		}
	}
	// The nodes registered again (their leases lapsed in etcd) and
	// reconciled without releasing any record or finding a conflict.
	// n1 at its start and after each outage; n2 since its restart, when
	// etcd came back.
	for n, least := range map[*fleetNode]int{n1: 2, n2: 1} {
		lines := n.proc.logLines("sandbox records reconciled")
		if len(lines) < least {
			t.Errorf("%s reconciled %d times, want at least %d", n.id, len(lines), least)
		}
		for _, l := range lines {
			if !strings.Contains(l, `"released":0`) || !strings.Contains(l, `"conflicts":0`) {
				t.Errorf("%s released records or found conflicts: %s", n.id, l)
			}
		}
	}
}
