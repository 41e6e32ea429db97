package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newVolumeCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("volume", "Create, list and remove named volumes that sandboxes mount", "vol")
	cmd.AddCommand(newVolumeCreateCmd(g), newVolumeListCmd(g), newVolumeRemoveCmd(g))
	return cmd
}

func newVolumeCreateCmd(g *globals) *cobra.Command {
	var quota uint64
	cmd := &cobra.Command{
		Use:   "create NAME [--quota-bytes N]",
		Short: "Create an empty volume and print its name",
		Long: `Create an empty named volume of yours with a disk quota of its own (a
btrfs subvolume of berthd's disk pool), counted against your disk cap. Mount
it into sandboxes with "berth sandbox create --volume NAME:/path[:ro]"; it
outlives them until "berth volume rm". A file a user writes there is that
same user's in every sandbox that mounts it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				v, err := c.CreateVolume(ctx, args[0], quota)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), v.GetName())
				return nil
			})
		},
	}
	cmd.Flags().Uint64Var(&quota, "quota-bytes", 0, "what the volume may hold, in bytes (default berthd's --default-disk-bytes)")
	return cmd
}

func newVolumeListCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your volumes with their usage",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				vols, err := c.ListVolumes(ctx)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), vols)
				}
				return writeVolumeTable(cmd.OutOrStdout(), vols, time.Now())
			})
		},
	}
	addOutputFlag(cmd, &output, "table")
	return cmd
}

func writeVolumeTable(w io.Writer, vols []*berthv1.Volume, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tUSED\tQUOTA\tSANDBOXES\tCREATED")
	for _, v := range vols {
		users := strings.Join(v.GetSandboxIds(), ",")
		if users == "" {
			users = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.GetName(), byteSize(v.GetUsedBytes()), byteSize(v.GetQuotaBytes()), users, ago(v.GetCreated().AsTime(), now))
	}
	return tw.Flush()
}

func newVolumeRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove volumes and their files",
		Long:    `Remove each volume with its files and print its name. A volume that a sandbox mounts cannot be removed while that sandbox exists (the error names them).`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doEach(cmd, g, "remove volume ", args, func(c *client.Client, ctx context.Context, name string) error {
				return c.DeleteVolume(ctx, name)
			})
		},
	}
}

// parseVolumeMounts reads --volume values, NAME:PATH or NAME:PATH:ro;
// berthd checks the name and the path and names a bad one.
func parseVolumeMounts(values []string) ([]*berthv1.VolumeMount, error) {
	var out []*berthv1.VolumeMount
	for _, v := range values {
		name, rest, ok := strings.Cut(v, ":")
		if !ok || name == "" || rest == "" {
			return nil, fmt.Errorf("--volume %q: want NAME:PATH or NAME:PATH:ro", v)
		}
		m := &berthv1.VolumeMount{Name: name, Path: rest}
		if p, mode, ok := strings.Cut(rest, ":"); ok {
			switch mode {
			case "ro":
				m.Path, m.ReadOnly = p, true
			case "rw":
				m.Path = p
			default:
				return nil, fmt.Errorf("--volume %q: the mode after PATH is ro or rw, not %q", v, mode)
			}
		}
		out = append(out, m)
	}
	return out, nil
}
