package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCopiesTaking: a child's create waits for a fork copy being taken
// and goes on once it is; one whose copy failed gets the copy's error;
// a copy no one is taking (taken before, or of an earlier berthd) is not
// waited for; a wait ends with its context.
func TestCopiesTaking(t *testing.T) {
	var c copiesTaking
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.of("/none").wait(ctx); err != nil {
		t.Fatalf("wait for a copy no one takes = %v, want nil", err)
	}

	taken := c.begin("/a")
	a := c.of("/a")
	if a == nil || c.of("/b") != nil {
		t.Fatalf("of(/a), of(/b) = %v, %v, want the copy being taken, nil", a, c.of("/b"))
	}
	waited := make(chan error, 1)
	go func() { waited <- a.wait(ctx) }()
	select {
	case err := <-waited:
		t.Fatalf("wait returned %v before the copy was taken", err)
	case <-time.After(10 * time.Millisecond):
	}
	taken(nil)
	if err := <-waited; err != nil {
		t.Errorf("wait for a copy taken = %v, want nil", err)
	}
	if c.of("/a") != nil {
		t.Error("a taken copy is still being taken")
	}

	failed := c.begin("/b")
	b := c.of("/b")
	boom := errors.New("freeze failed")
	failed(boom)
	if err := b.wait(ctx); !errors.Is(err, boom) {
		t.Errorf("wait for a copy that failed = %v, want it to wrap %v", err, boom)
	}

	done := c.begin("/c")
	defer done(nil)
	short, stop := context.WithCancel(ctx)
	stop()
	if err := c.of("/c").wait(short); !errors.Is(err, context.Canceled) {
		t.Errorf("wait with a cancelled context = %v, want context.Canceled", err)
	}
}

// TestUnderImageIDs: the roots a copy can be made of are those that
// store files under the image's own ids: idmapped ones and gVisor's.
func TestUnderImageIDs(t *testing.T) {
	for _, tc := range []struct {
		sb   Sandbox
		want bool
	}{
		{Sandbox{Runtime: RuntimeRunc, RootFS: RootFSIDMapped}, true},
		{Sandbox{Runtime: RuntimeRunc, RootFS: RootFSChowned}, false},
		{Sandbox{Runtime: RuntimeRunc, HostUsers: true}, false},
		{Sandbox{Runtime: RuntimeGVisor}, true},
		{Sandbox{Runtime: RuntimeGVisor, HostUsers: true}, false},
	} {
		if got := underImageIDs(tc.sb); got != tc.want {
			t.Errorf("underImageIDs(runtime %q, rootfs %q, host_users %v) = %v, want %v", tc.sb.Runtime, tc.sb.RootFS, tc.sb.HostUsers, got, tc.want)
		}
	}
}

// TestShimGroup: a fork's child under runc is grouped in its parent's
// shim, or the one ForkOrigin.ShimGroup names; other sandboxes and
// gVisor's children are not grouped.
func TestShimGroup(t *testing.T) {
	for _, tc := range []struct {
		spec SandboxSpec
		want string
	}{
		{SandboxSpec{ID: "sb-a"}, ""},
		{SandboxSpec{ID: "sb-c", Fork: ForkOrigin{Parent: "sb-p"}}, "sb-p"},
		{SandboxSpec{ID: "sb-c", Fork: ForkOrigin{Parent: "sb-p", ShimGroup: "sb-c2"}}, "sb-c2"},
		{SandboxSpec{ID: "sb-c", Runtime: RuntimeGVisor, Fork: ForkOrigin{Parent: "sb-p"}}, ""},
	} {
		if got := shimGroup(tc.spec); got != tc.want {
			t.Errorf("shimGroup(%+v) = %q, want %q", tc.spec, got, tc.want)
		}
	}
}

// TestEnterShim: the task creates of one shim group run one at a time,
// in any order; another group's and an ungrouped one's do not wait; a
// wait ends with its context; a group no create holds is forgotten.
func TestEnterShim(t *testing.T) {
	var r Runtime
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaveA, err := r.enterShim(ctx, "sb-p")
	if err != nil {
		t.Fatalf("enter an empty group: %v", err)
	}
	for _, group := range []string{"", "sb-c2"} {
		leave, err := r.enterShim(ctx, group)
		if err != nil {
			t.Fatalf("enter group %q while sb-p's runs: %v", group, err)
		}
		leave()
	}

	entered := make(chan func(), 1)
	go func() {
		leave, err := r.enterShim(ctx, "sb-p")
		if err != nil {
			t.Errorf("enter sb-p after the first left: %v", err)
			leave = func() {}
		}
		entered <- leave
	}()
	select {
	case <-entered:
		t.Fatal("a second create of sb-p entered while the first ran")
	case <-time.After(10 * time.Millisecond):
	}

	short, stop := context.WithCancel(ctx)
	stop()
	if _, err := r.enterShim(short, "sb-p"); !errors.Is(err, context.Canceled) {
		t.Errorf("enter sb-p with a cancelled context while it is held = %v, want context.Canceled", err)
	}

	leaveA()
	(<-entered)()
	if r.shimQueues.Held("sb-p") {
		t.Error("group sb-p kept after every create left")
	}
}
