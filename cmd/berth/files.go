package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"regexp"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// defaultRemoteDir is where relative sandbox paths start: the sandbox's
// default working directory.
const defaultRemoteDir = "/workspace"

// remoteRef matches SANDBOX:PATH; the id follows the sandbox id rules.
var remoteRef = regexp.MustCompile(`^([a-z0-9][a-z0-9-]{0,62}):(.*)$`)

// remote is a path inside a sandbox.
type remote struct {
	sandboxID string
	path      string // absolute, cleaned
}

func (r remote) String() string { return r.sandboxID + ":" + r.path }

// parseRemote parses SANDBOX:PATH. A path that starts with "/" or "." is
// local even when it holds a colon. A relative PATH starts at /workspace;
// an empty one is /workspace.
func parseRemote(arg string) (remote, bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return remote{}, false
	}
	m := remoteRef.FindStringSubmatch(arg)
	if m == nil {
		return remote{}, false
	}
	p := m[2]
	if !strings.HasPrefix(p, "/") {
		p = defaultRemoteDir + "/" + p
	}
	return remote{sandboxID: m[1], path: path.Clean(p)}, true
}

// transferProgress draws one status line for a transfer on a terminal
// (progress: total, rate and time), at most ten times a second; nil draws
// nothing.
type transferProgress struct{ *progress }

// newTransferProgress returns a progress line on stderr when it is a
// terminal, and nil otherwise. total is the bytes the transfer moves, -1
// when unknown; approx says it is an estimate (an archive's size from its
// files' sizes).
func newTransferProgress(stderr io.Writer, label string, total int64, approx bool) *transferProgress {
	f, ok := stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return &transferProgress{&progress{w: f, verb: "copying", label: label, total: total, approx: approx}}
}

// option returns the client option reporting to p, or none for nil.
func (p *transferProgress) option() []client.FileOption {
	if p == nil {
		return nil
	}
	return []client.FileOption{client.WithTransferProgress(p.update)}
}

// done ends the line.
func (p *transferProgress) done() {
	if p != nil {
		p.progress.done()
	}
}

func newCatCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cat SANDBOX:PATH...",
		Short: "Print files from a sandbox",
		Long: `Print the files to standard output, byte for byte. A relative PATH starts at
/workspace. berth fails (exit 125) when a file changed while it was read
(FILE_CHANGED): what was printed is then incomplete.`,
		Example: `  berth cat dev:/etc/os-release
  berth cat dev:out/result.json | jq .`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var refs []remote
			for _, a := range args {
				r, ok := parseRemote(a)
				if !ok {
					return fmt.Errorf("%q: want SANDBOX:PATH", a)
				}
				refs = append(refs, r)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				quietPipe()
				for _, r := range refs {
					if _, err := c.ReadFile(ctx, r.sandboxID, r.path, cmd.OutOrStdout()); err != nil {
						return pipeAware(fmt.Errorf("cat %s: %w", r, err))
					}
				}
				return nil
			})
		},
	}
}

func newLsCmd(g *globals) *cobra.Command {
	var (
		long      bool
		recursive bool
		depth     uint32
	)
	cmd := &cobra.Command{
		Use:   "ls [-l] [-R | --depth N] SANDBOX[:PATH]",
		Short: "List a directory in a sandbox",
		Long: `List the directory PATH in the sandbox (default /workspace; a relative PATH
starts there), in byte order. Symlinks are listed, never followed. Bytes that
are not UTF-8, control characters and bidirectional formatting characters in
names are shown as \xNN escapes, so that a name cannot steer your terminal.
-l adds type and mode, owner,
size and modification time; -R lists all levels below.`,
		Example: `  berth ls dev
  berth ls -l dev:/etc
  berth ls -R dev:src`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, ok := parseRemote(args[0])
			if !ok {
				if !remoteRef.MatchString(args[0] + ":") {
					return fmt.Errorf("%q: want SANDBOX[:PATH]", args[0])
				}
				r = remote{sandboxID: args[0], path: defaultRemoteDir}
			}
			if recursive {
				depth = 1<<32 - 1
			}
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				entries, errs, err := c.ListDir(ctx, r.sandboxID, r.path, depth)
				if err != nil {
					return fmt.Errorf("ls %s: %w", r, err)
				}
				quietPipe()
				if err := writeListing(cmd.OutOrStdout(), r.path, entries, long); err != nil {
					return pipeAware(err)
				}
				for _, e := range errs {
					fmt.Fprintf(cmd.ErrOrStderr(), "berth: ls: %s (%s)\n", terminalSafe(e.GetMessage()), terminalSafe(e.GetReason()))
				}
				if len(errs) > 0 {
					return exitStatus(1)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "show type and mode, owner, size and modification time")
	cmd.Flags().BoolVarP(&recursive, "recursive", "R", false, "list every level below PATH")
	cmd.Flags().Uint32Var(&depth, "depth", 1, "levels to list (1: PATH's entries)")
	return cmd
}

// writeListing prints entries: names relative to dir, with -l details.
// Names come from the sandbox: they are printed through terminalSafe.
func writeListing(w io.Writer, dir string, entries []*berthv1.FileInfo, long bool) error {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	for _, e := range entries {
		name := terminalSafe(strings.TrimPrefix(e.GetDisplayPath(), prefix))
		if !long {
			if _, err := fmt.Fprintln(w, name); err != nil {
				return err
			}
			continue
		}
		if e.GetType() == berthv1.FileType_FILE_TYPE_SYMLINK {
			name += " -> " + terminalSafe(e.GetDisplaySymlinkTarget())
		}
		fmt.Fprintf(tw, "%s\t %d\t %d\t %d\t %s\t %s\n", modeString(e), e.GetUid(), e.GetGid(), e.GetSizeBytes(), e.GetModifiedAt().AsTime().Local().Format("2006-01-02 15:04"), name)
	}
	if long {
		return tw.Flush()
	}
	return nil
}

// modeString renders a type and mode as ls -l does: "drwxr-xr-x",
// "-rwsr-x---", "lrwxrwxrwx".
func modeString(e *berthv1.FileInfo) string {
	types := map[berthv1.FileType]byte{
		berthv1.FileType_FILE_TYPE_DIRECTORY:    'd',
		berthv1.FileType_FILE_TYPE_SYMLINK:      'l',
		berthv1.FileType_FILE_TYPE_FIFO:         'p',
		berthv1.FileType_FILE_TYPE_SOCKET:       's',
		berthv1.FileType_FILE_TYPE_CHAR_DEVICE:  'c',
		berthv1.FileType_FILE_TYPE_BLOCK_DEVICE: 'b',
	}
	b := []byte("----------")
	if c, ok := types[e.GetType()]; ok {
		b[0] = c
	}
	m := e.GetMode()
	for i, c := range "rwxrwxrwx" {
		if m&(1<<(8-i)) != 0 {
			b[1+i] = byte(c)
		}
	}
	special := func(bit uint32, at int, set, unset byte) {
		if m&bit == 0 {
			return
		}
		if b[at] == 'x' {
			b[at] = set
		} else {
			b[at] = unset
		}
	}
	special(0o4000, 3, 's', 'S')
	special(0o2000, 6, 's', 'S')
	special(0o1000, 9, 't', 'T')
	return string(b)
}

// quietPipe makes a write to a closed stdout fail with EPIPE instead of
// killing berth, so that pipeAware can exit 141 like a shell tool.
func quietPipe() { signal.Ignore(syscall.SIGPIPE) }

// pipeAware turns a broken pipe into exit status 141.
func pipeAware(err error) error {
	if errors.Is(err, syscall.EPIPE) {
		return exitStatus(exitBrokenPipe)
	}
	return err
}
