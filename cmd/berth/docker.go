package main

// Commands named as docker's (issue 25): inspect, logs and stats.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect SANDBOX...",
		Short: "Print sandboxes as JSON (GetSandbox), as docker inspect does",
		Long: `Print each sandbox as GetSandbox returns it, protojson in one JSON array
(as docker inspect prints one), e.g. berth inspect dev | jq '.[0].usage'.
A sandbox that does not exist is an error (SANDBOX_NOT_FOUND, exit 125); the
others are still printed.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var (
					sbs    []*berthv1.Sandbox
					failed bool
				)
				for _, id := range args {
					rctx, cancel := g.unary(ctx)
					sb, err := c.GetSandbox(rctx, id)
					cancel()
					if err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "berth: inspect %s: %s\n", terminalSafe(id), describe(err))
						failed = true
						continue
					}
					sbs = append(sbs, sb)
				}
				if err := writeJSONList(cmd.OutOrStdout(), sbs); err != nil {
					return err
				}
				if failed {
					return exitStatus(exitBerth)
				}
				return nil
			})
		},
	}
}

func newLogsCmd(g *globals) *cobra.Command {
	var (
		since  uint64
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "logs [-f] [--since SEQ] SANDBOX EXEC_ID",
		Short: "Print a command's retained output; -f follows it",
		Long: `Print the output of exec EXEC_ID of SANDBOX that the agent retains, after
sequence number --since (berth ps shows each exec's LAST SEQ), stdout to
stdout and stderr to stderr, byte for byte. Without -f berth stops at the
output there was when it asked; with -f it follows the command until it
ends. Either way berth exits 0 (berth attach exits with the command's
status and forwards signals). Output the agent no longer retains is named
on stderr.`,
		Example: `  id=$(berth exec -d dev -- make test)
  berth logs -f dev "$id"`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandboxID, execID := args[0], args[1]
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return printLogs(ctx, g, c, sandboxID, execID, since, follow, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})
		},
	}
	cmd.Flags().Uint64Var(&since, "since", 0, "print only output after this sequence number")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the command ends")
	return cmd
}

// printLogs writes the output of exec execID after seq since to stdout and
// stderr: up to the exec's last output event when berth asked (ListExecs'
// last_seq), or until it ends with follow.
func printLogs(ctx context.Context, g *globals, c *client.Client, sandboxID, execID string, since uint64, follow bool, stdout, stderr io.Writer) error {
	lctx, lcancel := g.unary(ctx)
	list, err := c.ListExecs(lctx, sandboxID)
	lcancel()
	if err != nil {
		return err
	}
	var info *berthv1.ExecInfo
	for _, x := range list.GetExecs() {
		if x.GetExecId() == execID {
			info = x
		}
	}
	if info == nil {
		return fmt.Errorf("sandbox %s has no exec %s that runs or is retained (berth ps %s lists them)", sandboxID, terminalSafe(execID), sandboxID)
	}
	until := info.GetLastSeq()
	stop := !follow && info.GetState() != berthv1.ExecState_EXEC_STATE_EXITED
	if stop && until <= since {
		return nil // nothing to replay
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reached := func(seq uint64) {
		if stop && seq >= until {
			cancel()
		}
	}
	e, err := c.Attach(ctx, sandboxID, execID, since, client.WithStdout(stdout), client.WithStderr(stderr),
		client.WithEventHandler(func(resp *berthv1.ExecResponse) {
			switch ev := resp.GetEvent().(type) {
			case *berthv1.ExecResponse_Output:
				reached(ev.Output.GetSeq())
			case *berthv1.ExecResponse_Dropped:
				reached(ev.Dropped.GetLastSeq())
			}
		}))
	if err != nil {
		return err
	}
	_, err = e.Wait()
	for _, d := range e.Dropped() {
		fmt.Fprintf(stderr, "berth: output %d to %d is no longer retained (%d bytes)\n", d.GetFirstSeq(), d.GetLastSeq(), d.GetLostBytes())
	}
	if err != nil && !(stop && e.LastSeq() >= until && errors.Is(ctx.Err(), context.Canceled)) {
		return fmt.Errorf("exec %s: %w", execID, err)
	}
	return nil
}

func newStatsCmd(g *globals) *cobra.Command {
	var (
		interval time.Duration
		stream   bool
	)
	cmd := &cobra.Command{
		Use:   "stats [--stream] SANDBOX...",
		Short: "Show sandboxes' CPU, memory, disk and process use",
		Long: `Show what each sandbox uses now (GetSandbox's usage): CPU as a percentage
of one core over --interval (two samples), memory working set and its cap,
disk beyond the image and its quota, processes and threads and their cap.
"-" stands for no cap. With --stream the table is printed again every
--interval until berth is interrupted.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return errors.New("--interval must be above zero")
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				prev, err := sampleUsage(ctx, g, c, args)
				if err != nil {
					return err
				}
				for {
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(interval):
					}
					cur, err := sampleUsage(ctx, g, c, args)
					if err != nil {
						return err
					}
					if err := writeStats(cmd.OutOrStdout(), prev, cur); err != nil || !stream {
						return err
					}
					prev = cur
				}
			})
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between the samples the CPU percentage is measured over")
	cmd.Flags().BoolVar(&stream, "stream", false, "print the table again every --interval")
	cmd.Flags().Bool("no-stream", true, "print once (the default; as docker stats --no-stream)")
	return cmd
}

// usageSample is the sandboxes of one round of GetSandbox and when it was
// taken.
type usageSample struct {
	at  time.Time
	sbs []*berthv1.Sandbox
}

func sampleUsage(ctx context.Context, g *globals, c *client.Client, ids []string) (usageSample, error) {
	s := usageSample{at: time.Now()}
	for _, id := range ids {
		rctx, cancel := g.unary(ctx)
		sb, err := c.GetSandbox(rctx, id)
		cancel()
		if err != nil {
			return s, fmt.Errorf("stats %s: %w", id, err)
		}
		s.sbs = append(s.sbs, sb)
	}
	return s, nil
}

// writeStats writes one row per sandbox of cur, its CPU percentage over
// the time since prev.
func writeStats(w io.Writer, prev, cur usageSample) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tCPU %\tCPU TIME\tMEM\tMEM LIMIT\tMEM PEAK\tDISK\tDISK LIMIT\tPIDS\tPIDS LIMIT")
	wall := cur.at.Sub(prev.at)
	for i, sb := range cur.sbs {
		u, r := sb.GetUsage(), sb.GetResources()
		cpu := "-"
		if wall > 0 && i < len(prev.sbs) && prev.sbs[i].GetRuntime().GetAgentBootId() == sb.GetRuntime().GetAgentBootId() {
			used := u.GetCpuTime().AsDuration() - prev.sbs[i].GetUsage().GetCpuTime().AsDuration()
			cpu = fmt.Sprintf("%.1f%%", 100*max(used, 0).Seconds()/wall.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", sb.GetId(), cpu, u.GetCpuTime().AsDuration().Round(time.Millisecond),
			byteSize(u.GetMemoryBytes()), limit(r.GetMemoryBytes(), byteSize), byteSize(u.GetMemoryPeakBytes()),
			byteSize(u.GetDiskBytes()), limit(r.GetDiskBytes(), byteSize), u.GetPids(), limit(r.GetPidsLimit(), func(n uint64) string { return fmt.Sprint(n) }))
	}
	return tw.Flush()
}

// limit renders a cap with f, "-" for none (zero).
func limit(v uint64, f func(uint64) string) string {
	if v == 0 {
		return "-"
	}
	return f(v)
}

// addDockerCommands adds to root what docker users reach for: inspect,
// logs, stats and --version (printing what "berth version" prints).
func addDockerCommands(root *cobra.Command, g *globals) {
	root.AddCommand(newInspectCmd(g), newLogsCmd(g), newStatsCmd(g))
	root.Version = buildVersion()
	root.SetVersionTemplate(versionLine())
}

// sandboxFilters are the --filter flags of "sandbox ls": labels berthd
// selects by, and states, owners and label keys berth matches itself.
type sandboxFilters struct {
	labels    map[string]string
	labelKeys []string
	states    map[berthv1.SandboxState]bool
	owners    map[string]bool
}

// parseSandboxFilters parses "label=KEY=VALUE", "label=KEY",
// "state=STATE" and "owner=NAME".
func parseSandboxFilters(fs []string) (sandboxFilters, error) {
	var f sandboxFilters
	for _, s := range fs {
		k, v, ok := strings.Cut(s, "=")
		if !ok || v == "" {
			return f, fmt.Errorf("--filter %q: want label=KEY=VALUE, label=KEY, state=STATE or owner=NAME", s)
		}
		switch k {
		case "label":
			lk, lv, hasValue := strings.Cut(v, "=")
			if !hasValue {
				f.labelKeys = append(f.labelKeys, lk)
				continue
			}
			if f.labels == nil {
				f.labels = map[string]string{}
			}
			f.labels[lk] = lv
		case "state", "status":
			st, ok := berthv1.SandboxState_value["SANDBOX_STATE_"+strings.ToUpper(v)]
			if !ok || st == 0 {
				return f, fmt.Errorf("--filter %q: state must be one of running, paused, starting, stopping, stopped", s)
			}
			if f.states == nil {
				f.states = map[berthv1.SandboxState]bool{}
			}
			f.states[berthv1.SandboxState(st)] = true
		case "owner":
			if f.owners == nil {
				f.owners = map[string]bool{}
			}
			f.owners[v] = true
		default:
			return f, fmt.Errorf("--filter %q: unknown filter %q (label, state or owner)", s, k)
		}
	}
	return f, nil
}

// addLabels returns sel with the filters' KEY=VALUE labels added, for
// berthd to select by.
func (f sandboxFilters) addLabels(sel map[string]string) map[string]string {
	if len(f.labels) == 0 {
		return sel
	}
	if sel == nil {
		sel = map[string]string{}
	}
	maps.Copy(sel, f.labels)
	return sel
}

// match reports whether sb passes the filters berth applies itself.
func (f sandboxFilters) match(sb *berthv1.Sandbox) bool {
	for _, k := range f.labelKeys {
		if _, ok := sb.GetLabels()[k]; !ok {
			return false
		}
	}
	return (f.states == nil || f.states[sb.GetState()]) && (f.owners == nil || f.owners[sb.GetOwner()])
}
