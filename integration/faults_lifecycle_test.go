package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestCreateDeleteCreateRace runs issue 15's loop of create; (rm & create)
// on one id. Lifecycle operations on an id are serialized, so each pair
// has an order: the delete then the create (the sandbox exists, new), or
// the create (returning the existing sandbox) then the delete (it is
// gone). Either way the create succeeds or reports the delete (NOT_FOUND),
// never SANDBOX_UNREACHABLE from the deleted task's exit; and whatever the
// create answered, berthd's view is containerd's: no sandbox runs that
// the caller was told failed.
func TestCreateDeleteCreateRace(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := func(id string) *berthv1.CreateSandboxRequest {
		return &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image}
	}
	var kept, gone, notFound int
	for i := range 10 {
		id := shortID("rc")
		if _, err := env.sandboxes.CreateSandbox(ctx, req(id)); err != nil {
			t.Fatalf("run %d: first CreateSandbox: %v", i, err)
		}
		deleted, created := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id})
			deleted <- err
		}()
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
