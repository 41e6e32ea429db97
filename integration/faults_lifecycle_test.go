package integration

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestCreateDeleteCreateRace runs issue 15's loop of create; (rm & create)
// on one id. Lifecycle operations on an id are serialized, so each pair
// has an order: the delete then the create (the sandbox exists, new), or
// the create (returning the existing sandbox) then the delete (it is
// gone). Either way the create succeeds or reports the delete (NOT_FOUND),
// never SANDBOX_UNREACHABLE from the deleted task's exit; and whatever the
// create answered, berthd's view is containerd's: no sandbox runs that
// the caller was told failed. Every other run sends the create only once
// the delete is under way (its task stopped): that create comes after the
// delete, so it must make a new sandbox, not answer with the dying one.
func TestCreateDeleteCreateRace(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := func(id string) *berthv1.CreateSandboxRequest {
		return &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image}
	}
	var kept, gone, notFound int
	for i := range 12 {
		id := shortID("rc")
		if _, err := env.sandboxes.CreateSandbox(ctx, req(id)); err != nil {
			t.Fatalf("run %d: first CreateSandbox: %v", i, err)
		}
		deleted, created := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id})
			deleted <- err
		}()
		afterDelete := i%2 == 1
		if afterDelete {
			waitDeleteUnderWay(t, ctx, id)
		}
		var sb *berthv1.Sandbox
		go func() {
			resp, err := env.sandboxes.CreateSandbox(ctx, req(id))
			sb = resp.GetSandbox()
			created <- err
		}()
		derr, cerr := <-deleted, <-created
		if derr != nil {
			t.Errorf("run %d: DeleteSandbox: %v", i, derr)
		}
		if c := status.Code(cerr); c != codes.OK && c != codes.NotFound {
			t.Errorf("run %d: CreateSandbox beside a delete: %v; want success or NOT_FOUND", i, cerr)
		}
		got, gerr := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
		_, rerr := env.rt.Get(ctx, id)
		switch {
		case afterDelete && status.Code(gerr) == codes.NotFound:
			t.Errorf("run %d: a create sent once the delete was under way answered %v, yet no sandbox is left: it came after the delete and must make one", i, cerr)
		case status.Code(gerr) == codes.NotFound:
			gone++
			if status.Code(cerr) == codes.NotFound {
				notFound++
			}
			if !errors.Is(rerr, runtime.ErrSandboxNotFound) {
				t.Errorf("run %d: berthd says %s is gone, containerd has it (%v): leaked", i, id, rerr)
			}
		case gerr != nil:
			t.Errorf("run %d: GetSandbox: %v", i, gerr)
		case cerr != nil:
			t.Errorf("run %d: CreateSandbox failed (%v) yet the sandbox exists: %v", i, cerr, got.GetSandbox().GetState())
		case got.GetSandbox().GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId():
			t.Errorf("run %d: the sandbox runs agent %s, the create returned agent %s", i, got.GetSandbox().GetRuntime().GetAgentBootId(), sb.GetRuntime().GetAgentBootId())
		default:
			kept++
			if out := run(t, id, "echo", "ok"); string(out.GetStdout()) != "ok\n" {
				t.Errorf("run %d: the surviving sandbox does not run execs: %q", i, out.GetStdout())
			}
		}
		if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatalf("run %d: cleanup: %v", i, err)
		}
	}
	t.Logf("delete then create: %d; create then delete: %d (of which the create reported the delete: %d)", kept, gone, notFound)
}

// waitDeleteUnderWay waits, for at most 10 s, until containerd shows sandbox
// id's task stopped or the sandbox gone: a delete sent before is under way
// or done. It polls every millisecond, so that it sees the stopped task
// before the delete removes the container.
func waitDeleteUnderWay(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		sb, err := env.rt.Get(ctx, id)
		switch {
		case errors.Is(err, runtime.ErrSandboxNotFound), err == nil && !sb.Running:
			return
		case err != nil:
			t.Fatalf("containerd's record of %s during its delete: %v", id, err)
		case time.Now().After(deadline):
			t.Fatalf("the delete of %s did not stop its task within 10 s", id)
		}
	}
}

// TestAgentLogBounded grows a sandbox's agent log past the bound of a
// berthd that checks it often: the log is cut back (its newest half kept as
// agent.log.1), and containerd's shim goes on writing at its new start —
// no hole of NUL bytes where the old end was — so later lines are read.
func TestAgentLogBounded(t *testing.T) {
	need(t)
	const limit = 64 << 10
	e := newInProcessEnv(t, "alog", server.Config{MaxAgentLogBytes: limit, AgentLogCheck: 50 * time.Millisecond, TaskRestartLimit: -1})
	id := newSandboxOn(t, e.sandboxes, nil)
	path := e.rt.LogPath(id)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 99) + "\n"
	_, err = f.WriteString(strings.Repeat(line, 3*limit/len(line)))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	size := func(p string) int64 {
		st, err := os.Stat(p)
		if err != nil {
			return -1
		}
		return st.Size()
	}
	if !poll(10*time.Second, func() bool { s := size(path); return s >= 0 && s < limit }) {
		t.Fatalf("agent log is %d bytes 10 s after it grew past the %d-byte bound", size(path), limit)
	}
	if kept := size(path + ".1"); kept <= 0 || kept > limit/2 {
		t.Errorf("agent.log.1 is %d bytes, want the newest half of the bound at most", kept)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 {
		if _, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"true"}}}); err != nil {
			t.Fatal(err)
		}
	}
	var b []byte
	if !poll(10*time.Second, func() bool {
		b, _ = os.ReadFile(path)
		return strings.Contains(string(b), "exec finished")
	}) {
		t.Fatalf("the agent's lines after the cut do not reach agent.log: %.300q", b)
	}
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		t.Errorf("agent.log has a NUL byte at %d: the shim wrote at its old end, past a hole", i)
	}
}
