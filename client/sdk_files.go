package client

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/tartree"
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
// of the sandbox (created when missing; berthd's Upload replaces it
// atomically) as a tar stream made by internal/tartree, as berth cp does:
// symlinks stay symlinks (targets verbatim), modes, modification times
// and holes are kept, the directory's own mode too; files belong to the
// sandbox's user. Sockets are passed over.
func (f *Files) UploadDir(ctx context.Context, local, remote string) error {
	pr, pw := io.Pipe()
	go func() {
		tw := tartree.NewWriter(pw)
		err := tartree.Walk(local, tartree.WalkOptions{IncludeRoot: true}, func(e *tartree.Entry) error {
			_, err := tw.Add(e)
			return err
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := f.c.Upload(ctx, f.id, remote, pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return fmt.Errorf("upload dir %s to %s: %w", local, remote, err)
	}
	return nil
}

// DownloadDir copies the directory remote of the sandbox into the local
// directory local (made with its parents when missing), extracting
// berthd's tar stream with internal/tartree as berth cp does: whole or
// not at all; entries that would land outside local (absolute names,
// "..", a write through a symlink) fail it, and so do device nodes, since
// the sandbox is not trusted. Symlinks stay symlinks, modes and
// modification times are kept without setuid/setgid, and the files belong
// to the caller.
func (f *Files) DownloadDir(ctx context.Context, remote, local string) error {
	pr, pw := io.Pipe()
	extracted := make(chan error, 1)
	go func() {
		err := extractDir(local, pr)
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // let the download reach its summary
		}
		pr.CloseWithError(err) // a failed extraction stops the download
		extracted <- err
	}()
	_, err := f.c.Download(ctx, f.id, remote, pw, WithRoot())
	pw.CloseWithError(err)
	if xerr := <-extracted; xerr != nil && (err == nil || errors.Is(err, xerr)) {
		err = xerr
	}
	if err != nil {
		return fmt.Errorf("download dir %s to %s: %w", remote, local, err)
	}
	return nil
}

// extractDir extracts the tar stream r into dir, refusing device nodes.
func extractDir(dir string, r io.Reader) error {
	_, err := tartree.Extract(dir, r, tartree.Options{Check: func(h *tar.Header) error {
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			return fmt.Errorf("entry %q: a device node from the sandbox is not extracted", h.Name)
		}
		return nil
	}})
	return err
}
