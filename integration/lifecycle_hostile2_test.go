package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

// TestWorkloadKillsPID1 pins what happens when the workload, running as
// the agent's uid, sends SIGTERM to PID 1 (docs/errors.md "Killing only the agent
// ends the task"): the agent stops as at berthd's stop, so a running exec
// ends with SIGTERM in its result, and berthd restarts the task: a new
// boot id, files kept.
func TestWorkloadKillsPID1(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	get := func() *berthv1.Sandbox {
		g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
		if err != nil {
			t.Fatalf("GetSandbox: %v", err)
		}
		return g.GetSandbox()
	}
	boot := get().GetRuntime().GetAgentBootId()
	run(t, id, "sh", "-c", "echo kept > /workspace/f")
	sleeper := make(chan *berthv1.RunResponse, 1)
	go func() {
		r, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "100"}}})
		if err != nil {
			t.Errorf("sleep 100: %v", err)
		}
		sleeper <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(string(run(t, id, "ps", "-o", "args").GetStdout()), "sleep 100") {
		if time.Now().After(deadline) {
			t.Fatal("sleep 100 did not start within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	run(t, id, "kill", "-TERM", "1")
	if r := <-sleeper; r.GetResult().GetSignal() != "SIGTERM" {
		t.Fatalf("the running exec ended with %v; want SIGTERM from the stopping agent", r.GetResult())
	}
	for {
		sb := get()
		if b := sb.GetRuntime().GetAgentBootId(); b != "" && b != boot && sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new runtime within 10s after kill -TERM 1: %v", sb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := string(run(t, id, "cat", "/workspace/f").GetStdout()); out != "kept\n" {
		t.Fatalf("after the restart /workspace/f holds %q; want kept", out)
	}
}

// TestCreateRefusesHugeLabels creates sandboxes with 1000 labels of 3000
// bytes each: 3 MiB per sandbox, every label within containerd's 4096-byte
// bound. Two of them made ListSandboxes 6 MiB, past the public client's
// 4 MiB message limit, failing it for every caller of the server. The
// labels' total must be bounded and refused by name.
func TestCreateRefusesHugeLabels(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	labels := map[string]string{}
	for i := range 1000 {
		labels[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 3000)
	}
	resp, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Labels: labels})
	if err == nil {
		env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: resp.GetSandbox().GetId()})
		t.Fatal("CreateSandbox with 3 MiB of labels succeeded; want INVALID_ARGUMENT naming labels")
	}
	st := status.Convert(err)
	var field string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			field = br.GetFieldViolations()[0].GetField()
		}
	}
	if st.Code() != codes.InvalidArgument || field != "labels" {
		t.Fatalf("CreateSandbox with 3 MiB of labels: %v (field %q); want INVALID_ARGUMENT naming labels", err, field)
	}
	// 16 KiB in all still fits.
	small := map[string]string{}
	for i := range 4 {
		small[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 4000)
	}
	newSandbox(t, &berthv1.CreateSandboxRequest{Labels: small})
}
