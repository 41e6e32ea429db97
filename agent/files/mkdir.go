package files

import (
	"context"
	"errors"
	"path/filepath"

	"golang.org/x/sys/unix"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// defaultDirMode is the mode of directories created without one.
const defaultDirMode = 0o755

// MakeDir creates a directory, with its parents when asked.
func (s *Service) MakeDir(_ context.Context, req *agentv1.MakeDirRequest) (*agentv1.MakeDirResponse, error) {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return nil, err
	}
	if err := s.agentOwn("path", path, true); err != nil {
		return nil, err
	}
	mode := uint32(defaultDirMode)
	if req.Mode != nil {
		if mode = req.GetMode(); mode > 0o7777 {
			return nil, invalid("mode", "must be at most 07777 (permission bits, setuid, setgid, sticky)")
		}
	}
	resp := &agentv1.MakeDirResponse{}
	err = s.asUser(func() error {
		if req.GetParents() {
			if _, err := mkdirAll(path, mode); err != nil {
				return err
			}
		} else if err := mkdir(path, mode); err != nil {
			return err
		}
		info, err := lstatInfo(path)
		resp.Info = info
		return err
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return resp, nil
}

// mkdir creates the directory path with exactly mode (mkdir(2), then
// chmod(2), since mkdir applies the umask).
func mkdir(path string, mode uint32) error {
	if err := unix.Mkdir(path, mode); err != nil {
		return pathError("mkdir", path, err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, path, mode, 0); err != nil {
		return pathError("chmod", path, err)
	}
	return nil
}

// mkdirAll is mkdir -p: it creates path with mode and its missing parents
// with mode 0755, and returns the directories it created, parents first.
// It checks before creating anything: when an existing component is not a
// directory (a path through a regular file) it fails with ENOTDIR naming
// that component, or with EEXIST when path itself is not a directory, and
// creates nothing. When creating fails half-way, the directories it created
// are removed again.
func mkdirAll(path string, mode uint32) (created []string, err error) {
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		err := unix.Stat(p, &st)
		if err == nil {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if p == path {
					return nil, pathError("mkdir", p, unix.EEXIST)
				}
				return nil, pathError("mkdir", p, unix.ENOTDIR)
			}
			break
		}
		if errors.Is(err, unix.ENOTDIR) && p != "/" {
			// A component above is not a directory: find and name it.
			missing = nil
			continue
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return nil, pathError("stat", p, err)
		}
		missing = append(missing, p)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		p, m := missing[i], uint32(defaultDirMode)
		if i == 0 {
			m = mode
		}
		if err := mkdir(p, m); err != nil {
			var st unix.Stat_t
			if errors.Is(err, unix.EEXIST) && unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				// Made meanwhile by someone else (a concurrent write with
				// create_parents): there, as wanted, and not ours to undo.
				continue
			}
			removeDirs(created)
			return nil, err
		}
		created = append(created, p)
	}
	return created, nil
}

// removeDirs removes directories created by mkdirAll, deepest first, as
// far as they are still empty. It undoes a failed operation, so errors are
// ignored.
func removeDirs(created []string) {
	for i := len(created) - 1; i >= 0; i-- {
		_ = unix.Rmdir(created[i])
	}
}
