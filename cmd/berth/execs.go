package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newPsCmd(g *globals) *cobra.Command {
	var (
		quiet  bool
		output outputFormat
	)
	cmd := &cobra.Command{
		Use:   "ps SANDBOX",
		Short: "List a sandbox's running and recently ended commands",
		Long: `List the execs of SANDBOX that run, or that ended within the agent's
retention time (10 minutes by default), oldest first. LAST SEQ is the
sequence number of the exec's last output event ("berth attach --since N"
replays what came after N). EXIT shows the exit status of an ended exec,
with the signal and "timeout" or "oom" when they apply.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.ListExecs(ctx, args[0])
				if err != nil {
					return err
				}
				if n := resp.GetOmitted(); n > 0 {
					// Never a silent cut: say that the oldest are missing.
					fmt.Fprintf(cmd.ErrOrStderr(), "berth: %d older execs not shown (the listing is limited in size)\n", n)
				}
				switch {
				case quiet:
					for _, x := range resp.GetExecs() {
						fmt.Fprintln(cmd.OutOrStdout(), x.GetExecId())
					}
					return nil
				case output == "json":
					return writeJSONList(cmd.OutOrStdout(), resp.GetExecs())
				}
				return writeExecTable(cmd.OutOrStdout(), resp.GetExecs(), time.Now())
			})
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print exec ids only")
	cmd.Flags().BoolP("all", "a", true, "running and ended execs: berth ps always lists both; accepted as for docker ps -a")
	addOutputFlag(cmd, &output, "table")
	return cmd
}

// writeExecTable prints execs as a table.
func writeExecTable(w io.Writer, execs []*berthv1.ExecInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EXEC ID\tSTATE\tPID\tSTARTED\tTIMEOUT\tLAST SEQ\tEXIT\tCOMMAND")
	for _, x := range execs {
		state, exit := "running", ""
		if x.GetState() == berthv1.ExecState_EXEC_STATE_EXITED {
			state, exit = "exited", exitSummary(x.GetResult())
		}
		command := strings.Join(x.GetArgv(), " ")
		if x.GetArgvTruncated() {
			command += " ..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", x.GetExecId(), state, x.GetPid(), ago(x.GetStartedAt().AsTime(), now), timeoutLeft(x, now), x.GetLastSeq(), exit, shorten(command, 60))
	}
	return tw.Flush()
}

// timeoutLeft renders how long a running exec has before its timeout ends
// it ("29m left"), "none" when it has no timeout, and the timeout itself
// for an ended exec.
func timeoutLeft(x *berthv1.ExecInfo, now time.Time) string {
	if x.GetTimeout() == nil {
		return "none"
	}
	d := x.GetTimeout().AsDuration()
	if x.GetState() == berthv1.ExecState_EXEC_STATE_EXITED {
		return d.String()
	}
	return shortDuration(x.GetStartedAt().AsTime().Add(d).Sub(now)) + " left"
}

// shortDuration renders d in its largest whole unit: 45s, 29m, 23h.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d.Seconds()), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	}
	return fmt.Sprintf("%dh", int(d.Hours()))
}

// exitSummary renders a result as "137 SIGKILL oom".
func exitSummary(res *berthv1.ExecResult) string {
	parts := []string{fmt.Sprint(res.GetExitCode())}
	if res.GetSignal() != "" {
		parts = append(parts, res.GetSignal())
	}
	if res.GetTimedOut() {
		parts = append(parts, "timeout")
	}
	if res.GetOomKilled() {
		parts = append(parts, "oom")
	}
	return strings.Join(parts, " ")
}

func newAttachCmd(g *globals) *cobra.Command {
	var (
		since       uint64
		interactive bool
	)
	cmd := &cobra.Command{
		Use:   "attach [flags] SANDBOX EXEC_ID",
		Short: "Follow a running or ended command's output and exit status",
		Long: `Replay the retained output of exec EXEC_ID of SANDBOX after sequence number
--since, follow it live until it ends, and exit with its exit status, as
"berth exec" does. Output the agent no longer retains is reported on stderr.
With -i, berth's standard input is forwarded to the command (which must have
been started with stdin). SIGINT and SIGTERM are forwarded to the command.`,
		Example: `  id=$(berth exec -d my-sandbox -- make test)
  berth attach my-sandbox "$id"`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandboxID, execID := args[0], args[1]
			return g.withRelay(cmd, func(ctx context.Context, c *client.Client, relay *signalRelay) error {
				var stdin io.Reader
				if interactive {
					stdin = os.Stdin
				}
				open := func(ctx context.Context, opts ...client.ExecOption) (*client.Execution, error) {
					return c.Attach(ctx, sandboxID, execID, since, opts...)
				}
				// berth's terminal stays as it is: whether the exec has one of
				// its own is not known here.
				return follow(ctx, g, c, relay, sandboxID, open, stdin, cmd.OutOrStdout(), cmd.ErrOrStderr(), nil)
			})
		},
	}
	cmd.Flags().Uint64Var(&since, "since", 0, "replay only output after this sequence number")
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "forward standard input to the command")
	return cmd
}

func newKillCmd(g *globals) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] SANDBOX EXEC_ID",
		Short: "Send a signal to a command's process group",
		Long: `Send SIGNAL (a name like TERM or SIGKILL, or a number like 9; default TERM)
to the process group of exec EXEC_ID of SANDBOX. A command that has ended
already gets nothing; berth says so on stderr and exits 0.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				state, err := c.SignalExec(ctx, args[0], args[1], sig)
				if err != nil {
					return err
				}
				if state == berthv1.ExecState_EXEC_STATE_EXITED {
					fmt.Fprintf(cmd.ErrOrStderr(), "berth: exec %s had ended already; no signal sent\n", args[1])
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number (signal(7))")
	return cmd
}
