package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// newContextCmd is `berth context`: code contexts (docs/contexts.md).
func newContextCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Run Python cells in long-lived interpreters (code contexts)",
	}
	var (
		id, cwd, user string
		envs          []string
	)
	create := &cobra.Command{
		Use:   "create [flags] SANDBOX",
		Short: "Start a code context (a Python interpreter) and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env := map[string]string{}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: want NAME=VALUE", kv)
				}
				env[k] = v
			}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				cx, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: args[0], ContextId: id, Cwd: cwd, User: user, Env: env})
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), cx.GetContextId())
				return nil
			})
		},
	}
	create.Flags().StringVar(&id, "id", "", "the context's id (default: minted, cx-...)")
	create.Flags().StringVar(&cwd, "cwd", "", "the interpreter's working directory")
	create.Flags().StringVarP(&user, "user", "u", "", "run the interpreter as this user (name, uid or uid:gid)")
	create.Flags().StringArrayVarP(&envs, "env", "e", nil, "NAME=VALUE for the interpreter's environment (repeatable)")

	var timeout time.Duration
	run := &cobra.Command{
		Use:   "run [flags] SANDBOX CONTEXT CODE|-",
		Short: "Run a cell in a code context",
		Long: `Run CODE (or, with -, standard input) as one cell in context CONTEXT of
SANDBOX. The cell's stdout and stderr are printed as they come; its results
after them on stdout: text/plain, or "[image/png: N bytes]" for a result
with no text. An exception prints its traceback on stderr and berth exits 1.`,
		Example: `  berth context run my-sandbox cx-abc 'x = 41'
  berth context run my-sandbox cx-abc 'x + 1'   # prints 42`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			code := args[2]
			if code == "-" {
				b, err := io.ReadAll(os.Stdin)
				if err != nil {
					return err
				}
				code = string(b)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
				opts := []client.RunCodeOption{client.OnCodeEvent(func(ev *berthv1.ExecuteCodeResponse) {
					switch e := ev.GetEvent().(type) {
					case *berthv1.ExecuteCodeResponse_Stdout:
						io.WriteString(out, e.Stdout)
					case *berthv1.ExecuteCodeResponse_Stderr:
						io.WriteString(errOut, e.Stderr)
					case *berthv1.ExecuteCodeResponse_Result:
						fmt.Fprintln(out, resultText(e.Result))
					case *berthv1.ExecuteCodeResponse_Error:
						io.WriteString(errOut, strings.Join(e.Error.GetTraceback(), ""))
					}
				})}
				if timeout > 0 {
					opts = append(opts, client.WithCodeTimeout(timeout))
				}
				ex, err := c.RunCode(ctx, args[0], args[1], code, opts...)
				if err != nil {
					return err
				}
				if ex.Error != nil {
					return exitStatus(1)
				}
				return nil
			})
		},
	}
	run.Flags().DurationVar(&timeout, "timeout", 0, "interrupt the cell after this long (default 30m)")

	ls := &cobra.Command{
		Use:   "ls SANDBOX",
		Short: "List a sandbox's code contexts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				list, err := c.ListCodeContexts(ctx, args[0])
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CONTEXT ID\tLANGUAGE\tPID\tSTARTED\tEXEC ID")
				now := time.Now()
				for _, cx := range list {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", cx.GetContextId(), cx.GetLanguage(), cx.GetPid(), ago(cx.GetStartedAt().AsTime(), now), cx.GetExecId())
				}
				return tw.Flush()
			})
		},
	}
	simple := func(use, short string, fn func(context.Context, *client.Client, string, string) error) *cobra.Command {
		return &cobra.Command{
			Use:   use + " SANDBOX CONTEXT",
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				return g.call(cmd, func(ctx context.Context, c *client.Client) error { return fn(ctx, c, args[0], args[1]) })
			},
		}
	}
	cmd.AddCommand(create, run, ls,
		simple("rm", "End a code context", func(ctx context.Context, c *client.Client, sb, cx string) error {
			return c.DeleteCodeContext(ctx, sb, cx)
		}),
		simple("interrupt", "Interrupt the running cell (KeyboardInterrupt)", func(ctx context.Context, c *client.Client, sb, cx string) error {
			return c.InterruptCodeContext(ctx, sb, cx)
		}),
		simple("restart", "Restart a context's interpreter; its variables are gone", func(ctx context.Context, c *client.Client, sb, cx string) error {
			_, err := c.RestartCodeContext(ctx, sb, cx)
			return err
		}))
	return cmd
}

// resultText renders a result for a terminal: its text/plain, else its
// MIME types and sizes.
func resultText(r *berthv1.CodeResult) string {
	if t, ok := r.GetData()["text/plain"]; ok && len(r.GetData()) == 1 {
		return terminalSafe(string(t))
	}
	var parts []string
	for mime, b := range r.GetData() {
		if mime != "text/plain" {
			parts = append(parts, fmt.Sprintf("[%s: %d bytes]", mime, len(b)))
		}
	}
	slices.Sort(parts)
	if t, ok := r.GetData()["text/plain"]; ok {
		parts = append(parts, terminalSafe(string(t)))
	}
	return strings.Join(parts, " ")
}
