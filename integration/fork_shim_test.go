package integration

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/berth-sandbox/berth/internal/procfs"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// shimOf returns the host pid of the containerd shim serving sandbox id's
// task in containerd namespace ns: the parent of the task's first process
// (the shim starts runc, whose container process it reaps as a
// subreaper).
func shimOf(t *testing.T, ns, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stat, err := procfs.Stat(sandboxTask(ctx, t, ns, id).Pid())
	if err != nil {
		t.Fatalf("task of %s: %v", id, err)
	}
	ppid, err := strconv.Atoi(stat[4]) // proc(5): ppid
	if err != nil {
		t.Fatalf("task of %s: ppid %q: %v", id, stat[4], err)
	}
	return ppid
}

// sandboxTask returns sandbox id's task in containerd namespace ns, through
// a containerd client closed at t's cleanup.
func sandboxTask(ctx context.Context, t *testing.T, ns, id string) containerd.Task {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("container of %s: %v", id, err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatalf("task of %s: %v", id, err)
	}
	return task
}

// TestForkSharesParentShim: a fork's children are served by two shim
// processes, in turns (lifecycle's shimLane): the even ones by the
// parent's (no shim is started for them), the odd ones by the second
// child's, which that child starts; deleting the parent first leaves its
// shim serving its children, which run, answer and are deleted as any
// sandbox; a child's own fork groups under the child's id (another shim
// where the child has none of its own); a crash of the parent's shim ends
// the task of every sandbox it serves, and none of another group (the
// fault domain, docs/state.md#fork).
func TestForkSharesParentShim(t *testing.T) {
	need(t)
	e := newInProcessEnvWith(t, "forkshim", server.Config{TaskRestartLimit: -1}, nil, nil)
	svc := e.sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid := createSandboxOn(t, svc, &berthv1.CreateSandboxRequest{}).GetId()
	shellOut(t, svc, pid, "echo shared >/workspace/f")
	shim := shimOf(t, e.ns, pid)
	var children []string
	for _, c := range forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 4}) {
		children = append(children, c.GetId())
	}
	lane := shimOf(t, e.ns, children[1])
	if lane == shim {
		t.Errorf("second child %s served by its parent's shim %d, want one of its own", children[1], shim)
	}
	for i, c := range children {
		want := shim
		if i%2 == 1 {
			want = lane
		}
		if got := shimOf(t, e.ns, c); got != want {
			t.Errorf("child %d (%s) served by shim %d, want %d (parent's %d, second child's %d)", i, c, got, want, shim, lane)
		}
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: pid}); err != nil {
		t.Fatalf("delete the parent before its children: %v", err)
	}
	if err := syscall.Kill(shim, 0); err != nil {
		t.Fatalf("the parent's shim %d after the parent's deletion, with children left: %v", shim, err)
	}
	if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: children[0]}); err != nil {
		t.Fatal(err)
	}
	children = children[1:]
	for _, c := range children {
		if got := shellOut(t, svc, c, "cat /workspace/f && echo more >>/workspace/f && cat /workspace/f"); got != "shared\nshared\nmore\n" {
			t.Errorf("child %s after the parent's and a sibling's deletion: %q", c, got)
		}
	}
	// The grandchild's group is the third child's id: no shim listens
	// there (that child is in its parent's), so its first grandchild
	// starts one.
	grandchild := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: children[1], Count: 1})[0].GetId()
	other := shimOf(t, e.ns, grandchild)
	if other == shim || other == lane {
		t.Errorf("grandchild %s served by shim %d, want one of its own group (not its grandparent's %d nor the second child's %d)", grandchild, other, shim, lane)
	}
	if got := shellOut(t, svc, grandchild, "cat /workspace/f"); got != "shared\nmore\n" {
		t.Errorf("grandchild's file %q", got)
	}

	// The fault domain: the parent's shim's crash ends its sandboxes'
	// tasks (the third child's), no other's (the second and fourth
	// children's, the grandchild's).
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, e, children[1])
	for id, want := range map[string]int{children[0]: lane, children[2]: lane, grandchild: other} {
		if got := shimOf(t, e.ns, id); got != want {
			t.Errorf("%s's shim %d after the parent's shim crashed, want %d", id, got, want)
		}
		shellOut(t, svc, id, "true")
	}
	for _, c := range append(children, grandchild) {
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: c}); err != nil {
			t.Errorf("delete %s: %v", c, err)
		}
	}
}
