package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agentbin"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestFleetNodeIdentity checks that a node id cannot be confused with
// another (issue 22): a node restarted under another id on its own state
// directory refuses to start, and so does a second berthd started under a
// live node's id; neither deletes or releases anything, and the node's
// sandboxes keep answering through the fleet under their node's id. With
// the state directory's node-id file removed by hand, the node comes up
// under the other id and keeps its sandboxes, reporting them as ownership
// conflicts (log and metric).
//
// Cost: two nodes on the suite's containerd, two sandboxes, two berthd
// starts that are refused within a second or two, three restarts.
func TestFleetNodeIdentity(t *testing.T) {
	need(t)
	f := startFleet(t, []int{4, 4}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n2 := f.node("n2")
	ids := []string{"ni-1", "ni-2"}
	for _, id := range ids {
		sb, err := f.alice[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Labels: map[string]string{"node.berth.dev/id": "n2"}})
		if err != nil || sb.GetNodeId() != "n2" {
			t.Fatalf("create %s pinned to n2 = %v on %q", id, err, sb.GetNodeId())
		}
	}
	// intact checks that n2 is registered from its own address and that
	// both sandboxes run on its containerd and answer through n1.
	intact := func(when string) {
		t.Helper()
		f.waitNodes(t, "n2 ready at its address "+when, func(nodes []*berthv1.Node) bool {
			for _, n := range nodes {
				if n.GetId() == "n2" && n.GetState() == berthv1.NodeState_NODE_STATE_READY && n.GetAddress() == n2.addr {
					return true
				}
			}
			return false
		})
		sbs, err := n2.rt.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for _, sb := range sbs {
			held = append(held, sb.ID)
		}
		slices.Sort(held)
		if strings.Join(held, ",") != strings.Join(ids, ",") {
			t.Errorf("n2's containerd holds %v %s, want %v", held, when, ids)
		}
		for _, id := range ids {
			res, err := f.alice[0].Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"echo", id}})
			if err != nil || string(res.GetStdout()) != id+"\n" {
				t.Errorf("run in %s through n1 %s = %q, %v; want %q", id, when, res.GetStdout(), err, id+"\n")
			}
		}
	}

	// A second berthd under n2's id, on its own state directory and
	// containerd namespace, while n2 runs: refused, naming n2's berthd.
	dupDir := filepath.Join(filepath.Dir(n2.dir), "dup")
	dup := replaceArgs(n2.args, map[string]string{"--state-dir": dupDir, "--namespace": n2.ns + "-dup"},
		"unix://"+filepath.Join(filepath.Dir(n2.sock), "dup.sock"), fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	refusedStart(t, dup, "node id n2 is registered in the fleet by another live berthd", "state directory "+n2.dir, n2.addr)
	intact("after a second berthd tried n2's id")

	// n2 restarted under another id on its state directory: refused before
	// it reads any record, naming both ids and the way out.
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	refusedStart(t, replaceArgs(n2.args, map[string]string{"--node-id": "n9"}),
		`this state directory belongs to node \"n2\"`, `node id \"n9\" was given`, "--node-id n2", filepath.Join(n2.dir, "node-id"))
	n2.start(t)
	intact("after n2 was restarted under n9, refused, and under n2 again")

	// With the file removed by hand, n2 comes up as n9: the fleet records
	// its sandboxes on n2, so they are ownership conflicts — kept running,
	// logged and counted, never deleted.
	n2.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n2.proc.exited
	idFile := filepath.Join(n2.dir, "node-id")
	if err := os.Remove(idFile); err != nil {
		t.Fatal(err)
	}
	n9 := *n2
	n9.id = "n9"
	n9.args = append(replaceArgs(n2.args, map[string]string{"--node-id": "n9"}), "--metrics-listen", "127.0.0.1:0")
	n9.start(t)
	for _, id := range ids {
		if lines := n9.proc.logLines(`"level":"ERROR"`, "ownership conflict", `"sandbox_id":"`+id+`"`, `"recorded_node_id":"n2"`); len(lines) != 1 {
			t.Errorf("n9 logged %d ownership conflicts for %s recorded on n2, want 1:\n%s", len(lines), id, tail(n9.proc.log.String(), 8<<10))
		}
	}
	if got, ok := metricValue(scrape(t, metricsURL(t, n9.proc)), "berth_fleet_sandbox_conflicts", nil); !ok || got != float64(len(ids)) {
		t.Errorf("n9's berth_fleet_sandbox_conflicts = %v (present %v), want %d", got, ok, len(ids))
	}
	n9.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-n9.proc.exited
	if err := os.Remove(idFile); err != nil {
		t.Fatal(err)
	}
	n2.start(t)
	intact("after n2 ran as n9 with its sandboxes in conflict, and as n2 again")
}

// replaceArgs returns a berthd's args with the values of the flags in set
// replaced, and with listens, when given, instead of its --listen flags.
func replaceArgs(args []string, set map[string]string, listens ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if v, ok := set[args[i]]; ok && i+1 < len(args) {
			out = append(out, args[i], v)
			i++
			continue
		}
		if args[i] == "--listen" && len(listens) > 0 {
			i++
			continue
		}
		out = append(out, args[i])
	}
	for _, l := range listens {
		out = append(out, "--listen", l)
	}
	return out
}

// refusedStart runs berthd with args and fails the test unless it exits
// with an error, within a minute, whose log holds every one of wants.
func refusedStart(t *testing.T, args []string, wants ...string) {
	t.Helper()
	log := &agentbin.Buffer{}
	cmd := exec.Command(berthdBinary(t), args...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("berthd %v still ran after a minute, want it refused; log:\n%s", args, tail(log.String(), 8<<10))
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("berthd exited with %v, want exit status 1; log:\n%s", err, tail(log.String(), 8<<10))
	}
	for _, want := range wants {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the refused berthd's log does not say %q:\n%s", want, tail(log.String(), 8<<10))
		}
	}
}
