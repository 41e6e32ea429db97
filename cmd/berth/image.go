package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rootfsimage"
	"github.com/berth-sandbox/berth/internal/tartree"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newImageCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("image", "Import, pull, list and delete images")
	cmd.AddCommand(newImageImportCmd(g), newImagePullCmd(g), newImageListCmd(g), newImageRemoveCmd(g))
	return cmd
}

func newImageImportCmd(g *globals) *cobra.Command {
	var (
		name, cmdLine string
		rootfs        bool
	)
	cmd := &cobra.Command{
		Use:   "import SOURCE [--name REF]",
		Short: "Import an image: an OCI or docker save archive, or a root filesystem",
		Long: `Import an image into berthd from SOURCE, and print the name and digest of
each image stored. SOURCE is a file, a directory, or "-" for standard input:

  - an OCI image archive (an OCI layout as tar) or an OCI layout directory;
  - what docker save writes (either format, with or without an OCI layout);
  - a root filesystem: a directory, or a tar archive of one (debootstrap,
    mkosi, docker export, tar -C ROOT -c .). It becomes an image of one layer
    that holds the tree as it is — numeric owners, modes, mtimes, hard links,
    symlinks, device nodes — with the usual PATH and --cmd; it needs --name.
    Read a system tree as root, so that every file can be read.

Archives may be gzip-compressed. Which kind an archive is, berth tells by
its entries (--rootfs forces a root filesystem). Progress is shown on
stderr when it is a terminal. The import is not bounded by --rpc-timeout.`,
		Example: `  berth image import build/base.oci.tar
  docker save app:1 | berth image import -
  sudo debootstrap --variant=minbase bookworm /srv/deb http://deb.debian.org/debian
  sudo berth image import --name debian:bookworm /srv/deb
  tar -C /srv/deb --numeric-owner -cz . | berth image import --name debian:bookworm -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := openImageSource(args[0], rootfs)
			if err != nil {
				return err
			}
			defer src.close()
			archive := src.archive
			if src.rootfs != nil {
				if name == "" {
					return fmt.Errorf("%s is a root filesystem, which names no image: give --name", args[0])
				}
				opts := rootfsimage.Options{Cmd: strings.Fields(cmdLine), Skip: func(path, why string) {
					fmt.Fprintf(cmd.ErrOrStderr(), "berth: image import: skipped %s: %s\n", terminalSafe(tartree.Display(path)), why)
				}}
				img, err := src.rootfs(opts)
				if err != nil {
					return fmt.Errorf("make an image of %s: %w", args[0], err)
				}
				defer img.Close()
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(rootfsimage.Write(pw, img)) }()
				defer pr.Close()
				archive, src.total = pr, -1
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var nodes []*berthv1.ImageNodeResult
				opts := []client.ImportOption{client.WithImportNodes(func(r []*berthv1.ImageNodeResult) { nodes = r })}
				p := &progress{verb: "sending", label: src.label, total: src.total, sentPhase: "storing and unpacking"}
				if f, ok := cmd.ErrOrStderr().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					p.w = f
					opts = append(opts, client.WithProgress(p.update))
				}
				images, err := c.ImportImage(ctx, archive, name, opts...)
				p.done() // end the progress line before the result or the error
				if err != nil {
					return err
				}
				for _, img := range images {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.GetName(), img.GetDigest())
				}
				warnNodes(cmd.ErrOrStderr(), "import", nodes)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "image reference to store the image under, replacing the archive's (required for a root filesystem and when the archive names none)")
	cmd.Flags().BoolVar(&rootfs, "rootfs", false, "SOURCE is a root filesystem, whatever its entries look like")
	cmd.Flags().StringVar(&cmdLine, "cmd", "/bin/sh", "default command of an image made from a root filesystem, space separated")
	return cmd
}

// imageSource is what berth image import reads: an image archive, or a
// root filesystem to make one of.
type imageSource struct {
	label   string
	total   int64     // archive bytes, -1 when unknown
	archive io.Reader // an image archive (nil for a root filesystem)
	rootfs  func(rootfsimage.Options) (*rootfsimage.Image, error)
	close   func()
}

// openImageSource opens arg ("-", a file or a directory) and tells what it
// holds.
func openImageSource(arg string, forceRootFS bool) (*imageSource, error) {
	src := &imageSource{label: filepath.Base(arg), total: -1, close: func() {}}
	var r io.Reader
	if arg == "-" {
		if term.IsTerminal(int(os.Stdin.Fd())) {
			return nil, errors.New("refusing to read an image archive from a terminal; give SOURCE or pipe the archive in")
		}
		r, src.label = os.Stdin, "stdin"
	} else {
		fi, err := os.Stat(arg)
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			if !forceRootFS && rootfsimage.IsLayoutDir(arg) {
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(writeTree(pw, arg, "", func(string, string) {})) }()
				src.archive, src.close = pr, func() { pr.Close() }
				return src, nil
			}
			src.rootfs = func(o rootfsimage.Options) (*rootfsimage.Image, error) { return rootfsimage.FromDir(arg, o) }
			return src, nil
		}
		f, err := os.Open(arg)
		if err != nil {
			return nil, err
		}
		src.close = func() { f.Close() }
		if fi.Mode().IsRegular() {
			src.total = fi.Size()
		}
		r = f
	}
	br := bufio.NewReaderSize(r, 1<<20)
	kind := rootfsimage.KindRootFS
	if !forceRootFS {
		var err error
		if kind, err = rootfsimage.Sniff(br); err != nil {
			src.close()
			return nil, fmt.Errorf("%s: %w", arg, err)
		}
	}
	if kind == rootfsimage.KindImage {
		src.archive = br
		return src, nil
	}
	src.rootfs = func(o rootfsimage.Options) (*rootfsimage.Image, error) { return rootfsimage.FromTar(br, o) }
	return src, nil
}

// progress draws one status line with a bar on a terminal, at most ten
// times a second.
type progress struct {
	w     io.Writer
	verb  string // "importing", "pulling"
	label string
	total int64 // -1 when unknown
	// approx says total is an estimate: shown as "~", the percentage
	// kept below 100 until done.
	approx bool
	extra  string // appended, e.g. "2/3 blobs"

	mu    sync.Mutex
	start time.Time // of the first update: the rate's
	ended time.Time // when sent reached the total, for sentPhase
	last  time.Time
	sent  uint64
	drawn bool
	// sentPhase, when set, is the verb once sent reaches a known total:
	// berthd still works on what it has (an import's "unpacking"), and a
	// bar at 100% would look stuck.
	sentPhase string
	now       func() time.Time // time.Now; tests set it
}

func (p *progress) update(sent uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.now == nil {
		p.now = time.Now
	}
	if p.start.IsZero() {
		p.start = p.now()
	}
	p.sent = sent
	if p.sentPhase != "" && p.total > 0 && int64(sent) >= p.total {
		p.verb, p.sentPhase, p.ended = p.sentPhase, "", p.now()
	}
	if p.now().Sub(p.last) < 100*time.Millisecond && int64(sent) != p.total {
		return
	}
	p.last = p.now()
	p.draw()
}

// setTotal sets the total once it is known.
func (p *progress) setTotal(total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total = total
}

// pulled draws a PullImage progress message. Once every blob is
// downloaded the line says "unpacking" without a bar: berthd answers when
// the layers are unpacked too, which takes a while for a large image, and a
// bar at 100% would look stuck.
func (p *progress) pulled(m *berthv1.PullImageResponse) {
	done := 0
	for _, l := range m.GetLayers() {
		if l.GetDone() {
			done++
		}
	}
	blobs := fmt.Sprintf("%d/%d blobs", done, len(m.GetLayers()))
	if total := m.GetTotalBytes(); total > 0 && m.GetDownloadedBytes() >= total && done == len(m.GetLayers()) {
		p.mu.Lock()
		p.verb = "unpacking"
		p.mu.Unlock()
		p.updateTotal(m.GetDownloadedBytes(), -1, blobs+" downloaded")
		return
	}
	p.updateTotal(m.GetDownloadedBytes(), int64(m.GetTotalBytes()), blobs)
}

// updateTotal is update for a total that grows as it becomes known.
func (p *progress) updateTotal(sent uint64, total int64, extra string) {
	p.mu.Lock()
	p.total, p.extra = total, extra
	p.mu.Unlock()
	p.update(sent)
}

func (p *progress) draw() {
	text := progressText(p.sent, p.total)
	if p.approx && p.total > 0 {
		text = fmt.Sprintf("%s / ~%s (%d%%)", byteSize(p.sent), byteSize(uint64(p.total)), min(p.sent*100/uint64(p.total), 99))
	}
	line := fmt.Sprintf("\r\033[K%s %s %s%s", p.verb, p.label, progressBar(p.sent, p.total, 24), text)
	if p.extra != "" {
		line += ", " + p.extra
	}
	if p.now != nil {
		// The rate of the transfer, over its time only; then the time
		// since the start.
		now := p.now()
		d, moving := now.Sub(p.start), now.Sub(p.start)
		if !p.ended.IsZero() {
			moving = p.ended.Sub(p.start)
		}
		if moving >= 100*time.Millisecond && p.sent > 0 {
			line += fmt.Sprintf(", %s/s, %s", byteSize(uint64(float64(p.sent)/moving.Seconds())), d.Round(time.Second))
		}
	}
	fmt.Fprint(p.w, line)
	p.drawn = true
}

// progressBar renders "[=====>      ] " of width cells for sent of total, or
// "" when total is unknown (-1 or 0).
func progressBar(sent uint64, total int64, width int) string {
	if total <= 0 {
		return ""
	}
	done := min(int(sent*uint64(width)/uint64(total)), width)
	bar := strings.Repeat("=", done)
	if done < width {
		bar += ">" + strings.Repeat(" ", width-done-1)
	}
	return "[" + bar + "] "
}

// done redraws the last state and ends the line, if anything was drawn.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		p.draw()
		fmt.Fprintln(p.w)
	}
}

// progressText renders "3.0 MiB / 12.0 MiB (25%)", or "3.0 MiB" when total
// is unknown (-1).
func progressText(sent uint64, total int64) string {
	if total <= 0 {
		return byteSize(sent)
	}
	return fmt.Sprintf("%s / %s (%d%%)", byteSize(sent), byteSize(uint64(total)), sent*100/uint64(total))
}

// byteSize renders n bytes in binary units: "512 B", "1.5 KiB", "3.0 MiB".
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func newImagePullCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from its registry",
		Long: `Have berthd pull the image REF from its registry, store and unpack it, and
print its name and digest. A bare name means docker.io and ":latest", as for
docker pull; registries on localhost are spoken to over plain HTTP. Progress
is shown on stderr when it is a terminal. An unreachable registry fails
within berthd's --pull-resolve-timeout. The pull is not bounded by
--rpc-timeout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var nodes []*berthv1.ImageNodeResult
				opts := []client.PullOption{client.WithPullNodes(func(r []*berthv1.ImageNodeResult) { nodes = r })}
				p := &progress{verb: "pulling", label: args[0], total: -1}
				if f, ok := cmd.ErrOrStderr().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					p.w = f
					opts = append(opts, client.WithPullProgress(p.pulled))
				}
				img, err := c.PullImage(ctx, args[0], opts...)
				p.done() // end the progress line before the result or the error
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.GetName(), img.GetDigest())
				warnNodes(cmd.ErrOrStderr(), "pull", nodes)
				return nil
			})
		},
	}
}

// warnNodes writes a line to w for each node of a fleet that did not get
// the image of an import or pull (verb): placement skips it for the
// image's sandboxes.
func warnNodes(w io.Writer, verb string, nodes []*berthv1.ImageNodeResult) {
	for _, n := range nodes {
		if !n.GetOk() {
			fmt.Fprintf(w, "berth: image %s: node %s does not hold the image: %s %s: %s\n", verb, n.GetNodeId(), n.GetErrorCode(), n.GetErrorReason(), terminalSafe(n.GetErrorMessage()))
		}
	}
}

func newImageRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"delete"},
		Short:   "Delete images",
		Long:    "Delete each image from berthd's store and print its name. Sandboxes created from it keep running.",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return deleteEach(cmd, g, "image ", args, (*client.Client).DeleteImage)
		},
	}
}

func newImageListCmd(g *globals) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, c *client.Client) error {
				images, err := c.ListImages(ctx)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSONList(cmd.OutOrStdout(), images)
				}
				return writeImageTable(cmd.OutOrStdout(), images, time.Now())
			})
		},
	}
	addOutputFlag(cmd, &output, "table")
	return cmd
}

func writeImageTable(w io.Writer, images []*berthv1.Image, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tCREATED")
	for _, img := range images {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", img.GetName(), shorten(img.GetDigest(), len("sha256:")+12), byteSize(img.GetContentSizeBytes()), ago(img.GetCreatedAt().AsTime(), now))
	}
	return tw.Flush()
}
