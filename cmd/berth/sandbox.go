package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newSandboxCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("sandbox", "Create, list, inspect and delete sandboxes", "sb")
	cmd.AddCommand(newSandboxCreateCmd(g), newSandboxListCmd(g), newSandboxGetCmd(g), newSandboxRemoveCmd(g), newSandboxKeepAliveCmd(g),
		newSandboxFreezeCmd(g, "pause"), newSandboxFreezeCmd(g, "resume"), newSandboxFreezeCmd(g, "hibernate"), newSandboxForkCmd(g))
	return cmd
}

func newSandboxCreateCmd(g *globals) *cobra.Command {
	var (
		req                   berthv1.CreateSandboxRequest
		labels, env           []string
		pidsLimit, cpu, mem   uint64
		disk, shm             uint64
		idleTimeout, lifetime time.Duration
		egress                []string
		maxConns              uint32
		egressRate, inRate    uint64
		idleAction            string
		volumes               []string
	)
	cmd := &cobra.Command{
		Use:   "create --image REF [flags]",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox from the image REF and print its id once the sandbox's
agent answers. Creating an id that exists with the same spec prints it again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Image == "" && req.FromSnapshot == "" {
				return errors.New("--image or --from-snapshot is required")
			}
			var err error
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if pidsLimit > 0 || cpu > 0 || mem > 0 || disk > 0 || shm > 0 {
				req.Resources = &berthv1.Resources{PidsLimit: pidsLimit, CpuMillis: cpu, MemoryBytes: mem, DiskBytes: disk, ShmBytes: shm}
			}
			if req.Volumes, err = parseVolumeMounts(volumes); err != nil {
				return err
			}
			if idleTimeout != 0 {
				req.IdleTimeout = durationpb.New(idleTimeout)
			}
			if lifetime != 0 {
				req.MaxLifetime = durationpb.New(lifetime)
			}
			switch idleAction {
			case "", "delete":
			case "pause":
				req.IdleAction = berthv1.IdleAction_IDLE_ACTION_PAUSE
			case "hibernate":
				req.IdleAction = berthv1.IdleAction_IDLE_ACTION_HIBERNATE
			default:
				return fmt.Errorf("--idle-action %q: want delete, pause or hibernate", idleAction)
			}
			if len(egress) > 0 || maxConns > 0 || egressRate > 0 || inRate > 0 {
				// berthd checks the entries and names a bad one.
				req.Network = &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: egress, MaxConnections: maxConns,
					EgressBytesPerSecond: egressRate, IngressBytesPerSecond: inRate}
			}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				sb, err := c.CreateSandbox(ctx, &req)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), sb.GetId())
				if sb.GetRootIdMapping() == berthv1.RootIDMapping_ROOT_ID_MAPPING_CHOWNED_COPY {
					fmt.Fprintf(cmd.ErrOrStderr(), "berth: sandbox %s's root is a chowned copy of its image, not an idmapped mount (berthd's start log says why): creates take time and disk in proportion to the image\n", sb.GetId())
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&req.Image, "image", "", "image reference, e.g. berth.dev/base:latest (required)")
	cmd.Flags().StringVar(&req.FromSnapshot, "from-snapshot", "", "start from snapshot ID's files (berth snapshot create) and its image, copy-on-write")
	cmd.Flags().StringVar(&req.SandboxId, "id", "", "sandbox id, 1 to 63 characters from [a-z0-9-] (default: minted by berthd)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label the sandbox, KEY=VALUE (repeatable)")
	cmd.Flags().Uint64Var(&pidsLimit, "pids-limit", 0, "maximum processes and threads in the sandbox (default berthd's)")
	cmd.Flags().Uint64Var(&cpu, "cpu-millis", 0, "CPU cap in thousandths of a CPU, e.g. 500 for half a core (default: none)")
	cmd.Flags().Uint64Var(&mem, "memory-bytes", 0, "memory cap in bytes, no swap (default: none)")
	cmd.Flags().Uint64Var(&disk, "disk-bytes", 0, "disk quota in bytes: what the sandbox may store beyond its image (default berthd's)")
	cmd.Flags().Uint64Var(&shm, "shm-bytes", 0, "size of /dev/shm in bytes, counted against --memory-bytes (default berthd's: a share of the memory cap)")
	cmd.Flags().StringArrayVarP(&volumes, "volume", "v", nil, "mount your volume NAME (berth volume create) at PATH, NAME:PATH or NAME:PATH:ro for read-only (repeatable)")
	cmd.Flags().StringVar(&req.Runtime, "runtime", "", `OCI runtime: "runc" or "gvisor" (berthd --gvisor-binary) (default runc)`)
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable of every process, KEY=VALUE (repeatable)")
	cmd.Flags().StringVar(&req.User, "user", "", `workload user "uid", "uid:gid", or a name or "name:group" of the image's /etc/passwd and /etc/group (default 0:0)`)
	cmd.Flags().StringVar(&req.Workdir, "workdir", "", "working directory, created for the workload user (default /workspace)")
	cmd.Flags().DurationVar(&idleTimeout, "idle-timeout", 0, "remove the sandbox after this long without a running command or request (default berthd's)")
	cmd.Flags().StringVar(&idleAction, "idle-action", "delete", "what the idle timeout does: delete the sandbox, pause it, or hibernate it (files kept; under gVisor memory too); the next command resumes or wakes it")
	cmd.Flags().DurationVar(&lifetime, "max-lifetime", 0, "remove the sandbox this long after creation (default berthd's)")
	cmd.Flags().StringVar(&req.RequestId, "request-id", "", "idempotency key: the same key names the same sandbox (ignored with --id)")
	cmd.Flags().StringArrayVar(&egress, "egress", nil, "network mode EGRESS, allowing ENTRY: ADDR, CIDR or NAME, *.NAME, each with an optional :PORT (repeatable; without it the sandbox has no network)")
	cmd.Flags().Uint32Var(&maxConns, "max-connections", 0, "with --egress: most connections open at once (default: no cap)")
	cmd.Flags().Uint64Var(&egressRate, "egress-bytes-per-second", 0, "with --egress: cap on what the sandbox sends, bytes per second (default: no cap)")
	cmd.Flags().Uint64Var(&inRate, "ingress-bytes-per-second", 0, "with --egress: cap on what the sandbox receives, bytes per second (default: no cap)")
	return cmd
}

// newSandboxFreezeCmd is "sandbox pause", "sandbox resume" or "sandbox
// hibernate" (op).
func newSandboxFreezeCmd(g *globals, op string) *cobra.Command {
	use, short, long := "pause SANDBOX...", "Pause sandboxes: freeze their processes, keep their memory",
		`Freeze every process of each sandbox and print its id. A paused sandbox
uses no CPU and keeps its memory, files, connections and attached commands;
the next command naming it resumes it (unless run with --no-resume).
Pausing a paused sandbox succeeds.`
	call := (*client.Client).PauseSandbox
	switch op {
	case "resume":
		use, short, long = "resume SANDBOX...", "Resume paused sandboxes, wake hibernated ones",
			`Thaw each paused sandbox and print its id: its processes go on where they
stopped. A hibernated sandbox is woken: restored from its checkpoint under
gVisor, else a new task starts with its files.
Resuming a running sandbox succeeds.`
		call = (*client.Client).ResumeSandbox
	case "hibernate":
		use, short, long = "hibernate SANDBOX...", "Hibernate sandboxes: release their memory and CPU, keep their files",
			`Release each sandbox's memory and CPU, keep its files, and print its id.
Under runc every process ends (memory, processes and connections are lost);
under gVisor its memory and processes are checkpointed to disk (when the
checkpoint fails, they end as under runc). The next command naming it wakes
it (unless run with --no-resume): under gVisor the checkpoint is restored
(the same processes and exec ids), otherwise a new task starts, with a new
agent, on the same files. Hibernating a hibernated or paused sandbox
succeeds.`
		call = (*client.Client).HibernateSandbox
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doEach(cmd, g, op+" ", args, func(c *client.Client, ctx context.Context, id string) error {
				_, err := call(c, ctx, id)
				return err
			})
		},
	}
}

func newSandboxKeepAliveCmd(g *globals) *cobra.Command {
	var hold time.Duration
	cmd := &cobra.Command{
		Use:   "keepalive SANDBOX [--hold DURATION]",
		Short: "Count as activity in a sandbox, or hold off its idle timeout",
		Long: `Count as activity in the sandbox now, so its idle timeout starts over; with
--hold, keep the idle timeout from removing it for that long. Prints when the
sandbox expires now: idle and maximum lifetime, RFC 3339.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.KeepAlive(ctx, args[0], hold)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "idle expires %s\nlifetime ends %s\n",
					resp.GetIdleExpiresAt().AsTime().Local().Format(time.RFC3339), resp.GetExpiresAt().AsTime().Local().Format(time.RFC3339))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&hold, "hold", 0, "keep the sandbox from idling out for this long (at most berthd's --max-idle-timeout)")
	return cmd
}

func newSandboxListCmd(g *globals) *cobra.Command {
	var (
		labels, filters []string
		quiet           bool
		output          outputFormat
	)
	cmd := &cobra.Command{
		Use:     "ls [--label KEY=VALUE ...] [--filter label=KEY=VALUE|state=STATE ...]",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			f, err := parseSandboxFilters(filters)
			if err != nil {
				return err
			}
			sel = f.addLabels(sel)
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				var (
					sbs         []*berthv1.Sandbox
					unreachable []string
				)
				for sb, err := range c.ListSandboxes(ctx, sel, client.UnreachableNodes(&unreachable)) {
					if err != nil {
						return err
					}
					if f.match(sb) {
						sbs = append(sbs, sb)
					}
				}
				if len(unreachable) > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: nodes %s did not answer (or are lost): their sandboxes are missing from this list\n", terminalSafe(strings.Join(unreachable, ", ")))
				}
				switch {
				case quiet:
					for _, sb := range sbs {
						fmt.Fprintln(cmd.OutOrStdout(), sb.GetId())
					}
					return nil
				case output == "json":
					return writeJSONList(cmd.OutOrStdout(), sbs)
				}
				return writeSandboxTable(cmd.OutOrStdout(), sbs, time.Now())
			})
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with this label, KEY=VALUE (repeatable: all must match)")
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, `only sandboxes that match, as docker ps --filter: "label=KEY=VALUE", "label=KEY" (has the label), "state=running" (running, paused, stopped...), "owner=NAME" (repeatable: all must match; several state= or owner= match any of theirs)`)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the ids")
	addOutputFlag(cmd, &output, "table")
	return cmd
}

// writeSandboxTable writes sbs as a table; now dates CREATED.
func writeSandboxTable(w io.Writer, sbs []*berthv1.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	// In a fleet each sandbox names its node: a NODE column then.
	fleet := slices.ContainsFunc(sbs, func(sb *berthv1.Sandbox) bool { return sb.GetNodeId() != "" })
	header := "ID\tIMAGE\tSTATE\tOWNER\tCREATED\tAGENT BOOT ID"
	if fleet {
		header += "\tNODE"
	}
	fmt.Fprintln(tw, header)
	for _, sb := range sbs {
		boot := sb.GetRuntime().GetAgentBootId()
		if boot == "" {
			boot = "-"
		}
		owner := sb.GetOwner()
		if owner == "" {
			owner = "-"
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", sb.GetId(), sb.GetImage(), stateName(sb.GetState()), terminalSafe(owner), ago(sb.GetCreatedAt().AsTime(), now), shorten(boot, 12))
		if fleet {
			row += "\t" + terminalSafe(sb.GetNodeId())
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

// stateName renders SANDBOX_STATE_RUNNING as "running".
func stateName(s berthv1.SandboxState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SANDBOX_STATE_"))
}

// shorten returns s cut to n bytes.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// ago renders how long before now t was, in its largest whole unit.
func ago(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case t.IsZero() || t.Unix() == 0:
		return "-"
	case d < 0:
		return t.Format(time.RFC3339)
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
}

func newSandboxGetCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Print a sandbox as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				sb, err := c.GetSandbox(ctx, args[0])
				if err != nil {
					return err
				}
				if output == "table" {
					return writeSandboxTable(cmd.OutOrStdout(), []*berthv1.Sandbox{sb}, time.Now())
				}
				return writeJSON(cmd.OutOrStdout(), sb)
			})
		},
	}
	addOutputFlag(cmd, &output, "json")
	return cmd
}

func newSandboxRemoveCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm [-f] SANDBOX...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes",
		Long: `Delete each sandbox and print its id, whatever it runs: running commands
are killed, and a paused sandbox is deleted without being resumed. A
sandbox that does not exist is an error (SANDBOX_NOT_FOUND, exit 125), as
for docker rm; the others are still deleted. With -f (as docker rm -f) a
sandbox that does not exist is not an error: berth prints its id as for
the others, and a script's clean-up can run twice.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if force {
				// DeleteSandbox succeeds for an id that does not exist.
				return deleteEach(cmd, g, "", args, func(c *client.Client, ctx context.Context, id string) error { return c.DeleteSandbox(ctx, id) })
			}
			return deleteEach(cmd, g, "", args, deleteExisting)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "a sandbox that does not exist is not an error")
	return cmd
}

// deleteExisting deletes sandbox id, failing with SANDBOX_NOT_FOUND when
// there is none: berthd's DeleteSandbox succeeds for an unknown id (it is
// idempotent), which would tell a person who mistyped the id that it was
// deleted.
func deleteExisting(c *client.Client, ctx context.Context, id string) error {
	if _, err := c.GetSandbox(ctx, id); err != nil {
		return err
	}
	return c.DeleteSandbox(ctx, id)
}

// deleteEach deletes every name in args with del, printing each name once
// deleted and an error line (prefixed with what, e.g. "image ") for each
// that failed; it fails with exit code 125 when any did.
func deleteEach(cmd *cobra.Command, g *globals, what string, args []string, del func(*client.Client, context.Context, string) error) error {
	return doEach(cmd, g, "delete "+what, args, del)
}

// doEach calls do for every name in args, each call a request of its own,
// printing each name once done and an error line "berth: VERB NAME: ..."
// for each that failed; it fails with exit code 125 when any did.
func doEach(cmd *cobra.Command, g *globals, verb string, args []string, do func(*client.Client, context.Context, string) error) error {
	return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
		failed := false
		for _, name := range args {
			rctx, cancel := g.unary(ctx)
			err := do(c, rctx, name)
			cancel()
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "berth: %s%s: %s\n", verb, name, describe(err))
				failed = true
				continue
			}
			fmt.Fprintln(cmd.OutOrStdout(), name)
		}
		if failed {
			return exitStatus(exitBerth)
		}
		return nil
	})
}
