package files

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// Rename renames a path (rename(2)); without overwrite an existing target
// is refused atomically (renameat2(2) RENAME_NOREPLACE).
func (s *Service) Rename(_ context.Context, req *agentv1.RenameRequest) (*agentv1.RenameResponse, error) {
	from, err := cleanPath("from_path", req.GetFromPath())
	if err != nil {
		return nil, err
	}
	to, err := cleanPath("to_path", req.GetToPath())
	if err != nil {
		return nil, err
	}
	if from == "/" || to == "/" {
		return nil, invalid("path", `"/" cannot be renamed or replaced`)
	}
	if err := s.agentOwn("from_path", from, false); err != nil {
		return nil, err
	}
	if err := s.agentOwn("to_path", to, false); err != nil {
		return nil, err
	}
	err = s.asUser(func() error {
		var err error
		if req.GetOverwrite() {
			err = unix.Rename(from, to)
		} else {
			err = unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
			if errors.Is(err, unix.EINVAL) {
				// A file system without RENAME_NOREPLACE: check, then
				// rename (racy, but only against the sandbox itself).
				var st unix.Stat_t
				if lerr := unix.Lstat(to, &st); lerr == nil {
					err = unix.EEXIST
				} else {
					err = unix.Rename(from, to)
				}
			}
		}
		if err == nil {
			return nil
		}
		// Name the path the error is about.
		switch {
		case errors.Is(err, unix.EINVAL):
			return invalid("to_path", fmt.Sprintf("%s is inside %s: a directory cannot be moved into itself", quote(to), quote(from)))
		case errors.Is(err, unix.EEXIST), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTEMPTY):
			return pathError("rename "+display(from)+" to", to, err)
		case errors.Is(err, unix.ENOENT):
			var st unix.Stat_t
			if unix.Lstat(from, &st) == nil {
				return pathError("rename "+display(from)+" to", to, err)
			}
		}
		return pathError("rename", from, err)
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &agentv1.RenameResponse{}, nil
}
