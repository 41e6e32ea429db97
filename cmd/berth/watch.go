package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newWatchCmd(g *globals) *cobra.Command {
	var (
		req   berthv1.WatchFilesRequest
		count int
	)
	cmd := &cobra.Command{
		Use:   "watch [flags] SANDBOX PATH",
		Short: "Print file events under a directory of a sandbox as they happen",
		Long: `Watch the directory PATH of the sandbox and print one line per event, in
order, until interrupted (or --count events): first "watch ID LAST_SEQ",
then "SEQ KIND PATH" (KIND create, write, remove, rename; a rename ends
with "<- OLD_PATH") and "SEQ overflow REASON [PATH]" where events were lost
(rescan what you care about). Resume after a break with --id ID --since SEQ:
every later event is printed exactly once (docs/watch.md).`,
		Example: `  berth watch -r --include '*.py' my-sandbox /workspace
  berth watch --id wt-abc --since 120 my-sandbox /workspace`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 0 {
				return fmt.Errorf("--count %d: must not be negative", count)
			}
			req.SandboxId, req.Path = args[0], args[1]
			return g.withRelay(cmd, func(ctx context.Context, c *client.Client, _ *signalRelay) error {
				w, err := c.WatchFiles(ctx, &req)
				if err != nil {
					return err
				}
				defer w.Close()
				return printWatch(ctx, w, cmd.OutOrStdout(), count)
			})
		},
	}
	cmd.Flags().BoolVarP(&req.Recursive, "recursive", "r", false, "watch every directory under PATH too, later ones included")
	cmd.Flags().StringArrayVar(&req.Include, "include", nil, "print only events whose file name matches this shell pattern (repeatable)")
	cmd.Flags().StringVar(&req.WatchId, "id", "", "resume the watch of this id (with --since), or name a new one")
	cmd.Flags().Uint64Var(&req.SinceSeq, "since", 0, "with --id: print the events after this seq")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (default 0: until interrupted)")
	return cmd
}

// watchReceiver is a FileWatch (*client.FileWatch).
type watchReceiver interface {
	Recv() (*berthv1.WatchFilesResponse, error)
}

// printWatch prints w's messages, one line each, until ctx ends, the
// stream fails or count events (0: no bound) were printed.
func printWatch(ctx context.Context, w watchReceiver, out io.Writer, count int) error {
	for n := 0; count == 0 || n < count; {
		msg, err := w.Recv()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch ev := msg.GetEvent().(type) {
		case *berthv1.WatchFilesResponse_Started:
			fmt.Fprintf(out, "watch %s %d\n", ev.Started.GetWatchId(), ev.Started.GetLastSeq())
		case *berthv1.WatchFilesResponse_File:
			f := ev.File
			line := fmt.Sprintf("%d %s %s", f.GetSeq(), strings.ToLower(strings.TrimPrefix(f.GetKind().String(), "FILE_EVENT_KIND_")), f.GetPath())
			if f.GetOldPath() != "" {
				line += " <- " + f.GetOldPath()
			}
			fmt.Fprintln(out, line)
			n++
		case *berthv1.WatchFilesResponse_Overflow:
			o := ev.Overflow
			line := fmt.Sprintf("%d overflow %s", o.GetSeq(), strings.ToLower(strings.TrimPrefix(o.GetReason().String(), "FILE_WATCH_OVERFLOW_REASON_")))
			if o.GetPath() != "" {
				line += " " + o.GetPath()
			}
			if o.GetReason() == berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_RING {
				line += fmt.Sprintf(" %d-%d", o.GetFirstSeq(), o.GetLastSeq())
			}
			fmt.Fprintln(out, line)
			n++
		}
	}
	return nil
}
