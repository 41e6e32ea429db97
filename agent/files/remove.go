package files

import (
	"context"
	"os"

	"golang.org/x/sys/unix"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// Remove removes a file, symlink or empty directory, or a tree when
// recursive. Trees are removed with os.RemoveAll, which works through
// directory descriptors (unlinkat(2)) and never follows symlinks.
func (s *Service) Remove(_ context.Context, req *agentv1.RemoveRequest) (*agentv1.RemoveResponse, error) {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, invalid("path", `"/" cannot be removed`)
	}
	if err := s.agentOwn("path", path, false); err != nil {
		return nil, err
	}
	err = s.asUser(func() error {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return pathError("lstat", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return pathError("unlink", path, unix.Unlink(path))
		}
		if req.GetRecursive() {
			return os.RemoveAll(path)
		}
		return pathError("rmdir", path, unix.Rmdir(path))
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &agentv1.RemoveResponse{}, nil
}
