package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newRunCmd(g *globals) *cobra.Command {
	var (
		f         processFlags
		image     string
		labels    []string
		pidsLimit uint64
	)
	cmd := &cobra.Command{
		Use:   "run --image REF [flags] [--] COMMAND [ARG...]",
		Short: "Run a command in a new sandbox, then delete the sandbox",
		Long: `Create a sandbox from REF, run COMMAND in it as "berth exec" does, and
delete the sandbox, also when the command fails, creating it fails, or berth
is interrupted. berth exits with the command's exit status; a failure to
delete is reported on stderr without changing it.`,
		Example: `  berth run --image berth.dev/base:latest -- uname -a
  berth run --image berth.dev/base:latest --shell 'echo $HOME'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if image == "" {
				return errors.New("--image is required")
			}
			spec, err := f.spec(args)
			if err != nil {
				return err
			}
			lbls, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				relay := startSignalRelay(cancel, cmd.ErrOrStderr())
				defer relay.close()
				signal.Ignore(syscall.SIGPIPE)

				// The id is chosen here so that the sandbox can be deleted even
				// when the create was interrupted after berthd acted on it.
				id := newRunSandboxID()
				defer func() {
					dctx, dcancel := g.unary(context.WithoutCancel(ctx))
					defer dcancel()
					if derr := c.DeleteSandbox(dctx, id); derr != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "berth: delete sandbox %s: %s\n", id, describe(derr))
					}
				}()
				cctx, ccancel := g.unary(ctx)
				_, err := c.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{
					SandboxId: id,
					Image:     image,
					Labels:    lbls,
					Resources: &berthv1.Resources{PidsLimit: pidsLimit},
				})
				ccancel()
				if err != nil {
					if s := relay.canceledBy(); s != nil {
						return exitStatus(signalExit(s))
					}
					return err
				}
				stdin, tty := f.setup(spec, os.Stdin, os.Stdout)
				return execute(ctx, g, c, relay, id, spec, nil, stdin, cmd.OutOrStdout(), cmd.ErrOrStderr(), tty)
			})
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&image, "image", "", "image reference to create the sandbox from (required)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label the sandbox, KEY=VALUE (repeatable)")
	cmd.Flags().Uint64Var(&pidsLimit, "pids-limit", 0, "maximum processes and threads in the sandbox (default berthd's)")
	f.register(cmd.Flags(), false)
	return cmd
}

// newRunSandboxID returns "run-" and 12 random characters from [a-z2-7].
func newRunSandboxID() string {
	return "run-" + strings.ToLower(rand.Text()[:12])
}
