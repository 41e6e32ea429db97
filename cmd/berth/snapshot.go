package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("snapshot", "Take, list, commit and remove snapshots of sandboxes' files", "snap")
	cmd.AddCommand(newSnapshotCreateCmd(g), newSnapshotListCmd(g), newSnapshotRemoveCmd(g), newSnapshotCommitCmd(g))
	return cmd
}

func newSnapshotCreateCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "create SANDBOX [--label KEY=VALUE]...",
		Short: "Snapshot a sandbox's files and print the snapshot's id",
		Long: `Store a point-in-time, crash-consistent copy of the sandbox's root file
system (paused for the moment of a btrfs snapshot, then resumed; a paused
sandbox stays paused) and print its id. Every write the sandbox saw complete
before the command is in it. It outlives the sandbox; "berth sandbox create
--from-snapshot ID" starts a sandbox from it. Needs berthd's btrfs
snapshotter. Memory is not kept.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				snap, err := c.CreateSnapshot(ctx, args[0], l)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), snap.GetId())
				return nil
			})
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label the snapshot, KEY=VALUE (repeatable)")
	return cmd
}

func newSnapshotListCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your snapshots",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				snaps, err := c.ListSnapshots(ctx)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), snaps)
				}
				return writeSnapshotTable(cmd.OutOrStdout(), snaps, time.Now())
			})
		},
	}
	addOutputFlag(cmd, &output, "table")
	return cmd
}

func writeSnapshotTable(w io.Writer, snaps []*berthv1.Snapshot, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	// DISK is what the snapshot counts against its owner's disk cap
	// (Snapshot.disk_bytes).
	fmt.Fprintln(tw, "ID\tSANDBOX\tIMAGE\tSIZE\tDISK\tCREATED")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.GetId(), s.GetSandboxId(), s.GetImage(), byteSize(uint64(s.GetSizeBytes())), byteSize(s.GetDiskBytes()), ago(s.GetCreated().AsTime(), now))
	}
	return tw.Flush()
}

func newSnapshotRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SNAPSHOT...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove snapshots",
		Long:    `Remove each snapshot and print its id. A snapshot that a sandbox was created from cannot be removed while that sandbox exists.`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doEach(cmd, g, "remove snapshot ", args, func(c *client.Client, ctx context.Context, id string) error {
				return c.DeleteSnapshot(ctx, id)
			})
		},
	}
}

func newSnapshotCommitCmd(g *globals) *cobra.Command {
	var (
		replace         bool
		env, entrypoint []string
		cmdArgs         []string
		workdir         string
	)
	cmd := &cobra.Command{
		Use:   "commit SNAPSHOT REF",
		Short: "Make an image of a snapshot and print its reference and digest",
		Long: `Store an image named REF made of the snapshot, like docker commit: the
snapshot's image plus one layer holding what the sandbox changed (deleted
files stay deleted), with the image's config (and --env, --workdir,
--entrypoint, --cmd changed: sandboxes see the environment; the others
matter only to other tools that run the image). "berth image ls" lists it
and "berth sandbox create --image REF" runs it; it outlives the snapshot.
A stored REF is refused unless --replace (admins only).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ch := &berthv1.ImageConfigChanges{Env: env, WorkingDir: workdir, Entrypoint: entrypoint, Cmd: cmdArgs}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.CommitSnapshot(ctx, args[0], args[1], client.CommitOptions{Replace: replace, Changes: ch})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", resp.GetImage().GetName(), resp.GetImage().GetDigest())
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&replace, "replace", false, "replace a stored image of that reference (admins only)")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set KEY=VALUE in the image's environment (repeatable)")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "set the image's working directory")
	cmd.Flags().StringArrayVar(&entrypoint, "entrypoint", nil, "set the image's entrypoint, one argument per flag")
	cmd.Flags().StringArrayVar(&cmdArgs, "cmd", nil, "set the image's command, one argument per flag")
	return cmd
}
