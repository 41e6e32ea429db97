// Command berth is the command-line client of berthd: it manages sandboxes
// and images and runs commands in sandboxes.
//
// Exit status: berth exec and berth run exit with the command's exit status
// (128+N when a signal N killed it). Every command exits 125 when berth
// itself fails (bad usage, berthd unreachable, an RPC error, a broken
// stream), after printing "berth: <message> (<REASON>)" to stderr, so that
// berth's failures stand apart from the command's own statuses (the
// convention of docker run). When berth is interrupted by signal N before the
// command started, or gives up waiting after repeated signals, it exits
// 128+N; when its stdout or stderr is a closed pipe it exits 141 (128+SIGPIPE).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

// Exit statuses of berth's own.
const (
	// exitBerth says berth itself failed.
	exitBerth = 125
	// exitBrokenPipe is what a shell reports for a process killed by
	// SIGPIPE.
	exitBrokenPipe = 128 + 13
)

// defaultAddr is used when neither --addr nor BERTH_ADDR is set.
const defaultAddr = "unix:///run/berth/berthd.sock"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return exitCode(root.ExecuteContext(ctx), stderr)
}

// globals are the flags every subcommand takes; connect.go turns them into
// a connection to berthd.
type globals struct {
	addr       string
	creds      credentialFlags
	rpcTimeout time.Duration
	// noResume makes calls that name a paused sandbox fail (--no-resume).
	noResume bool
	stderr   io.Writer // set before any subcommand runs
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "berth",
		Short: "Run commands in berth sandboxes",
		Long: `berth talks to berthd, the berth sandbox service: it creates and deletes
sandboxes, imports images and runs commands inside sandboxes.

Exit status: "berth exec" and "berth run" exit with the command's status
(128+N when signal N killed it). berth exits 125 when it fails itself (bad
usage, berthd unreachable, an error from berthd), after printing
"berth: <message> (<REASON>)" on stderr; 128+N when interrupted by signal N
before the command started; 141 when its output is a closed pipe.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", addrDefault(os.Getenv), "berthd address: unix:///path/to.sock, unix:/path, /path or host:port; $BERTH_ADDR sets the default")
	g.creds.register(root.PersistentFlags(), os.Getenv)
	root.PersistentFlags().BoolVar(&g.noResume, "no-resume", false, "do not resume a paused sandbox nor wake a hibernated one: a command naming one fails with SANDBOX_PAUSED or SANDBOX_HIBERNATED instead")
	root.PersistentFlags().DurationVar(&g.rpcTimeout, "rpc-timeout", time.Minute, "deadline of each request to berthd, and of starting a command; 0 for none (\"berth exec --timeout\" bounds the command itself)")
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) { g.stderr = cmd.ErrOrStderr() }
	root.AddCommand(newSandboxCmd(g), newExecCmd(g), newRunCmd(g), newPsCmd(g), newAttachCmd(g), newContextCmd(g), newKillCmd(g), newImageCmd(g), newNodeCmd(g), newSnapshotCmd(g), newVolumeCmd(g), newSessionCmd(g), newWatchCmd(g), newVersionCmd())
	root.AddCommand(newCpCmd(g), newLsCmd(g), newCatCmd(g), newPortForwardCmd(g))
	addDockerCommands(root, g)
	// Shell completion (berth completion bash|zsh|fish|powershell) of
	// sandbox ids, asked of berthd.
	for path, complete := range map[string]cobra.CompletionFunc{
		"exec": g.sandboxArg(), "ps": g.sandboxArg(), "logs": g.sandboxArg(), "inspect": g.sandboxArgs(), "stats": g.sandboxArgs(), "attach": g.sandboxArg(), "kill": g.sandboxArg(),
		"sandbox get": g.sandboxArg(), "sandbox keepalive": g.sandboxArg(), "sandbox rm": g.sandboxArgs(),
		"cp": g.remoteArg(), "cat": g.remoteArg(), "ls": g.remoteArg(),
	} {
		if c, _, err := root.Find(strings.Fields(path)); err == nil {
			c.ValidArgsFunction = complete
		}
	}
	return root
}

// addrDefault returns $BERTH_ADDR, or defaultAddr when it is empty.
func addrDefault(getenv func(string) string) string {
	if a := getenv("BERTH_ADDR"); a != "" {
		return a
	}
	return defaultAddr
}

// exitStatus carries an exit status out of a command without a message: the
// command's own, or one berth chose and already explained.
type exitStatus int

func (s exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// exitCode maps what a command returned to berth's exit status, printing
// berth's own failures to stderr.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var st exitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	fmt.Fprintf(stderr, "berth: %s\n", describe(err))
	return exitBerth
}

// describe renders err for people: a berthd error as "<message> (<REASON>)",
// with its field violations. Text from berthd may carry names from a
// sandbox, so every piece goes through terminalSafe; the line breaks
// between violations are berth's own. berth's own errors keep their line
// breaks and tabs (cobra's suggestions), with every other control character
// escaped.
func describe(err error) string {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return strings.TrimRight(terminalSafeLines(err.Error()), "\n")
	}
	tag := ce.Reason
	if tag == "" {
		tag = ce.Code.String()
	}
	msg := fmt.Sprintf("%s (%s)", terminalSafe(ce.Message), terminalSafe(tag))
	for _, v := range ce.FieldViolations {
		if v.Field+": "+v.Description != ce.Message {
			msg += fmt.Sprintf("\n  %s: %s", terminalSafe(v.Field), terminalSafe(v.Description))
		}
	}
	// Add the context berth put around the error, if any.
	if prefix, ok := strings.CutSuffix(err.Error(), ce.Error()); ok {
		msg = terminalSafe(prefix) + msg
	}
	return msg
}

// newGroupCmd returns a command that only groups subcommands. Alone it
// prints its help; with an unknown subcommand it fails (exit 125) naming it,
// with cobra's suggestions, as the root command does. (cobra itself prints
// the help and exits 0 for an unknown subcommand of a group.)
func newGroupCmd(use, short string, aliases ...string) *cobra.Command {
	return &cobra.Command{
		Use:                        use,
		Aliases:                    aliases,
		Short:                      short,
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2, // cobra's default for the root
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t") + "\n"
			}
			return errors.New(msg)
		},
	}
}
