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

func newSessionCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("session", "Create, list and remove shell sessions of a sandbox", "sess")
	cmd.AddCommand(newSessionCreateCmd(g), newSessionListCmd(g), newSessionRemoveCmd(g))
	return cmd
}

func newSessionCreateCmd(g *globals) *cobra.Command {
	var (
		req  berthv1.CreateSessionRequest
		bash bool
		env  []string
	)
	cmd := &cobra.Command{
		Use:   "create SANDBOX [flags]",
		Short: "Start a shell session and print its id",
		Long: `Start a shell in the sandbox whose cwd, environment, variables, functions
and background jobs persist from one command to the next, and print its id.
Run commands in it with "berth exec --session ID --shell CMD SANDBOX"; each
has its own exit status, output and timeout (docs/sessions.md).`,
		Example: `  s=$(berth session create --bash my-sandbox)
  berth exec --session $s --shell 'cd /tmp; export A=1' my-sandbox
  berth exec --session $s --shell 'pwd; echo $A' my-sandbox`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			req.SandboxId = args[0]
			if bash {
				req.Shell = berthv1.Shell_SHELL_BASH
			}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				s, err := c.CreateSession(ctx, &req)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), s.GetSessionId())
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&req.SessionId, "id", "", "session id, 1 to 128 characters from [A-Za-z0-9._-] (default: minted by berthd)")
	cmd.Flags().StringVar(&req.Name, "name", "", "a label of yours for the session")
	cmd.Flags().BoolVar(&bash, "bash", false, "run bash instead of /bin/sh")
	cmd.Flags().StringVarP(&req.Cwd, "cwd", "w", "", "the shell's first working directory (default the sandbox's)")
	cmd.Flags().StringVarP(&req.User, "user", "u", "", `run the shell as this user: "uid", "uid:gid" or a name (default the sandbox's)`)
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable of the shell, KEY=VALUE (repeatable)")
	return cmd
}

func newSessionListCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls SANDBOX",
		Aliases: []string{"list"},
		Short:   "List a sandbox's shell sessions",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				sessions, err := c.ListSessions(ctx, args[0])
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), sessions)
				}
				return writeSessionTable(cmd.OutOrStdout(), sessions, time.Now())
			})
		},
	}
	addOutputFlag(cmd, &output, "table")
	return cmd
}

func writeSessionTable(w io.Writer, sessions []*berthv1.SessionInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSHELL\tSTATE\tCOMMANDS\tCREATED")
	for _, s := range sessions {
		name := s.GetName()
		if name == "" {
			name = "-"
		}
		shell := strings.ToLower(strings.TrimPrefix(s.GetShell().String(), "SHELL_"))
		state := strings.ToLower(strings.TrimPrefix(s.GetState().String(), "SESSION_STATE_"))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.GetSessionId(), name, shell, state, s.GetCommands(), ago(s.GetCreatedAt().AsTime(), now))
	}
	return tw.Flush()
}

func newSessionRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SANDBOX SESSION...",
		Aliases: []string{"remove", "delete"},
		Short:   "End shell sessions",
		Long:    `End each session (its shell and background jobs get SIGHUP, then SIGKILL) and print its id.`,
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doEach(cmd, g, "remove session ", args[1:], func(c *client.Client, ctx context.Context, id string) error {
				return c.DeleteSession(ctx, args[0], id)
			})
		},
	}
}
