package client

import (
	"context"
	"errors"
	"iter"
	"maps"
	"slices"

	"github.com/berth-sandbox/berth/internal/resume"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// CreateSandbox creates a sandbox and returns it once its agent answers,
// running. Creation is idempotent on req.SandboxId: the same id with the same
// spec returns the existing sandbox. Errors: codes.InvalidArgument
// (ReasonInvalidArgument, with FieldViolations), codes.NotFound
// (ReasonImageNotFound) when the image is not in berthd's store,
// codes.AlreadyExists (ReasonSandboxExists) when the id is taken by another
// spec.
func (c *Client) CreateSandbox(ctx context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.Sandbox, error) {
	var resp *berthv1.CreateSandboxResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.CreateSandbox(ctx, req)
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

// GetSandbox returns the sandbox named id. Errors: codes.NotFound
// (ReasonSandboxNotFound).
func (c *Client) GetSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error) {
	var resp *berthv1.GetSandboxResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

// DeleteSandbox stops and removes the sandbox named id with everything it
// holds. Deleting a sandbox that does not exist succeeds.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.retry(ctx, func() error {
		_, err := c.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id})
		return convertError(err)
	})
}

// PauseSandbox freezes every process of the sandbox named id and returns
// it, paused (state SANDBOX_STATE_PAUSED): it uses no CPU and keeps its
// memory, files, open connections and attached Exec streams. Any later
// call that needs the sandbox (Exec, Run, file calls, PortForward, ...)
// resumes it first, unless its context comes from NoResume. Pausing a
// paused sandbox succeeds. Errors: codes.NotFound (ReasonSandboxNotFound),
// codes.FailedPrecondition (ReasonSandboxNotRunning) when its task does
// not run.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error) {
	var resp *berthv1.PauseSandboxResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.PauseSandbox(ctx, &berthv1.PauseSandboxRequest{SandboxId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

// ResumeSandbox thaws the paused sandbox named id and returns it, running;
// resuming a running sandbox succeeds. Errors as for PauseSandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error) {
	var resp *berthv1.ResumeSandboxResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.ResumeSandbox(ctx, &berthv1.ResumeSandboxRequest{SandboxId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

// HibernateSandbox ends every process of the sandbox named id (its task,
// agent included, is removed: memory, processes and connections are lost;
// under gVisor they are checkpointed to disk instead and restored at the
// wake) and keeps its container and files, and returns it, hibernated
// (state SANDBOX_STATE_HIBERNATED), holding no memory and no CPU. Any
// later call that needs the sandbox wakes it first — a new task with a new
// agent on the same files — unless its context comes from NoResume.
// Hibernating a hibernated or paused sandbox succeeds. Errors as for
// PauseSandbox. Sandbox.Hibernate also says what was kept.
func (c *Client) HibernateSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error) {
	resp, err := c.hibernateSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

// hibernateSandbox is HibernateSandbox with the whole response: the
// sandbox and what the hibernation kept.
func (c *Client) hibernateSandbox(ctx context.Context, id string) (*berthv1.HibernateSandboxResponse, error) {
	var resp *berthv1.HibernateSandboxResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// NoResume returns ctx for calls that must not resume a paused sandbox
// nor wake a hibernated one: such a call fails with
// codes.FailedPrecondition (ReasonSandboxPaused, ReasonSandboxHibernated)
// and leaves the sandbox as it is. It sets the gRPC metadata
// "berth-no-resume: true", which any client can send.
func NoResume(ctx context.Context) context.Context { return resume.Forbid(ctx) }

// ListOption configures ListSandboxes.
type ListOption func(*listOptions)

type listOptions struct {
	unreachable *[]string
}

// UnreachableNodes makes ListSandboxes store in *nodes the nodes of a fleet
// whose sandboxes are missing from the listing, over all its pages, sorted:
// nodes that did not answer within the entry point's list budget, failed,
// or are lost while holding the caller's sandboxes
// (ListSandboxesResponse.unreachable_nodes). Empty when the listing is
// complete, and always outside a fleet. *nodes is set when the iteration
// ends.
func UnreachableNodes(nodes *[]string) ListOption {
	return func(o *listOptions) { o.unreachable = nodes }
}

// ListSandboxes returns an iterator over every sandbox that has all the
// labels in labelSelector (nil selects all), in id order. It fetches pages as
// the loop advances; an error ends the iteration with (nil, err) as its last
// pair. Each range over the iterator lists afresh. In a fleet a listing
// may miss the sandboxes of nodes that did not answer: UnreachableNodes
// names them.
//
//	for sb, err := range c.ListSandboxes(ctx, nil) {
//		if err != nil { return err }
//		...
//	}
func (c *Client) ListSandboxes(ctx context.Context, labelSelector map[string]string, opts ...ListOption) iter.Seq2[*berthv1.Sandbox, error] {
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(*berthv1.Sandbox, error) bool) {
		token := ""
		unreachable := map[string]bool{}
		if o.unreachable != nil {
			defer func() { *o.unreachable = slices.Sorted(maps.Keys(unreachable)) }()
		}
		for {
			var resp *berthv1.ListSandboxesResponse
			err := c.retry(ctx, func() (err error) {
				resp, err = c.sandboxes.ListSandboxes(ctx, &berthv1.ListSandboxesRequest{
					LabelSelector: labelSelector,
					PageToken:     token,
				})
				return convertError(err)
			})
			if err != nil {
				yield(nil, err)
				return
			}
			for _, n := range resp.GetUnreachableNodes() {
				unreachable[n] = true
			}
			for _, sb := range resp.GetSandboxes() {
				if !yield(sb, nil) {
					return
				}
			}
			next := resp.GetNextPageToken()
			if next == "" {
				return
			}
			if next == token {
				// A server that hands back the token it was given would loop
				// forever.
				yield(nil, errors.New("list sandboxes: berthd returned the same page token twice"))
				return
			}
			token = next
		}
	}
}
