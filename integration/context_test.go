package integration

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestCodeContextBase checks the code-context RPCs on the base image,
// which has no python3: CreateCodeContext is FAILED_PRECONDITION
// INTERPRETER_MISSING and starts nothing; bad input is INVALID_ARGUMENT
// naming the field; an unknown context is CONTEXT_NOT_FOUND; and another
// principal's sandbox is NOT_FOUND SANDBOX_NOT_FOUND for every code-context
// RPC. The real runs are TestDebianCodeContext* (make test-debian).
func TestCodeContextBase(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	alice := berthv1.NewSandboxServiceClient(a.conn(t, aliceToken))
	bob := berthv1.NewSandboxServiceClient(a.conn(t, bobToken))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := shortID("cx")
	if _, err := alice.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image}); err != nil {
		t.Fatal(err)
	}
	defer alice.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})

	_, err := alice.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "py"})
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonInterpreterMissing, "", "python3")
	list, err := alice.ListCodeContexts(ctx, &berthv1.ListCodeContextsRequest{SandboxId: id})
	if err != nil || len(list.GetContexts()) != 0 {
		t.Errorf("ListCodeContexts after a failed create = %v, %v; want none", list, err)
	}
	// A context whose interpreter never started does not exist; a second
	// create tries again (a new generation, not the failed exec replayed).
	_, err = alice.InterruptCodeContext(ctx, &berthv1.InterruptCodeContextRequest{SandboxId: id, ContextId: "py"})
	wantStatus(t, err, codes.NotFound, rpcstatus.ReasonContextNotFound, "")
	_, err = alice.RestartCodeContext(ctx, &berthv1.RestartCodeContextRequest{SandboxId: id, ContextId: "py"})
	wantStatus(t, err, codes.NotFound, rpcstatus.ReasonContextNotFound, "")
	_, err = alice.DeleteCodeContext(ctx, &berthv1.DeleteCodeContextRequest{SandboxId: id, ContextId: "py"})
	wantStatus(t, err, codes.NotFound, rpcstatus.ReasonContextNotFound, "")
	_, err = alice.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "py"})
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonInterpreterMissing, "", "python3")
	if execs, err := alice.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id}); err != nil || len(execs.GetExecs()) != 2 {
		t.Errorf("ListExecs after two failed creates = %v, %v; want two interpreters that never started", execs, err)
	}
	_, err = alice.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, Language: "cobol"})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "language")
	_, err = alice.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "a.b"})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "context_id")
	// The agent checks cwd as its exec's process.cwd; the caller wrote cwd.
	_, err = alice.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "rel", Cwd: "tmp"})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "cwd", "cwd: ")
	_, err = runCode(ctx, alice, &berthv1.ExecuteCodeRequest{SandboxId: id, ContextId: "py", Code: "1", Timeout: durationpb.New(time.Millisecond)})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "timeout")
	_, err = runCode(ctx, alice, &berthv1.ExecuteCodeRequest{SandboxId: id, ContextId: "none", Code: "1"})
	wantStatus(t, err, codes.NotFound, rpcstatus.ReasonContextNotFound, "")
	_, err = alice.InterruptCodeContext(ctx, &berthv1.InterruptCodeContextRequest{SandboxId: id, ContextId: "none"})
	wantStatus(t, err, codes.NotFound, rpcstatus.ReasonContextNotFound, "")

	for name, call := range map[string]func() error{
		"CreateCodeContext": func() error {
			_, err := bob.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id})
			return err
		},
		"ListCodeContexts": func() error {
			_, err := bob.ListCodeContexts(ctx, &berthv1.ListCodeContextsRequest{SandboxId: id})
			return err
		},
		"DeleteCodeContext": func() error {
			_, err := bob.DeleteCodeContext(ctx, &berthv1.DeleteCodeContextRequest{SandboxId: id, ContextId: "py"})
			return err
		},
		"InterruptCodeContext": func() error {
			_, err := bob.InterruptCodeContext(ctx, &berthv1.InterruptCodeContextRequest{SandboxId: id, ContextId: "py"})
			return err
		},
		"RestartCodeContext": func() error {
			_, err := bob.RestartCodeContext(ctx, &berthv1.RestartCodeContextRequest{SandboxId: id, ContextId: "py"})
			return err
		},
		"ExecuteCode": func() error {
			_, err := runCode(ctx, bob, &berthv1.ExecuteCodeRequest{SandboxId: id, ContextId: "py", Code: "1"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) { wantStatus(t, call(), codes.NotFound, rpcstatus.ReasonSandboxNotFound, "") })
	}
}

// runCode collects an ExecuteCode stream's events, or its error.
func runCode(ctx context.Context, svc berthv1.SandboxServiceClient, req *berthv1.ExecuteCodeRequest) ([]*berthv1.ExecuteCodeResponse, error) {
	stream, err := svc.ExecuteCode(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*berthv1.ExecuteCodeResponse
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}
