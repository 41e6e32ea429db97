package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func newCpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between a sandbox and the local machine",
		Long: `Copy a file or a directory tree into or out of a sandbox. One of SRC and DST
is SANDBOX:PATH (a relative PATH starts at /workspace); the other a local
path, or "-" for standard input or output.

  berth cp LOCAL SANDBOX:PATH   upload; parents are created
  berth cp SANDBOX:PATH LOCAL   download

As with cp(1), when the destination is an existing directory (or ends with
"/") the source goes inside it under its own name; otherwise the source is
copied to the destination path. Files travel as files (atomically replaced,
SHA-256 reported by berthd; a file that changes while it is read fails the
copy with FILE_CHANGED and leaves no local file). Directories travel as tar
streams: symlinks are kept as symlinks, files are owned by the sandbox's
workload user on upload and by you on download, and archive entries that
would escape the destination, or symlinks that would lead out of it, are
refused. "-" reads a file from standard
input, or writes a file (or a directory as a tar stream) to standard
output. Progress is shown on stderr when it is a terminal. Copies are not
bounded by --rpc-timeout.`,
		Example: `  berth cp ./src dev:/workspace/src
  berth cp dev:/workspace/out/report.pdf .
  tar c . | berth exec dev -- tar x -C /workspace   # the same, by hand
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
				if dstRemote {
					return upload(ctx, c, args[0], dst, strings.HasSuffix(args[1], "/"), cmd.InOrStdin(), cmd.ErrOrStderr())
				}
				return download(ctx, c, src, args[1], cmd.OutOrStdout(), cmd.ErrOrStderr())
			})
		},
	}
}

// upload copies the local path (or stdin for "-") to dst.
func upload(ctx context.Context, c *client.Client, local string, dst remote, intoDir bool, stdin io.Reader, stderr io.Writer) error {
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
	if !fi.IsDir() {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		p := newTransferProgress(stderr, filepath.Base(local), fi.Size())
		defer p.done()
		opts := append(p.option(), client.WithCreateParents(), client.WithMode(uint32(fi.Mode().Perm())), client.WithSize(uint64(fi.Size())))
		resp, err := c.WriteFile(ctx, dst.sandboxID, dst.path, f, opts...)
		if err != nil {
			return err
		}
		if resp.GetWrittenBytes() != uint64(fi.Size()) {
			return fmt.Errorf("cp %s: berthd stored %d bytes, the file has %d", local, resp.GetWrittenBytes(), fi.Size())
		}
		return nil
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, local, stderr)) }()
	defer pr.Close()
	p := newTransferProgress(stderr, filepath.Base(local), -1)
	defer p.done()
	_, err = c.Upload(ctx, dst.sandboxID, dst.path, pr, p.option()...)
	return err
}

// writeTar writes the tree under dir as a tar stream, names relative to
// dir. Symlinks are archived as symlinks; sockets and devices are skipped
// with a notice on stderr.
func writeTar(w io.Writer, dir string, stderr io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case !fi.Mode().IsRegular() && !fi.IsDir():
			fmt.Fprintf(stderr, "berth: cp: skipping %s: a %v cannot be copied\n", p, fi.Mode().Type())
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, io.LimitReader(f, fi.Size()))
		if err == nil && n < fi.Size() {
			err = fmt.Errorf("%s changed while it was read: %d of %d bytes", p, n, fi.Size())
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// download copies src to the local path (or stdout for "-").
func download(ctx context.Context, c *client.Client, src remote, local string, stdout, stderr io.Writer) error {
	info, err := c.Stat(ctx, src.sandboxID, src.path)
	if err != nil {
		return err
	}
	isDir := info.GetType() == berthv1.FileType_FILE_TYPE_DIRECTORY
	if local == "-" {
		quietPipe()
		if isDir {
			_, err = c.Download(ctx, src.sandboxID, src.path, stdout)
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
		return downloadDir(ctx, c, src, target, stderr)
	}
	return downloadFile(ctx, c, src, target, stderr)
}

// downloadFile reads src into a temporary file next to target and renames
// it into place only when the read was complete.
func downloadFile(ctx context.Context, c *client.Client, src remote, target string, stderr io.Writer) error {
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".berth-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	p := newTransferProgress(stderr, path.Base(src.path), -1)
	defer p.done()
	header, err := c.ReadFile(ctx, src.sandboxID, src.path, tmp, p.option()...)
	if err == nil {
		err = tmp.Chmod(os.FileMode(header.GetInfo().GetMode() & 0o777))
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cp %s: %w", src, err)
	}
	return os.Rename(tmp.Name(), target)
}

// downloadDir streams src as tar and extracts it into target, created when
// missing. Extraction goes through os.Root, which refuses any name or
// symlink that leads out of target.
func downloadDir(ctx context.Context, c *client.Client, src remote, target string, stderr io.Writer) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(target)
	if err != nil {
		return err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	extracted := make(chan error, 1)
	go func() {
		err := extractTar(root, pr)
		pr.CloseWithError(err) // a failed extraction stops the download
		extracted <- err
	}()
	p := newTransferProgress(stderr, path.Base(src.path), -1)
	_, err = c.Download(ctx, src.sandboxID, src.path, pw, p.option()...)
	p.done()
	pw.CloseWithError(err)
	if xerr := <-extracted; xerr != nil && err == nil {
		err = xerr
	}
	if err != nil {
		return fmt.Errorf("cp %s: %w", src, err)
	}
	return nil
}

// extractTar extracts a tar stream beneath root: directories, regular
// files, symlinks and hard links; names must be relative without "..".
func extractTar(root *os.Root, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			_, err = io.Copy(io.Discard, r) // let the download reach its summary
			return err
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if strings.HasPrefix(hdr.Name, "/") || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("archive entry %q leads out of the destination", hdr.Name)
		}
		mode := os.FileMode(hdr.Mode & 0o777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
			if err := root.Chmod(name, mode|0o200); err != nil { // keep it writable for its contents
				return err
			}
		case tar.TypeReg:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if why := symlinkLeadsOut(root, name, hdr.Linkname); why != "" {
				return fmt.Errorf("archive entry %q is a symlink to %q, which %s", hdr.Name, hdr.Linkname, why)
			}
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		case tar.TypeLink:
			_ = root.Remove(name)
			if err := root.Link(path.Clean(hdr.Linkname), name); err != nil {
				return err
			}
		}
	}
}

// symlinkLeadsOut says why the symlink name -> target, about to be made
// beneath root, would lead out of root, or returns "". os.Root keeps the
// extraction itself inside, but a link left pointing out would be followed
// by whatever the user runs next in the destination. As berth-agent does
// for uploads: the target must be relative, must stay inside resolved
// from the link's directory, and a ".." in it counts only when the link's
// directory and every name before the ".." are real directories, not
// symlinks (which would move where it leads).
func symlinkLeadsOut(root *os.Root, name, target string) string {
	if path.IsAbs(target) {
		return "is absolute"
	}
	dir := path.Dir(name)
	if j := path.Join(dir, target); j == ".." || strings.HasPrefix(j, "../") {
		return "leads out of the destination"
	}
	if !slices.Contains(strings.Split(target, "/"), "..") {
		return ""
	}
	realDir := func(p string) bool {
		fi, err := root.Lstat(p)
		return err == nil && fi.IsDir()
	}
	for p := dir; p != "."; p = path.Dir(p) {
		if !realDir(p) {
			return "climbs from a directory reached through a symlink"
		}
	}
	cur := dir
	parts := strings.Split(target, "/")
	for i, part := range parts {
		if !slices.Contains(parts[i:], "..") {
			break
		}
		switch part {
		case "", ".":
		case "..":
			cur = path.Dir(cur)
		default:
			cur = path.Join(cur, part)
			if !realDir(cur) {
				return "has \"..\" after a name that is not a directory"
			}
		}
	}
	return ""
}

// isReason reports whether err is a berthd error with reason.
func isReason(err error, reason string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Reason == reason
}
