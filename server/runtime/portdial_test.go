package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vishvananda/netns"
)

// TestDialPortNeedsTheSandboxsTask: berthd joins a network namespace only
// through a process proven the sandbox's task, and never a gVisor
// sandbox's; otherwise DialPort fails with ErrNoDirectPath (the agent
// dials) before anything is dialed. This process's root has no
// /.berth-run at all, let alone the sandbox's run directory.
func TestDialPortNeedsTheSandboxsTask(t *testing.T) {
	r := &Runtime{cfg: Config{StateDir: t.TempDir()}}
	for _, id := range []string{"sb", "gv"} {
		if err := os.MkdirAll(filepath.Join(r.hostDir(id), "run"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	self := uint32(os.Getpid())
	r.kinds.m = map[string]taskKind{"sb": {pid: self}, "gv": {pid: self, gvisor: true}, "zero": {pid: 0}}
	for _, tc := range []struct {
		name, id string
		pid      uint32
	}{
		{"not the sandbox's process", "sb", self},
		{"gVisor", "gv", self},
		{"no pid", "zero", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := r.DialPort(context.Background(), tc.id, tc.pid, 1)
			if conn != nil || !errors.Is(err, ErrNoDirectPath) {
				t.Errorf("DialPort = %v, %v; want ErrNoDirectPath", conn, err)
			}
		})
	}
}

// TestInNetNSBounded: each connection being opened in a sandbox's network
// namespace holds one of berthd's threads, locked there until connect(2)
// ends (up to portconn.DialTimeout for a port whose backlog is full), so
// at most maxNetNSDials are under way at once: past that the call fails
// at once with ErrNoDirectPath (the agent dials) and holds no thread.
// Unbounded, a tenant's forwards to a port that never accepts would grow
// berthd past Go's 10,000-thread limit, which ends the process.
func TestInNetNSBounded(t *testing.T) {
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if err := inNetNS(self, func() error { return nil }); err != nil {
		t.Skipf("setns(2) into this process's own network namespace: %v (needs CAP_SYS_ADMIN)", err)
	}
	release := make(chan struct{})
	var wg sync.WaitGroup
	entered := make(chan struct{}, maxNetNSDials)
	for range maxNetNSDials {
		wg.Go(func() {
			if err := inNetNS(self, func() error { entered <- struct{}{}; <-release; return nil }); err != nil {
				t.Errorf("inNetNS under the bound: %v", err)
			}
		})
	}
	for range maxNetNSDials {
		<-entered
	}
	ran := false
	if err := inNetNS(self, func() error { ran = true; return nil }); !errors.Is(err, ErrNoDirectPath) || ran {
		t.Errorf("inNetNS past %d under way: %v, ran %v; want ErrNoDirectPath without running", maxNetNSDials, err, ran)
	}
	close(release)
	wg.Wait()
	if err := inNetNS(self, func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("inNetNS once the others ended: %v, ran %v; want run", err, ran)
	}
}
