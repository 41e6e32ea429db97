package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ForkSandbox makes req.Count (1 to 16) new sandboxes from the files of
// the sandbox req.SandboxId as of one point in time, and returns them in
// index order. Each inherits the parent's spec and gets its own id,
// network address and user ids; the parent runs on (a paused one stays
// paused). It is all or nothing. With req.RequestId the call is retried
// on transient failures (a repeat returns the same children); without
// one it is not (each call makes new sandboxes). Errors:
// codes.InvalidArgument (count, request_id, labels), codes.NotFound
// (ReasonSandboxNotFound), codes.FailedPrecondition
// (ReasonSnapshotUnsupported, ReasonSandboxNotRunning),
// codes.AlreadyExists (ReasonSandboxExists: the request id named a fork
// with other parameters, or one whose children are not all there), and
// CreateSandbox's errors for a child.
func (c *Client) ForkSandbox(ctx context.Context, req *berthv1.ForkSandboxRequest) ([]*berthv1.Sandbox, error) {
	var resp *berthv1.ForkSandboxResponse
	call := func() (err error) {
		resp, err = c.sandboxes.ForkSandbox(ctx, req)
		return convertError(err)
	}
	var err error
	if req.GetRequestId() != "" {
		err = c.retry(ctx, call)
	} else {
		err = call()
	}
	if err != nil {
		return nil, err
	}
	return resp.GetSandboxes(), nil
}
