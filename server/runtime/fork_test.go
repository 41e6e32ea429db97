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
