package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
)

// This file is the one place where berth's global flags become a connection
// to berthd, the way kubectl's cmdutil.Factory is: every command reaches
// berthd through withClient or call, so an option of the connection (an
// address, credentials, retries) is added here once.

// dial dials berthd with the credentials of the flags (credentials.go) and
// the client's retry policy: a FLEET_BUSY refusal and an unreachable agent
// (when nothing ran) are retried within --rpc-timeout, each retry noted on
// stderr.
func (g *globals) dial(ctx context.Context) (*client.Client, error) {
	opts, err := g.creds.options()
	if err != nil {
		return nil, err
	}
	return client.Dial(ctx, g.addr, append(opts, client.WithRetry(client.RetryPolicy{
		OnRetry: func(_ int, err error, wait time.Duration) {
			if g.stderr != nil {
				fmt.Fprintf(g.stderr, "berth: %s; retrying in %v\n", describe(err), wait.Round(time.Millisecond))
			}
		},
	}))...)
}

// withClient dials berthd, runs fn with the command's context and the
// client, and closes the client. fn bounds its own requests: it is for
// streams and transfers that --rpc-timeout does not bound (exec, cp, image
// import); one request uses call.
func (g *globals) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	c, err := g.dial(cmd.Context())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := cmd.Context()
	if g.noResume {
		ctx = client.NoResume(ctx)
	}
	return g.hint(fn(ctx, c))
}

// hint adds where berth looked for berthd to a failure to reach it: an
// UNAVAILABLE without a berth reason comes from the transport (no socket,
// connection refused), not from berthd.
func (g *globals) hint(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == codes.Unavailable && ce.Reason == "" {
		return fmt.Errorf("cannot reach berthd at %s (set --addr or $BERTH_ADDR): %w", g.addr, err)
	}
	return err
}

// withRelay is withClient for commands that follow a running command (exec,
// attach, run): ctx is canceled by relay, which forwards SIGINT and SIGTERM
// to the command once relay.setTarget names it (and cancels on SIGHUP),
// and a closed stdout comes back as EPIPE instead of killing berth.
func (g *globals) withRelay(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client, relay *signalRelay) error) error {
	return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		relay := startSignalRelay(cancel, cmd.ErrOrStderr())
		defer relay.close()
		signal.Ignore(syscall.SIGPIPE)
		return fn(ctx, c, relay)
	})
}

// call is withClient for commands made of one request: ctx ends after
// --rpc-timeout.
func (g *globals) call(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
		ctx, cancel := g.unary(ctx)
		defer cancel()
		return fn(ctx, c)
	})
}

// unary returns the context for one request to berthd: ctx bounded by
// --rpc-timeout, or not at all when it is 0.
func (g *globals) unary(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.rpcTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.rpcTimeout)
}

// completeSandboxIDs is the shell completion of a SANDBOX argument: the ids
// berthd lists that start with toComplete. suffix is appended to each (":"
// for SANDBOX:PATH arguments, which then continue without a space). It
// completes nothing, quietly, when berthd cannot be reached within a few
// seconds: a completion must never hang the shell.
func (g *globals) completeSandboxIDs(cmd *cobra.Command, toComplete, suffix string) ([]string, cobra.ShellCompDirective) {
	directive := cobra.ShellCompDirectiveNoFileComp
	if suffix != "" {
		directive |= cobra.ShellCompDirectiveNoSpace
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	opts, err := g.creds.options()
	if err != nil {
		return nil, directive
	}
	c, err := client.Dial(ctx, g.addr, opts...)
	if err != nil {
		return nil, directive
	}
	defer c.Close()
	var ids []string
	for sb, err := range c.ListSandboxes(ctx, nil) {
		if err != nil {
			return nil, directive | cobra.ShellCompDirectiveError
		}
		if strings.HasPrefix(sb.GetId(), toComplete) {
			ids = append(ids, sb.GetId()+suffix)
		}
	}
	return ids, directive
}

// sandboxArg returns a cobra ValidArgsFunction completing sandbox ids for
// the first argument only.
func (g *globals) sandboxArg() cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveDefault
		}
		return g.completeSandboxIDs(cmd, toComplete, "")
	}
}

// sandboxArgs completes sandbox ids for every argument (sandbox rm).
func (g *globals) sandboxArgs() cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return g.completeSandboxIDs(cmd, toComplete, "")
	}
}

// remoteArg completes SANDBOX: for arguments that are SANDBOX:PATH or a
// local path (cp, cat, ls): until a ":" is typed, sandbox ids with a ":"
// and local files.
func (g *globals) remoteArg() cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if strings.Contains(toComplete, ":") || strings.HasPrefix(toComplete, "/") || strings.HasPrefix(toComplete, ".") {
			return nil, cobra.ShellCompDirectiveDefault
		}
		ids, _ := g.completeSandboxIDs(cmd, toComplete, ":")
		return ids, cobra.ShellCompDirectiveNoSpace
	}
}
