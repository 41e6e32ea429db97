package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
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
