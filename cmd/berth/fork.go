package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newSandboxForkCmd(g *globals) *cobra.Command {
	var (
		req    berthv1.ForkSandboxRequest
		labels []string
		output outputFormat
	)
	cmd := &cobra.Command{
		Use:   "fork SANDBOX [--count N] [--memory] [--request-id KEY] [--label KEY=VALUE]...",
		Short: "Make sandboxes from a sandbox's current files and print their ids",
		Long: `Make N new sandboxes from the sandbox's files as of one point in time (it is
paused for the moment of one btrfs snapshot, then resumed; a paused sandbox
stays paused) and print their ids, one a line. Each child has the parent's
image, limits, user, env, network policy and labels (with --label's added),
its own id, network address and user ids; its processes start anew, unless
--memory: then (gVisor sandboxes only) the parent's memory is checkpointed
and every child restored from it, its processes going on where the
parent's stood (the parent stands still for the checkpoint and restore:
seconds). All or nothing. Needs berthd's btrfs snapshotter.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			req.SandboxId = args[0]
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				children, err := c.ForkSandbox(ctx, &req)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), children)
				}
				for _, sb := range children {
					fmt.Fprintln(cmd.OutOrStdout(), sb.GetId())
				}
				return nil
			})
		},
	}
	cmd.Flags().Uint32VarP(&req.Count, "count", "n", 1, "how many sandboxes to make, 1 to 16")
	cmd.Flags().BoolVar(&req.Memory, "memory", false, "copy the parent's memory and processes too (gVisor only)")
	cmd.Flags().StringVar(&req.RequestId, "request-id", "", "idempotency key: the same key returns the same children")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "add a label to every child, KEY=VALUE (repeatable)")
	addOutputFlag(cmd, &output, "table")
	return cmd
}
