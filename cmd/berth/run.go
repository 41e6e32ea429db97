package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

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
delete is reported on stderr without changing it.

The sandbox gets an id from berthd, the label berth-run=<token> and an idle
timeout of one minute (a running command keeps it alive), so a berthd with
a warm pool of REF (--warm-pool) hands out a ready sandbox when the flags
ask for its defaults (no --pids-limit).`,
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
			return g.withRelay(cmd, func(ctx context.Context, c *client.Client, relay *signalRelay) error {

				// berthd mints the id, so that a warm-pool member can be
				// handed out (a request naming an id never gets one). The
				// run label finds the sandbox to delete when the create was
				// interrupted after berthd acted on it; the short idle
				// timeout removes one that a create finished after that
				// (a running command keeps its sandbox however long it
				// runs).
				token := newRunToken()
				var id string
				defer func() {
					dctx, dcancel := g.unary(context.WithoutCancel(ctx))
					defer dcancel()
					ids := []string{id}
					if id == "" {
						ids = nil
						for sb, err := range c.ListSandboxes(dctx, map[string]string{runLabel: token}) {
							if err != nil {
								fmt.Fprintf(cmd.ErrOrStderr(), "berth: find the sandbox to delete: %s\n", describe(err))
								break
							}
							ids = append(ids, sb.GetId())
						}
					}
					for _, id := range ids {
						if derr := c.DeleteSandbox(dctx, id); derr != nil {
							fmt.Fprintf(cmd.ErrOrStderr(), "berth: delete sandbox %s: %s\n", id, describe(derr))
						}
					}
				}()
				if lbls == nil {
					lbls = map[string]string{}
				}
				lbls[runLabel] = token
				cctx, ccancel := g.unary(ctx)
				sb, err := c.CreateSandbox(cctx, &berthv1.CreateSandboxRequest{
					Image:       image,
					Labels:      lbls,
					Resources:   &berthv1.Resources{PidsLimit: pidsLimit},
					IdleTimeout: durationpb.New(runIdleTimeout),
				})
				ccancel()
				if err != nil {
					if s := relay.canceledBy(); s != nil {
						return exitStatus(signalExit(s))
					}
					return err
				}
				id = sb.GetId()
				stdin, tty := f.setup(spec, os.Stdin, os.Stdout)
				return execute(ctx, g, c, relay, id, spec, f.execOptions(), stdin, cmd.OutOrStdout(), cmd.ErrOrStderr(), tty)
			})
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&image, "image", "", "image reference to create the sandbox from (required)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label the sandbox, KEY=VALUE (repeatable)")
	cmd.Flags().Uint64Var(&pidsLimit, "pids-limit", 0, "maximum processes and threads in the sandbox (default berthd's)")
	cmd.Flags().Bool("rm", true, "delete the sandbox when the command ends: berth run always does; accepted as for docker run --rm")
	f.register(cmd.Flags(), false)
	return cmd
}

// runLabel labels the sandbox of a berth run with a random token of that
// run.
const runLabel = "berth-run"

// runIdleTimeout is the idle timeout of a berth run's sandbox: what is left
// of one whose deletion failed goes soon.
const runIdleTimeout = time.Minute

// newRunToken returns 16 random characters from [a-z2-7].
func newRunToken() string {
	return strings.ToLower(rand.Text()[:16])
}
