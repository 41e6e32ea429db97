package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/tartree"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newCpCmd(g *globals) *cobra.Command {
	var opts cpOptions
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between a sandbox and the local machine",
		Long: `Copy a file or a directory tree into or out of a sandbox. One of SRC and DST
is SANDBOX:PATH (a relative PATH starts at /workspace); the other a local
path, or "-" for standard input or output.

  berth cp LOCAL SANDBOX:PATH   upload; parents are created
  berth cp SANDBOX:PATH LOCAL   download

As with cp(1), when the destination is an existing directory (or ends with
"/") the source goes inside it under its own name; otherwise the source is
copied to the destination path. Files and directories travel as tar
streams and arrive whole or not at all (a failed copy leaves the
destination as it was; a file that changes while it is read fails the
copy with FILE_CHANGED; an upload is on the sandbox's disk when berth cp
returns): symlinks with their targets as they are, hard links, FIFOs,
sparse files with their holes (only their data travels), modes and
mtimes, a directory's own included. Files belong to the sandbox's
workload user on upload and to you on download; -a keeps the numeric
owners (and setuid and setgid bits; on download only when you may chown,
i.e. as root). No archive entry is ever written outside the destination,
nor through a symlink out of it.

What cannot be copied is named on stderr and left out, everything else is
copied, and berth then exits 1 unless --skip-special is given: unix sockets
(tar cannot carry them) and device nodes where they cannot be created
(sandbox processes never can: mknod needs CAP_MKNOD).

"-" reads a file from standard input, or writes a file (or a directory as
a POSIX pax tar stream) to standard output. Progress is shown on stderr
when it is a terminal. Copies are not bounded by --rpc-timeout.`,
		Example: `  berth cp ./src dev:/workspace/src
  berth cp dev:/workspace/out/report.pdf .
  berth cp -a ./rootfs dev:/srv/rootfs                # keep owners
  berth cp dev:/etc - | tar tv                        # a directory as tar
  tar c . | berth exec dev -- tar x -C /workspace     # the same, by hand
  berth cp dev:/var/log/app.log - | tail`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, srcRemote := parseRemote(args[0])
			dst, dstRemote := parseRemote(args[1])
			switch {
			case srcRemote && dstRemote:
				return errors.New("copy between two sandboxes is not supported: copy to a local path first")
			case !srcRemote && !dstRemote:
				return fmt.Errorf("neither %q nor %q is SANDBOX:PATH", args[0], args[1])
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				cp := &copier{c: c, opts: opts, stderr: cmd.ErrOrStderr()}
				var err error
				if dstRemote {
					err = cp.upload(ctx, args[0], dst, strings.HasSuffix(args[1], "/"), cmd.InOrStdin())
				} else {
					err = cp.download(ctx, src, args[1], cmd.OutOrStdout())
				}
				if err != nil {
					return err
				}
				return cp.exit()
			})
		},
	}
	cmd.Flags().BoolVarP(&opts.archive, "archive", "a", false, "keep numeric owners (and setuid/setgid bits), as docker cp -a")
	cmd.Flags().BoolVar(&opts.skipSpecial, "skip-special", false, "exit 0 when sockets or device nodes that cannot be created were skipped (each is still named on stderr)")
	return cmd
}

// cpOptions are berth cp's flags.
type cpOptions struct {
	archive     bool
	skipSpecial bool
}

// copier is one berth cp.
type copier struct {
	c       *client.Client
	opts    cpOptions
	stderr  io.Writer
	skipped int
}

// skip names an entry that was not copied on stderr.
func (cp *copier) skip(name, why string) {
	cp.skipped++
	fmt.Fprintf(cp.stderr, "berth: cp: skipped %s: %s\n", terminalSafe(tartree.Display(name)), why)
}

// exit is the copy's exit status once the data moved: 1 when entries were
// skipped without --skip-special (everything else was copied).
func (cp *copier) exit() error {
	if cp.skipped > 0 && !cp.opts.skipSpecial {
		entries := fmt.Sprintf("%d entries were", cp.skipped)
		if cp.skipped == 1 {
			entries = "1 entry was"
		}
		fmt.Fprintf(cp.stderr, "berth: cp: %s not copied, the rest was (--skip-special accepts that)\n", entries)
		return exitStatus(1)
	}
	return nil
}

// upload copies the local path (or stdin for "-") to dst.
func (cp *copier) upload(ctx context.Context, local string, dst remote, intoDir bool, stdin io.Reader) error {
	c := cp.c
	// Does the destination name a directory to copy into?
	if local != "-" {
		if intoDir {
			dst.path = path.Join(dst.path, filepath.Base(local))
		} else if info, err := c.Stat(ctx, dst.sandboxID, dst.path); err == nil && info.GetType() == berthv1.FileType_FILE_TYPE_DIRECTORY {
			dst.path = path.Join(dst.path, filepath.Base(filepath.Clean(local)))
		} else if err != nil && !isReason(err, client.ReasonFileNotFound) {
			return err
		}
	}
	if local == "-" {
		_, err := c.WriteFile(ctx, dst.sandboxID, dst.path, stdin, client.WithCreateParents())
		return err
	}
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	// A directory is extracted into dst, a file into dst's directory as
	// an archive of one entry named for dst.
	dir, name := dst.path, ""
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("cp %s: a %v cannot be copied as a file; copy its directory", local, fi.Mode().Type())
		}
		dir, name = path.Dir(dst.path), path.Base(dst.path)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTree(pw, local, name, cp.skip)) }()
	defer pr.Close()
	p := newTransferProgress(cp.stderr, filepath.Base(local), -1, true)
	if p != nil {
		// The archive's size is known once the tree is walked: the line
		// shows bytes and rate until then.
		go func() { p.setTotal(archiveEstimate(local)) }()
	}
	defer p.done()
	opts := p.option()
	if cp.opts.archive {
		opts = append(opts, client.WithKeepOwners())
	}
	resp, err := c.Upload(ctx, dst.sandboxID, dir, pr, opts...)
	if err != nil {
		return err
	}
	for _, name := range resp.GetSkipped() {
		cp.skip(string(name), "the sandbox cannot create device nodes (mknod needs CAP_MKNOD)")
	}
	if n := resp.GetSkippedCount(); n > uint64(len(resp.GetSkipped())) {
		cp.skipped += int(n) - len(resp.GetSkipped())
		fmt.Fprintf(cp.stderr, "berth: cp: %d more device nodes skipped\n", n-uint64(len(resp.GetSkipped())))
	}
	return nil
}

// writeTree writes local as a tar stream (internal/tartree): a directory
// with itself first as "./", so that its mode and mtime travel too, and
// then its contents, sockets passed to skip; a regular file as one entry
// named name, its holes as a sparse entry's.
func writeTree(w io.Writer, local, name string, skip func(name, why string)) error {
	tw := tartree.NewWriter(w)
	opts := tartree.WalkOptions{IncludeRoot: true, Name: name, Skip: func(e *tartree.Entry, why string) { skip(e.Path, why) }}
	err := tartree.Walk(local, opts, func(e *tartree.Entry) error {
		_, err := tw.Add(e)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// download copies src to the local path (or stdout for "-").
func (cp *copier) download(ctx context.Context, src remote, local string, stdout io.Writer) error {
	c := cp.c
	info, err := c.Stat(ctx, src.sandboxID, src.path)
	if err != nil {
		return err
	}
	isDir := info.GetType() == berthv1.FileType_FILE_TYPE_DIRECTORY
	if local == "-" {
		quietPipe()
		if isDir {
			var sum *berthv1.DownloadSummary
			sum, err = c.Download(ctx, src.sandboxID, src.path, stdout, client.WithRoot())
			for _, name := range sum.GetSkipped() {
				cp.skip(path.Join(src.path, string(name)), "a unix socket cannot be archived")
			}
		} else {
			_, err = c.ReadFile(ctx, src.sandboxID, src.path, stdout)
		}
		return pipeAware(err)
	}
	target := local
	if fi, err := os.Stat(local); err == nil && fi.IsDir() || strings.HasSuffix(local, "/") {
		target = filepath.Join(local, path.Base(src.path))
	}
	if isDir {
		return cp.extract(ctx, src, target, -1)
	}
	return cp.downloadFile(ctx, src, target, archiveSize(int64(info.GetSizeBytes())))
}

// downloadFile downloads src, a file, as an archive of one entry into a
// temporary directory next to target and renames the file into place
// only when the archive was complete: with its mode, mtime and holes (and
// owner with -a), as a directory's files.
func (cp *copier) downloadFile(ctx context.Context, src remote, target string, total int64) error {
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".berth-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // after the rename: empty
	if err := cp.extract(ctx, src, tmp, total); err != nil {
		return err
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	if len(entries) != 1 || !entries[0].Type().IsRegular() {
		return fmt.Errorf("cp %s: the archive of a file holds %d entries", src, len(entries))
	}
	return os.Rename(filepath.Join(tmp, entries[0].Name()), target)
}

// extract downloads src as tar and extracts it into target
// (internal/tartree: whole or not at all, nothing written outside target,
// modes, mtimes and holes kept, owners with -a); a directory's own mode
// and mtime come with it (client.WithRoot).
func (cp *copier) extract(ctx context.Context, src remote, target string, total int64) error {
	pr, pw := io.Pipe()
	opts := tartree.Options{Skip: func(name, why string) { cp.skip(filepath.Join(target, name), why) }}
	if cp.opts.archive {
		opts.Chown = chown
	}
	extracted := make(chan error, 1)
	go func() {
		_, err := tartree.Extract(target, pr, opts)
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // let the download reach its summary
		}
		pr.CloseWithError(err) // a failed extraction stops the download
		extracted <- err
	}()
	p := newTransferProgress(cp.stderr, path.Base(src.path), total, true)
	sum, err := cp.c.Download(ctx, src.sandboxID, src.path, pw, append(p.option(), client.WithRoot())...)
	p.done()
	pw.CloseWithError(err)
	if xerr := <-extracted; xerr != nil && err == nil {
		err = xerr
	}
	if err != nil {
		return fmt.Errorf("cp %s: %w", src, err)
	}
	for _, name := range sum.GetSkipped() {
		cp.skip(path.Join(src.path, string(name)), "a unix socket cannot be archived")
	}
	return nil
}

// chown gives a downloaded entry its owner (berth cp -a), and then its
// mode: chown(2) clears setuid and setgid bits.
func chown(fd, uid, gid int, mode uint32) error {
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil || mode == 0 {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// isReason reports whether err is a berthd error with reason.
func isReason(err error, reason string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Reason == reason
}

// archiveEstimate is about the size of the tar stream of local (a file or
// a tree): what its entries' sizes and headers take. Sparse files make it
// high (only their data travels); entries it cannot read are left out.
func archiveEstimate(local string) int64 {
	var total int64 = 1024 // the end-of-archive blocks
	_ = filepath.WalkDir(local, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		total += 512
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += (fi.Size() + 511) / 512 * 512
			}
		}
		return nil
	})
	return total
}

// archiveSize is the size of a tar stream of one file of size bytes: a
// header, the data in 512-byte blocks and the end-of-archive blocks.
func archiveSize(size int64) int64 {
	return 512 + (size+511)/512*512 + 1024
}
