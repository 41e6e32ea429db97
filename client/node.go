package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ListNodes lists the berthd nodes of berthd's fleet, live and lost, with
// their capacity and leases. It is for admins. Errors:
// codes.PermissionDenied (ReasonNotPermitted), codes.FailedPrecondition
// (ReasonNotClustered) from a berthd outside a fleet.
func (c *Client) ListNodes(ctx context.Context) ([]*berthv1.Node, error) {
	var resp *berthv1.ListNodesResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.nodes.ListNodes(ctx, &berthv1.ListNodesRequest{})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetNodes(), nil
}

// DrainNode stops placing new sandboxes on node id; its sandboxes live
// on. Errors: codes.NotFound (ReasonNodeNotFound), as for ListNodes.
func (c *Client) DrainNode(ctx context.Context, id string) (*berthv1.Node, error) {
	var resp *berthv1.DrainNodeResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.nodes.DrainNode(ctx, &berthv1.DrainNodeRequest{NodeId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetNode(), nil
}

// UndrainNode lets new sandboxes be placed on node id again. Errors as for
// DrainNode.
func (c *Client) UndrainNode(ctx context.Context, id string) (*berthv1.Node, error) {
	var resp *berthv1.UndrainNodeResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.nodes.UndrainNode(ctx, &berthv1.UndrainNodeRequest{NodeId: id})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetNode(), nil
}

// RemoveNode forgets the lost node id and the records of its sandboxes,
// returning the ids of those sandboxes, ordered; with dryRun it removes
// nothing and returns what it would remove. It touches no sandbox. It is
// for admins. Errors: codes.FailedPrecondition (ReasonNodeLive) for a node
// that holds a lease, codes.NotFound (ReasonNodeNotFound), codes.Aborted
// (ReasonNodeChanged) when the node registered or its records changed
// meanwhile, as for ListNodes otherwise. A retry after a lost answer may
// find the node removed already (ReasonNodeNotFound).
func (c *Client) RemoveNode(ctx context.Context, id string, dryRun bool) ([]string, error) {
	var resp *berthv1.RemoveNodeResponse
	err := c.retry(ctx, func() (err error) {
		resp, err = c.nodes.RemoveNode(ctx, &berthv1.RemoveNodeRequest{NodeId: id, DryRun: dryRun})
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetSandboxIds(), nil
}
