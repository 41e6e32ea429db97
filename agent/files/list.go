package files

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ListDir lists a directory to max_depth levels. The tree is walked twice:
// first counting the entries, so that the entry cap is checked before
// anything is sent, then building and sending them in batches of at most
// 1000. Only a batch is held at a time: a listing of many long names must
// not grow the agent (PID 1 of a sandbox whose memory may be small) by its
// whole size. Subdirectories are opened relative to their parent's
// descriptor with O_NOFOLLOW, so a symlink is never descended into and
// links cannot loop the walk.
func (s *Service) ListDir(req *agentv1.ListDirRequest, stream agentv1.FileService_ListDirServer) error {
	path, err := cleanPath("path", req.GetPath())
	if err != nil {
		return err
	}
	depth := max(req.GetMaxDepth(), 1)
	return s.toStatus(s.asUser(func() error {
		l := &listing{max: s.cfg.MaxListEntries, root: path, counting: true}
		if err := l.walkRoot(depth); err != nil {
			return err
		}
		l = &listing{max: s.cfg.MaxListEntries, root: path, stream: stream}
		if err := l.walkRoot(depth); err != nil {
			return err
		}
		return l.flush(true)
	}))
}

// listing is one pass of a ListDir walk: counting, or sending.
type listing struct {
	max      int
	root     string
	counting bool // count only; build and send nothing
	n        int  // entries walked so far
	stream   agentv1.FileService_ListDirServer
	batch    *berthv1.ListDirResponse
	size     int  // encoded size of batch's entries, in bytes
	sent     bool // a batch was sent
}

// walkRoot opens the listed directory and walks it.
func (l *listing) walkRoot(maxDepth uint32) error {
	fd, err := unix.Open(l.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("open directory", l.root, err)
	}
	return l.walk(fd, l.root, 1, maxDepth)
}

// walk lists the directory open at fd (which it closes), named path, whose
// entries are at depth.
func (l *listing) walk(fd int, path string, depth, maxDepth uint32) error {
	names, err := tartree.ReadDirNames(fd)
	if err != nil {
		unix.Close(fd)
		return pathError("read directory", path, err)
	}
	// Byte order of names, as the API promises.
	defer unix.Close(fd)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			// Removed since it was read: not part of the listing.
			continue
		}
		if l.n >= l.max {
			// On the sending pass only when the tree grew since it was
			// counted.
			return &tooLargeError{path: l.root, what: fmt.Sprintf("a listing of more than %d entries", l.max), limit: uint64(l.max), reason: rpcstatus.ReasonListTooLarge, flag: "max-list-entries"}
		}
		l.n++
		child := filepath.Join(path, name)
		if !l.counting {
			var target string
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				target, _ = readlink(fd, name) // an unreadable target is reported empty
			}
			info := fileInfo(child, &st, target)
			info.Depth = depth
			if err := l.add(info); err != nil {
				return err
			}
		}
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
			if errors.As(err, &tooLarge) || !isListError(err) {
				return err
			}
		}
		l.addError(child, err)
	}
	return nil
}

// isListError reports whether err is a directory that could not be listed
// (an errno from opening or reading it), which the listing reports and
// goes on, rather than the stream failing.
func isListError(err error) bool {
	_, ok := errnoOf(err)
	return ok
}

// add appends info to the batch, sending the batch first when it is full:
// listBatch entries, or listBatchBytes (an entry's path can be 4 KiB, twice
// over with its display form: a thousand of them would pass gRPC's 4 MiB
// message limit). A full batch is sent only when the next entry comes, so
// that an error about a directory, found right after its entry was added,
// goes in the batch that holds the entry.
func (l *listing) add(info *berthv1.FileInfo) error {
	n := proto.Size(info)
	if l.batch != nil && (len(l.batch.Entries) >= listBatch || l.size+n > listBatchBytes) {
		if err := l.flush(false); err != nil {
			return err
		}
	}
	if l.batch == nil {
		l.batch = &berthv1.ListDirResponse{}
	}
	l.batch.Entries = append(l.batch.Entries, info)
	l.size += n
	return nil
}

// addError records that the directory child, the last entry added, could
// not be listed.
func (l *listing) addError(child string, err error) {
	if l.counting {
		return
	}
	errno, _ := errnoOf(err)
	_, reason := errnoCode(errno)
	l.batch.Errors = append(l.batch.Errors, &berthv1.ListDirError{
		Path: []byte(child), DisplayPath: display(child), Reason: reason,
		Message: fmt.Sprintf("list %s: %v", display(child), err),
	})
}

// flush sends the batch; last sends an empty one when nothing was sent at
// all, so that an empty directory still gets one response.
func (l *listing) flush(last bool) error {
	if l.batch == nil {
		if !last || l.sent {
			return nil
		}
		l.batch = &berthv1.ListDirResponse{}
	}
	if err := l.stream.Send(&agentv1.ListDirResponse{Batch: l.batch}); err != nil {
		return err
	}
	l.batch, l.size, l.sent = nil, 0, true
	return nil
}
