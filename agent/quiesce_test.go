package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/quiesce"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestQuiesce: quiesce.Close makes the agent close its listener (the
// socket file goes) and its connections (a call on the old connection
// fails), then create quiesce.Mark; quiesce.Listen makes it remove the
// mark and serve again on the same path, with the same boot id and the
// exec that ran on meanwhile.
func TestQuiesce(t *testing.T) {
	a := startAgent(t)
	sock := filepath.Join(a.dir, "a.sock")
	mark := filepath.Join(a.dir, quiesce.Mark)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.startBackground(t, "loop", &berthv1.ProcessSpec{Argv: []string{"sleep", "60"}})

	if err := syscall.Kill(a.pid, quiesce.Close); err != nil {
		t.Fatal(err)
	}
	if !pollFor(10*time.Second, func() bool { _, err := os.Lstat(mark); return err == nil }) {
		t.Fatalf("quiesce mark %s never appeared\nagent log:\n%s", mark, a.stderr)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket while quiet: %v, want it removed", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = a.client.Info(short, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
	cancelShort()
	if err == nil {
		t.Error("Info while quiet answered, want no connection")
	}

	if err := syscall.Kill(a.pid, quiesce.Listen); err != nil {
		t.Fatal(err)
	}
	after, err := a.client.Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Info after quiesce.Listen: %v\nagent log:\n%s", err, a.stderr)
	}
	if after.GetBootId() != before.GetBootId() || after.GetRunningExecs() != 1 {
		t.Errorf("after listening again: boot id %s, %d running execs; want %s, 1", after.GetBootId(), after.GetRunningExecs(), before.GetBootId())
	}
	if _, err := os.Lstat(mark); !os.IsNotExist(err) {
		t.Errorf("the quiesce mark after listening again: %v, want it removed", err)
	}
}

// pollFor reports whether cond became true within d.
func pollFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
