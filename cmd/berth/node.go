package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List, drain, undrain and remove the nodes of berthd's fleet (admins)",
	}
	cmd.AddCommand(newNodeListCmd(g), newNodeDrainCmd(g, true), newNodeDrainCmd(g, false), newNodeRemoveCmd(g))
	return cmd
}

func newNodeListCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the fleet's nodes: state, capacity in use and free, leases",
		Long: `List the berthd nodes of the fleet that berthd belongs to: live ones with
their capacity (sandboxes, memory promised, execs: in use/limit, "-" for no
cap), their health ("ok", or why the node cannot create sandboxes now and
since when: CONTAINERD_UNAVAILABLE, NO_SPACE, AGENT_LAUNCH_FAILING; the
fleet places sandboxes on healthy nodes first) and the time left on their
lease; lost ones (lease expired) with the number of sandboxes waiting for
them. CONFLICTS counts the sandboxes a node runs whose ids the fleet records
on another node (docs/fleet.md, Node identity); -o json lists their ids
(conflicting_sandbox_ids).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				nodes, err := c.ListNodes(ctx)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), nodes)
				}
				return writeNodeTable(cmd.OutOrStdout(), nodes, time.Now())
			})
		},
	}
	addOutputFlag(cmd, &output, "table")
	return cmd
}

func newNodeRemoveCmd(g *globals) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:     "rm NODE",
		Aliases: []string{"remove"},
		Short:   "Forget a lost NODE and the records of its sandboxes",
		Long: `Forget a lost node (one whose lease expired): the fleet drops its address,
its drain mark and the records of the sandboxes it held, whose ids are then
free again, and prints those ids. No sandbox is touched: if the node comes
back it records the sandboxes it still runs again (or reports a conflict
for an id that a new sandbox took meanwhile). A node that holds a lease is
refused (NODE_LIVE): stop its berthd first. --dry-run prints the ids and
removes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				ids, err := c.RemoveNode(ctx, args[0], dryRun)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				verb := "removed"
				if dryRun {
					verb = "would remove"
				}
				fmt.Fprintf(w, "%s node %s and %d sandbox records\n", verb, terminalSafe(args[0]), len(ids))
				for _, id := range ids {
					fmt.Fprintln(w, terminalSafe(id))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the sandbox records that would be removed, remove nothing")
	return cmd
}

func newNodeDrainCmd(g *globals, drain bool) *cobra.Command {
	use, short := "drain NODE", "Place no new sandboxes on NODE; its sandboxes live out their lifetime"
	if !drain {
		use, short = "undrain NODE", "Place new sandboxes on NODE again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				var n *berthv1.Node
				var err error
				if drain {
					n, err = c.DrainNode(ctx, args[0])
				} else {
					n, err = c.UndrainNode(ctx, args[0])
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", terminalSafe(n.GetId()), nodeState(n.GetState()))
				return nil
			})
		},
	}
}

func nodeState(s berthv1.NodeState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "NODE_STATE_"))
}

// capacityCell shows in use/limit, "-" for no cap.
func capacityCell(c *berthv1.NodeCapacity, bytes bool) string {
	show := func(v uint64) string {
		if bytes {
			return byteSize(v)
		}
		return fmt.Sprint(v)
	}
	if c.GetLimit() == 0 {
		return show(c.GetInUse()) + "/-"
	}
	return show(c.GetInUse()) + "/" + show(c.GetLimit())
}

// healthCell shows a node's health: "ok", or the reason and for how long
// ("CONTAINERD_UNAVAILABLE (since 12s ago)"); "-" when unknown (a lost node, an older
// berthd).
func healthCell(h *berthv1.NodeHealth, now time.Time) string {
	switch {
	case h == nil:
		return "-"
	case h.GetHealthy():
		return "ok"
	case h.GetSince() != nil:
		return terminalSafe(h.GetReason()) + " (since " + ago(h.GetSince().AsTime(), now) + ")"
	}
	return terminalSafe(h.GetReason())
}

func writeNodeTable(w io.Writer, nodes []*berthv1.Node, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tHEALTH\tADDRESS\tSANDBOXES\tMEMORY\tEXECS\tPLACED\tCONFLICTS\tLEASE\tUP\tLABELS")
	for _, n := range nodes {
		lease, up := "-", "-"
		if n.GetLeaseId() != "" {
			lease = fmt.Sprintf("%s (%v/%v left)", n.GetLeaseId(), n.GetLeaseRemaining().AsDuration(), n.GetLeaseTtl().AsDuration())
			up = ago(n.GetStartedAt().AsTime(), now)
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(n.GetLabels())) {
			labels = append(labels, k+"="+n.GetLabels()[k])
		}
		sb, mem, ex := "-", "-", "-"
		if n.GetState() != berthv1.NodeState_NODE_STATE_LOST {
			sb, mem, ex = capacityCell(n.GetSandboxes(), false), capacityCell(n.GetMemoryBytes(), true), capacityCell(n.GetExecs(), false)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", terminalSafe(n.GetId()), nodeState(n.GetState()), healthCell(n.GetHealth(), now), terminalSafe(n.GetAddress()),
			sb, mem, ex, n.GetPlacedSandboxes(), len(n.GetConflictingSandboxIds()), lease, up, terminalSafe(strings.Join(labels, ",")))
	}
	return tw.Flush()
}
