package integration

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestDeleteDuringCreate deletes a sandbox at varying moments while its
// CreateSandbox runs. The delete wins or loses, but the create must say
// which: it succeeds, or fails NOT_FOUND (the sandbox was deleted), never
// INTERNAL or a made-up "agent did not answer". Nothing is left behind.
func TestDeleteDuringCreate(t *testing.T) {
	need(t)
	for i := range 8 {
		id := shortID("dc")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		created := make(chan error, 1)
		go func() {
			_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image})
			created <- err
		}()
		time.Sleep(time.Duration(i) * 30 * time.Millisecond)
		if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatalf("delay %d: DeleteSandbox during create: %v", i, err)
		}
		cerr := <-created
		if c := status.Code(cerr); c != codes.OK && c != codes.NotFound {
			t.Errorf("delay %d: CreateSandbox with a delete during it: %v; want success or NOT_FOUND", i, cerr)
		}
		if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
			t.Fatalf("final DeleteSandbox(%s): %v", id, err)
		}
		if _, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id}); status.Code(err) != codes.NotFound {
			t.Fatalf("GetSandbox(%s) after delete: %v; want NOT_FOUND", id, err)
		}
		cancel()
	}
}
