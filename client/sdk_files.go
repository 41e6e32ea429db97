package client

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Files reads and writes one sandbox's files (Sandbox.Files): the Python
// SDK's sb.files. Paths are the sandbox's; errors are *Error
// (codes.NotFound for a missing path, codes.PermissionDenied, ...).
type Files struct {
	c  *Client
	id string
}

// Read returns the whole file path.
func (f *Files) Read(ctx context.Context, path string) ([]byte, error) {
	var b bytes.Buffer
	_, err := f.c.ReadFile(ctx, f.id, path, &b)
	return b.Bytes(), err
}

// ReadTo streams the file path to w, for files of any size.
func (f *Files) ReadTo(ctx context.Context, path string, w io.Writer) error {
	_, err := f.c.ReadFile(ctx, f.id, path, w)
	return err
}

// Write writes data to the file path, replacing it (WithMode,
// WithCreateParents, WithAppend apply).
func (f *Files) Write(ctx context.Context, path string, data []byte, opts ...FileOption) (*berthv1.WriteFileResponse, error) {
	return f.c.WriteFile(ctx, f.id, path, bytes.NewReader(data), opts...)
}

// WriteFrom streams r to the file path, for files of any size.
func (f *Files) WriteFrom(ctx context.Context, path string, r io.Reader, opts ...FileOption) (*berthv1.WriteFileResponse, error) {
	return f.c.WriteFile(ctx, f.id, path, r, opts...)
}

// Stat describes path (a symlink itself, not its target).
func (f *Files) Stat(ctx context.Context, path string) (*berthv1.FileInfo, error) {
	return f.c.Stat(ctx, f.id, path)
}

// Exists reports whether path exists.
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.c.Stat(ctx, f.id, path)
	var e *Error
	if errors.As(err, &e) && e.Code == codes.NotFound && e.Reason != ReasonSandboxNotFound {
		return false, nil
	}
	return err == nil, err
}

// List returns the entries of directory path, depth levels deep (1: its
// own entries), in order; a subdirectory that could not be listed fails
// with an *Error of its reason naming it in Metadata["path"].
func (f *Files) List(ctx context.Context, path string, depth uint32) ([]*berthv1.FileInfo, error) {
	infos, errs, err := f.c.ListDir(ctx, f.id, path, max(depth, 1))
	if err == nil && len(errs) > 0 {
		le := errs[0]
		err = &Error{Code: codes.FailedPrecondition, Reason: le.GetReason(), Message: fmt.Sprintf("list %s: %s", le.GetDisplayPath(), le.GetMessage()),
			Metadata: map[string]string{"path": le.GetDisplayPath()}}
	}
	return infos, err
}

// Remove removes path (recursive: a directory with its contents).
func (f *Files) Remove(ctx context.Context, path string, recursive bool) error {
	return f.c.Remove(ctx, f.id, path, recursive)
}

// Rename renames from to to (overwrite: replacing an existing to).
func (f *Files) Rename(ctx context.Context, from, to string, overwrite bool) error {
	return f.c.Rename(ctx, f.id, from, to, overwrite)
}

// MakeDir creates the directory path (parents: and its parents, an
// existing directory being fine, as mkdir -p); mode 0755 unless WithMode.
func (f *Files) MakeDir(ctx context.Context, path string, parents bool, opts ...FileOption) (*berthv1.FileInfo, error) {
	return f.c.MakeDir(ctx, f.id, path, parents, opts...)
}

// UploadDir copies the local directory local into the directory remote
// of the sandbox (created when missing, replaced atomically by berthd's
// Upload) as a tar stream made with archive/tar: symlinks stay symlinks
// (targets verbatim), modes and modification times are kept, files belong
// to the sandbox's user. Sockets and device nodes are skipped.
func (f *Files) UploadDir(ctx context.Context, local, remote string) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, local)) }()
	_, err := f.c.Upload(ctx, f.id, remote, pr)
	pr.CloseWithError(io.ErrClosedPipe)
	return err
}

func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = filepath.ToSlash(rel), 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		file, err := os.Open(p)
		if err != nil {
			return err
		}
		defer file.Close()
		_, err = io.Copy(tw, file)
		return err
	})
	if err != nil {
		return fmt.Errorf("upload dir %s: %w", root, err)
	}
	return tw.Close()
}

// DownloadDir copies the directory remote of the sandbox into the local
// directory local (created when missing), reading berthd's tar stream
// with archive/tar inside an os.Root: entries that would land outside
// local (absolute names, "..", through a symlink) fail the download, as
// do device nodes; the sandbox is not trusted. Symlinks are made after
// everything else, modes kept without setuid/setgid, files owned by the
// caller.
func (f *Files) DownloadDir(ctx context.Context, remote, local string) error {
	if err := os.MkdirAll(local, 0o755); err != nil {
		return fmt.Errorf("download dir: %w", err)
	}
	root, err := os.OpenRoot(local)
	if err != nil {
		return fmt.Errorf("download dir: %w", err)
	}
	defer root.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := readTar(pr, root)
		pr.CloseWithError(io.ErrClosedPipe)
		done <- err
	}()
	_, err = f.c.Download(ctx, f.id, remote, pw)
	pw.CloseWithError(err)
	if terr := <-done; terr != nil && (err == nil || errors.Is(err, io.ErrClosedPipe)) {
		err = fmt.Errorf("download dir %s to %s: %w", remote, local, terr)
	}
	return err
}

func readTar(r io.Reader, root *os.Root) error {
	tr := tar.NewReader(r)
	type link struct{ name, target string }
	var links []link
	var dirs []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("entry %q: outside the directory", h.Name)
		}
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, h)
		case tar.TypeReg:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = root.Chmod(name, mode)
			}
			if err == nil {
				err = root.Chtimes(name, h.ModTime, h.ModTime)
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			links = append(links, link{name, h.Linkname})
		default:
			return fmt.Errorf("entry %q: type %q refused (device nodes, hard links and fifos are not extracted)", h.Name, h.Typeflag)
		}
	}
	for _, l := range links {
		if err := root.MkdirAll(path.Dir(l.name), 0o755); err != nil {
			return err
		}
		if err := root.Symlink(l.target, l.name); err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		name := path.Clean(strings.TrimPrefix(dirs[i].Name, "./"))
		if err := root.Chmod(name, fs.FileMode(dirs[i].Mode)&fs.ModePerm); err != nil {
			return err
		}
	}
	return nil
}
