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

// TestForkSharesParentShim: a fork's children are served by the parent's
// containerd shim process (no shim is started for them); deleting the
// parent first leaves its shim serving the children, which run, answer
// and are deleted as any sandbox; a child's own fork groups under the
// child's id (another shim); a crash of the shared shim ends the task of
// every sandbox it serves, and none of another group (the fault domain,
// docs/state.md#fork).
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
	for _, c := range forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: pid, Count: 3}) {
		children = append(children, c.GetId())
		if got := shimOf(t, e.ns, c.GetId()); got != shim {
			t.Errorf("child %s served by shim %d, want its parent's %d", c.GetId(), got, shim)
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
	for _, c := range children[1:] {
		if got := shellOut(t, svc, c, "cat /workspace/f && echo more >>/workspace/f && cat /workspace/f"); got != "shared\nshared\nmore\n" {
			t.Errorf("child %s after the parent's and a sibling's deletion: %q", c, got)
		}
	}
	// The grandchild's group is children[1]'s id: no shim listens there
	// (children[1] is in its parent's), so its first grandchild starts one.
	grandchild := forkOn(t, svc, &berthv1.ForkSandboxRequest{SandboxId: children[1], Count: 1})[0].GetId()
	other := shimOf(t, e.ns, grandchild)
	if other == shim {
		t.Errorf("grandchild %s served by its grandparent's shim %d, want one of its own group", grandchild, shim)
	}
	if got := shellOut(t, svc, grandchild, "cat /workspace/f"); got != "shared\nmore\n" {
		t.Errorf("grandchild's file %q", got)
	}

	// The fault domain: the shared shim's crash ends its sandboxes' tasks.
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, c := range children[1:] {
		waitStopped(t, e, c)
	}
	if got := shimOf(t, e.ns, grandchild); got != other {
		t.Errorf("grandchild's shim %d after the other group's shim crashed, want %d", got, other)
	}
	shellOut(t, svc, grandchild, "true")
	for _, c := range append(children[1:], grandchild) {
		if _, err := svc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: c}); err != nil {
			t.Errorf("delete %s: %v", c, err)
		}
	}
}
