package client

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// CreateCodeContext starts a code context in the sandbox req.SandboxId: a
// long-lived Python interpreter whose variables, imports and definitions
// persist from one cell to the next (docs/contexts.md). An empty
// req.ContextId is minted ("cx-..."). Errors: codes.InvalidArgument naming
// the field, codes.AlreadyExists (ReasonContextExists), codes.NotFound
// (ReasonSandboxNotFound), codes.FailedPrecondition
// (ReasonInterpreterMissing when the image has no python3,
// ReasonCwdInvalid).
func (c *Client) CreateCodeContext(ctx context.Context, req *berthv1.CreateCodeContextRequest) (*berthv1.CodeContextInfo, error) {
	resp, err := c.sandboxes.CreateCodeContext(ctx, req)
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetContext(), nil
}

// ListCodeContexts lists the code contexts of the sandbox sandboxID whose
// interpreter runs, oldest first. Errors: codes.NotFound
// (ReasonSandboxNotFound).
func (c *Client) ListCodeContexts(ctx context.Context, sandboxID string) ([]*berthv1.CodeContextInfo, error) {
	resp, err := c.sandboxes.ListCodeContexts(ctx, &berthv1.ListCodeContextsRequest{SandboxId: sandboxID})
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetContexts(), nil
}

// DeleteCodeContext kills the interpreter of the context contextID.
// Errors: codes.NotFound (ReasonSandboxNotFound, ReasonContextNotFound).
func (c *Client) DeleteCodeContext(ctx context.Context, sandboxID, contextID string) error {
	_, err := c.sandboxes.DeleteCodeContext(ctx, &berthv1.DeleteCodeContextRequest{SandboxId: sandboxID, ContextId: contextID})
	return convertError(err)
}

// InterruptCodeContext raises KeyboardInterrupt in the cell running in the
// context contextID; the context lives on. Errors: codes.NotFound
// (ReasonSandboxNotFound, ReasonContextNotFound), codes.FailedPrecondition
// (ReasonContextEnded).
func (c *Client) InterruptCodeContext(ctx context.Context, sandboxID, contextID string) error {
	_, err := c.sandboxes.InterruptCodeContext(ctx, &berthv1.InterruptCodeContextRequest{SandboxId: sandboxID, ContextId: contextID})
	return convertError(err)
}

// RestartCodeContext replaces the interpreter of the context contextID
// with a fresh one (its variables are gone), keeping the id, cwd, user and
// env. Errors: codes.NotFound (ReasonSandboxNotFound,
// ReasonContextNotFound).
func (c *Client) RestartCodeContext(ctx context.Context, sandboxID, contextID string) (*berthv1.CodeContextInfo, error) {
	resp, err := c.sandboxes.RestartCodeContext(ctx, &berthv1.RestartCodeContextRequest{SandboxId: sandboxID, ContextId: contextID})
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetContext(), nil
}

// CellExecution is what a cell did, collected by RunCode: E2B's CellExecution
// {results, logs, error}.
type CellExecution struct {
	// Stdout and Stderr are the cell's output, in order.
	Stdout, Stderr string
	// Results are the rich results: display() calls and matplotlib
	// figures, then the last expression's value (IsMainResult).
	Results []*berthv1.CodeResult
	// Error is the exception that ended the cell, nil when it ran through.
	Error *berthv1.CodeError
	// Done says how long the cell ran and whether it timed out.
	Done *berthv1.CodeDone
}

// Text returns the text/plain of the main result, "" when there is none.
func (e *CellExecution) Text() string {
	for _, r := range e.Results {
		if r.GetIsMainResult() {
			return string(r.GetData()["text/plain"])
		}
	}
	return ""
}

// RunCodeOption adjusts RunCode.
type RunCodeOption func(*runCodeOptions)

type runCodeOptions struct {
	req     *berthv1.ExecuteCodeRequest
	onEvent func(*berthv1.ExecuteCodeResponse)
}

// WithCodeTimeout sets the cell's timeout (1 s to 24 h; default 30 min):
// past it the cell is interrupted, the context lives on.
func WithCodeTimeout(d time.Duration) RunCodeOption {
	return func(o *runCodeOptions) { o.req.Timeout = durationpb.New(d) }
}

// OnCodeEvent calls f with each event as it arrives (stdout, stderr,
// result, error), before RunCode returns them collected.
func OnCodeEvent(f func(*berthv1.ExecuteCodeResponse)) RunCodeOption {
	return func(o *runCodeOptions) { o.onEvent = f }
}

// RunCode runs code as one cell in the context contextID and returns what
// it did. An exception in the cell is CellExecution.Error, not an error.
// Errors: codes.InvalidArgument naming the field, codes.NotFound
// (ReasonSandboxNotFound, ReasonContextNotFound), codes.FailedPrecondition
// (ReasonContextEnded: the interpreter ended; RestartCodeContext).
func (c *Client) RunCode(ctx context.Context, sandboxID, contextID, code string, opts ...RunCodeOption) (*CellExecution, error) {
	o := runCodeOptions{req: &berthv1.ExecuteCodeRequest{SandboxId: sandboxID, ContextId: contextID, Code: code}}
	for _, opt := range opts {
		opt(&o)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.sandboxes.ExecuteCode(ctx, o.req)
	if err != nil {
		return nil, convertError(err)
	}
	var ex CellExecution
	var stdout, stderr strings.Builder
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, convertError(errors.New("RunCode stream ended without done"))
		}
		if err != nil {
			return nil, convertError(err)
		}
		if o.onEvent != nil {
			o.onEvent(ev)
		}
		switch e := ev.GetEvent().(type) {
		case *berthv1.ExecuteCodeResponse_Stdout:
			stdout.WriteString(e.Stdout)
		case *berthv1.ExecuteCodeResponse_Stderr:
			stderr.WriteString(e.Stderr)
		case *berthv1.ExecuteCodeResponse_Result:
			ex.Results = append(ex.Results, e.Result)
		case *berthv1.ExecuteCodeResponse_Error:
			ex.Error = e.Error
		case *berthv1.ExecuteCodeResponse_Done:
			ex.Done = e.Done
			ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
			return &ex, nil
		}
	}
}
