package files

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ListDir lists a directory to max_depth levels. The whole listing is
// gathered first (so that the entry cap is checked before anything is
// sent), then sent in batches of at most 1000 entries. Subdirectories are
// opened relative to their parent's descriptor with O_NOFOLLOW, so a
// symlink is never descended into and links cannot loop the walk.
func (s *Service) ListDir(req *agentv1.ListDirRequest, stream agentv1.FileService_ListDirServer) error {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return err
	}
	depth := max(req.GetMaxDepth(), 1)
	var l *listing
	err = s.asUser(func() error {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError("open directory", path, err)
		}
		l = &listing{max: s.cfg.MaxListEntries, root: path}
		return l.walk(fd, path, 1, depth)
	})
	if err != nil {
		return s.toStatus(err)
	}
	return s.toStatus(l.send(stream))
}

// listing is a ListDir being gathered.
type listing struct {
	max     int
	root    string
	entries []*berthv1.FileInfo
	errors  map[int][]*berthv1.ListDirError // by the index of the entry they follow
}

// walk lists the directory open at fd (which it closes), named path, whose
// entries are at depth.
func (l *listing) walk(fd int, path string, depth, maxDepth uint32) error {
	names, err := readDirNames(fd)
	if err != nil {
		unix.Close(fd)
		return pathError("read directory", path, err)
	}
	// Byte order of names, as the API promises.
	sortBytes(names)
	defer unix.Close(fd)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			// Removed since it was read: not part of the listing.
			continue
		}
		if len(l.entries) >= l.max {
			return &tooLargeError{path: l.root, what: fmt.Sprintf("a listing of more than %d entries", l.max), limit: uint64(l.max), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
		}
		child := filepath.Join(path, name)
		var target string
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ = readlink(fd, name) // an unreadable target is reported empty
		}
		info := fileInfo(child, &st, target)
		info.Depth = depth
		l.entries = append(l.entries, info)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || depth >= maxDepth {
			continue
		}
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			err = l.walk(sub, child, depth+1, maxDepth)
			if err == nil {
				continue
			}
			var tooLarge *tooLargeError
			if errors.As(err, &tooLarge) {
				return err
			}
		}
		l.addError(child, err)
	}
	return nil
}

// addError records that the directory child, the last entry, could not be
// listed.
func (l *listing) addError(child string, err error) {
	errno, _ := errnoOf(err)
	_, reason := errnoCode(errno)
	if l.errors == nil {
		l.errors = make(map[int][]*berthv1.ListDirError)
	}
	i := len(l.entries) - 1
	l.errors[i] = append(l.errors[i], &berthv1.ListDirError{
		Path: []byte(child), DisplayPath: display(child), Reason: reason,
		Message: fmt.Sprintf("list %s: %v", display(child), err),
	})
}

// send sends the listing in batches; each error goes in the batch that
// holds the directory's entry.
func (l *listing) send(stream agentv1.FileService_ListDirServer) error {
	if len(l.entries) == 0 {
		return stream.Send(&agentv1.ListDirResponse{Batch: &berthv1.ListDirResponse{}})
	}
	for start := 0; start < len(l.entries); start += listBatch {
		end := min(start+listBatch, len(l.entries))
		batch := &berthv1.ListDirResponse{Entries: l.entries[start:end]}
		for i := start; i < end; i++ {
			batch.Errors = append(batch.Errors, l.errors[i]...)
		}
		if err := stream.Send(&agentv1.ListDirResponse{Batch: batch}); err != nil {
			return err
		}
	}
	return nil
}

// sortBytes sorts names in byte order (Go compares strings bytewise).
func sortBytes(names []string) { slices.Sort(names) }

// readDirNames returns the names in the directory open at fd, without "."
// and "..", from getdents64(2).
func readDirNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
