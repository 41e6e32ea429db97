package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newExecCmd(g *globals) *cobra.Command {
	var f processFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX [--] COMMAND [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run COMMAND with its arguments, exactly as given (no shell), in the sandbox
SANDBOX; --shell runs a command string with /bin/sh -c instead.

Flags go before SANDBOX: everything after it belongs to the command.
The command's stdout and stderr bytes are copied to berth's as they arrive.
berth's standard input is forwarded when it is not a terminal (a pipe or a
file), or always with -i, and closed at its end; otherwise the command reads
/dev/null. SIGINT and SIGTERM sent to berth are forwarded to the command's
process group; at the third, berth stops waiting.

-t runs the command on a terminal of the size of berth's own (24x80 when
berth has none), with berth's TERM; its output arrives as one stream. With
-i as well and a terminal on berth's stdin, that terminal is put in raw mode
(every key, ^C included, goes to the command's terminal) and restored when
berth exits; window size changes are forwarded. At the end of forwarded
input the command's terminal gets EOT (^D).

-d starts the command in the background, prints its exec id and exits 0;
follow it with "berth attach", list it with "berth ps", signal it with
"berth kill".

berth exits with the command's exit status (128+N when signal N killed it),
and 125 when berth itself fails.`,
		Example: `  berth exec my-sandbox -- ls -l /workspace
  tar c src | berth exec my-sandbox -- tar x -C /workspace
  berth exec --timeout 10m --env CI=1 --shell 'make && make test' my-sandbox
  berth exec -it my-sandbox -- bash
  berth exec -d --id web my-sandbox -- python3 -m http.server`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandboxID, command := splitExecArgs(args, cmd.ArgsLenAtDash())
			spec, err := f.spec(command)
			if err != nil {
				return err
			}
			return g.withRelay(cmd, func(ctx context.Context, c *client.Client, relay *signalRelay) error {
				stdin, tty := f.setup(spec, os.Stdin, os.Stdout)
				if f.detach {
					return detach(ctx, g, c, sandboxID, spec, f.execOptions(), cmd.OutOrStdout(), cmd.ErrOrStderr())
				}
				return execute(ctx, g, c, relay, sandboxID, spec, f.execOptions(), stdin, cmd.OutOrStdout(), cmd.ErrOrStderr(), tty)
			})
		},
	}
	// Flags end at SANDBOX: what follows belongs to the command.
	cmd.Flags().SetInterspersed(false)
	f.register(cmd.Flags(), true)
	return cmd
}

// detach starts spec in the background and prints its exec id, and on
// stderr its timeout when it has one (a background exec without one has
// none).
func detach(ctx context.Context, g *globals, c *client.Client, sandboxID string, spec *berthv1.ProcessSpec, opts []client.ExecOption, stdout, stderr io.Writer) error {
	ctx, cancel := g.unary(ctx)
	defer cancel()
	started, err := c.ExecBackground(ctx, sandboxID, spec, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, started.GetExecId())
	if t := started.GetTimeout(); t != nil {
		fmt.Fprintf(stderr, "berth: exec %s runs in the background; its timeout (%v) ends it\n", started.GetExecId(), t.AsDuration())
	}
	return nil
}

// execute runs spec in the sandbox, copying its output to stdout and stderr
// and stdin (when not nil) to its standard input, with SIGINT and SIGTERM
// forwarded through relay, and with tty (when not nil) in raw mode and its
// size changes forwarded. It returns the command's exit status as an
// exitStatus, or why berth failed. Notices about the run (lost output, a
// timeout, an OOM kill, truncation) go to stderr.
func execute(ctx context.Context, g *globals, c *client.Client, relay *signalRelay, sandboxID string, spec *berthv1.ProcessSpec, execOpts []client.ExecOption, stdin io.Reader, stdout, stderr io.Writer, tty *terminal) error {
	start := func(ctx context.Context, opts ...client.ExecOption) (*client.Execution, error) {
		return c.Exec(ctx, sandboxID, spec, append(opts, execOpts...)...)
	}
	return follow(ctx, g, c, relay, sandboxID, start, stdin, stdout, stderr, tty)
}

// follow is execute for an exec that open starts or attaches to.
func follow(ctx context.Context, g *globals, c *client.Client, relay *signalRelay, sandboxID string, open func(context.Context, ...client.ExecOption) (*client.Execution, error), stdin io.Reader, stdout, stderr io.Writer, tty *terminal) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The start is bounded like any request; the command's run is bounded
	// by its own timeout.
	if tty != nil {
		// Raw before the command starts: output that arrives before the
		// switch would otherwise pass through berth's own line discipline
		// ("\r\n" would become "\r\r\n"). Also restored below, before any
		// notice is printed.
		if err := tty.makeRaw(); err != nil {
			return err
		}
		defer tty.restore()
	}
	var startTimedOut atomic.Bool
	stopStartTimer := func() bool { return true }
	if g.rpcTimeout > 0 {
		stopStartTimer = time.AfterFunc(g.rpcTimeout, func() { startTimedOut.Store(true); cancel() }).Stop
	}
	e, err := open(ctx, client.WithStdout(stdout), client.WithStderr(stderr))
	stopStartTimer()
	if err != nil {
		if s := relay.canceledBy(); s != nil {
			return exitStatus(signalExit(s))
		}
		if startTimedOut.Load() {
			return fmt.Errorf("no answer from berthd within %v (--rpc-timeout)", g.rpcTimeout)
		}
		return err
	}
	relay.setTarget(e)
	defer relay.setTarget(nil)
	if tty != nil {
		stopResizes := tty.forwardResizes(e, stderr)
		defer stopResizes()
	}
	if stdin != nil {
		// This goroutine is not waited for: a read(2) from a pipe cannot be
		// interrupted, and berth exits once the command has.
		go func() {
			if _, err := io.Copy(e.Stdin(), stdin); err != nil && !errors.Is(err, client.ErrStreamClosed) {
				fmt.Fprintf(stderr, "berth: forward stdin: %s\n", describe(err))
			}
			_ = e.Stdin().Close()
		}()
	}
	res, err := e.Wait()
	relay.setTarget(nil)
	if tty != nil {
		tty.restore()
	}
	if err != nil {
		if errors.Is(err, syscall.EPIPE) {
			// berth's reader went away: tell the command, as a local pipe
			// would.
			signalDetached(ctx, c, sandboxID, e.ID(), e.LastSeq(), "PIPE")
			return exitStatus(exitBrokenPipe)
		}
		if s := relay.canceledBy(); s != nil {
			return exitStatus(signalExit(s))
		}
		if startTimedOut.Load() {
			return fmt.Errorf("no answer from berthd within %v (--rpc-timeout)", g.rpcTimeout)
		}
		var replaced *client.RuntimeReplacedError
		if e.Started() != nil && !errors.As(err, &replaced) {
			// The stream broke, not the command: say how to pick it up
			// where berth left it.
			fmt.Fprintf(stderr, "berth: the command may still run; follow it with: berth attach --since %d %s %s\n", e.LastSeq(), sandboxID, e.ID())
		}
		return fmt.Errorf("exec %s: %w", e.ID(), err)
	}
	for _, n := range notices(e.Started(), res, e.Dropped()) {
		fmt.Fprintf(stderr, "berth: %s\n", n)
	}
	code, err := resultExit(res)
	if err != nil {
		return err
	}
	if code == 0 {
		return nil
	}
	return exitStatus(code)
}

// signalDetached sends signal name to an exec whose stream is gone, through
// a new one, at best effort.
func signalDetached(ctx context.Context, c *client.Client, sandboxID, execID string, since uint64, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
	defer cancel()
	a, err := c.Attach(ctx, sandboxID, execID, since)
	if err != nil {
		return
	}
	_ = a.Signal(ctx, name)
	cancel()
	_, _ = a.Wait()
}

// resultExit is berth's exit status for res: the command's exit code, which
// berthd reports as 0 to 255 (128+N for signal N).
func resultExit(res *berthv1.ExecResult) (int, error) {
	code := res.GetExitCode()
	if code < 0 || code > 255 {
		return 0, fmt.Errorf("berthd reported exit code %d, outside 0 to 255", code)
	}
	return int(code), nil
}

// notices lists what berth tells the user about a finished command besides
// its output: facts the exit status alone hides.
func notices(started *berthv1.ExecStarted, res *berthv1.ExecResult, dropped []*berthv1.ExecDropped) []string {
	var out []string
	for _, d := range dropped {
		out = append(out, fmt.Sprintf("output events %d to %d (%d bytes) were lost before berth read them", d.GetFirstSeq(), d.GetLastSeq(), d.GetLostBytes()))
	}
	if res.GetTimedOut() {
		out = append(out, fmt.Sprintf("the command timed out after %v", started.GetTimeout().AsDuration()))
	}
	if res.GetOomKilled() {
		out = append(out, "the command was killed for lack of memory (OOM)")
	}
	if res.GetStdoutTruncated() {
		out = append(out, fmt.Sprintf("stdout was cut at %d of %d bytes", started.GetStdoutLimitBytes(), res.GetStdoutBytes()))
	}
	if res.GetStderrTruncated() {
		out = append(out, fmt.Sprintf("stderr was cut at %d of %d bytes", started.GetStderrLimitBytes(), res.GetStderrBytes()))
	}
	return out
}
