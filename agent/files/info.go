package files

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// fileType maps the S_IFMT bits of st_mode (inode(7)).
func fileType(mode uint32) berthv1.FileType {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return berthv1.FileType_FILE_TYPE_REGULAR
	case unix.S_IFDIR:
		return berthv1.FileType_FILE_TYPE_DIRECTORY
	case unix.S_IFLNK:
		return berthv1.FileType_FILE_TYPE_SYMLINK
	case unix.S_IFIFO:
		return berthv1.FileType_FILE_TYPE_FIFO
	case unix.S_IFSOCK:
		return berthv1.FileType_FILE_TYPE_SOCKET
	case unix.S_IFCHR:
		return berthv1.FileType_FILE_TYPE_CHAR_DEVICE
	case unix.S_IFBLK:
		return berthv1.FileType_FILE_TYPE_BLOCK_DEVICE
	}
	return berthv1.FileType_FILE_TYPE_UNSPECIFIED
}

// typeName names a file type for messages: "directory", "symlink", ...
func typeName(mode uint32) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(fileType(mode).String(), "FILE_TYPE_"), "_", " "))
}

// fileInfo describes the file at path from its stat data; target is a
// symlink's target (readlink(2)), empty otherwise.
func fileInfo(path string, st *unix.Stat_t, target string) *berthv1.FileInfo {
	name := filepath.Base(path)
	return &berthv1.FileInfo{
		Name:                 []byte(name),
		DisplayName:          display(name),
		Path:                 []byte(path),
		DisplayPath:          display(path),
		Type:                 fileType(st.Mode),
		Mode:                 st.Mode & 0o7777,
		SizeBytes:            uint64(st.Size),
		Uid:                  st.Uid,
		Gid:                  st.Gid,
		ModifiedAt:           &timestamppb.Timestamp{Seconds: st.Mtim.Sec, Nanos: int32(st.Mtim.Nsec)},
		SymlinkTarget:        []byte(target),
		DisplaySymlinkTarget: display(target),
		LinkCount:            uint64(st.Nlink),
	}
}

// lstatInfo is lstat(2) of path as a FileInfo, with a symlink's target.
func lstatInfo(path string) (*berthv1.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, pathError("lstat", path, err)
	}
	var target string
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		t, err := readlink(unix.AT_FDCWD, path)
		if err != nil {
			return nil, err
		}
		target = t
	}
	return fileInfo(path, &st, target), nil
}

// readlink reads the symlink name relative to dirfd (readlinkat(2)),
// whatever the length of its target.
func readlink(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", pathError("readlink", name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// cleanPath validates a raw absolute path from a request and returns it
// lexically cleaned (filepath.Clean: no "." or ".." components, no repeated
// or trailing slashes). field names the request field in errors.
func cleanPath(field string, raw []byte) (string, error) {
	p := string(raw)
	switch {
	case p == "":
		return "", invalid(field, "is empty")
	case p[0] != '/':
		return "", invalid(field, "must be an absolute path (starting with /), got "+quote(p))
	case strings.IndexByte(p, 0) >= 0:
		return "", invalid(field, "contains a NUL byte; Linux paths cannot")
	case len(p) > unix.PathMax:
		return "", invalid(field, "is longer than PATH_MAX (4096 bytes)")
	}
	if long := longComponent(p); long != "" {
		return "", invalid(field, fmt.Sprintf("has a component of %d bytes (%s...); Linux names are at most 255 bytes (NAME_MAX)", len(long), quote(long[:16])))
	}
	return filepath.Clean(p), nil
}

// agentOwn refuses path (of request field field) when it names the
// agent's own directory or anything in it (Config.AgentDir), directly or
// through symbolic links in its parent or, when follow, in its last
// component (calls that act on a link itself, Remove and Rename, do not
// follow it): removing the agent's socket would make the sandbox
// unreachable to the next berthd, and its secret is berthd's.
func (s *Service) agentOwn(field, path string, follow bool) error {
	if s.cfg.AgentDir == "" {
		return nil
	}
	in := func(p string) bool { return p == s.cfg.AgentDir || strings.HasPrefix(p, s.cfg.AgentDir+"/") }
	candidates := []string{path}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		candidates = append(candidates, filepath.Join(dir, filepath.Base(path)))
	}
	if full, err := filepath.EvalSymlinks(path); err == nil && follow {
		candidates = append(candidates, full)
	}
	for _, p := range candidates {
		// Removing or renaming a directory above it takes it along.
		if in(p) || (!follow && strings.HasPrefix(s.cfg.AgentDir, strings.TrimSuffix(p, "/")+"/")) {
			return rpcstatus.Error(codes.PermissionDenied, rpcstatus.ReasonPermissionDenied,
				fmt.Sprintf("%s: %s is in %s, the berth agent's own directory (its socket and berthd's secret): file calls do not touch it", field, quote(path), s.cfg.AgentDir),
				map[string]string{"path": path})
		}
	}
	return nil
}

// nameMax is NAME_MAX, the longest file name Linux file systems take, in
// bytes.
const nameMax = 255

// longComponent returns the first slash-separated component of p longer
// than NAME_MAX, or "".
func longComponent(p string) string {
	for part := range strings.SplitSeq(p, "/") {
		if len(part) > nameMax {
			return part
		}
	}
	return ""
}

// quote renders a path for a message.
func quote(p string) string {
	return "\"" + display(p) + "\""
}
