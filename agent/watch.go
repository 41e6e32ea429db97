package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Bounds of file watches (berth.v1.WatchFilesRequest).
const (
	defaultWatchEvents = 65536
	maxWatchEvents     = 1 << 20
	maxWatches         = 64
	maxWatchIncludes   = 64
	// watchRetention is how long a watch lives on after its last stream
	// ended, for a caller to resume it.
	watchRetention = 10 * time.Minute
)

// watchMask is what the agent asks inotify(7) for on every directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// fileWatch is one inotify instance over a directory tree and the bounded
// ring of its numbered events, which outlives the streams that read it.
type fileWatch struct {
	id, root  string
	recursive bool
	include   []string
	limit     int      // events kept at most
	file      *os.File // the inotify instance, read through the poller
	fd        int      // its descriptor, for inotify_add_watch (File.Fd would make it blocking)

	mu   sync.Mutex
	dirs map[int32]string // watch descriptor -> directory
	// seeded are the names of each directory that add reported as
	// created when it began watching it: inotify may report some of them
	// again (made between inotify_add_watch and the scan), and their
	// CREATE is then dropped, so that each creation is reported once.
	seeded  map[int32]map[string]bool
	events  []*agentv1.WatchFilesResponse
	first   uint64 // seq of events[0]; the next seq is first+len(events)
	wake    chan struct{}
	streams int
	idle    *time.Timer // forgets the watch watchRetention after its last stream
	closed  bool
}

// WatchFiles streams the events of a new or resumed watch (see
// berth.v1.SandboxService.WatchFiles).
func (s *Server) WatchFiles(in *agentv1.WatchFilesRequest, stream agentv1.AgentService_WatchFilesServer) error {
	s.activity.touch()
	req := in.GetWatch()
	w, err := s.watchFor(req)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.streams++
	if w.idle != nil {
		w.idle.Stop()
	}
	last := w.first + uint64(len(w.events)) - 1
	w.mu.Unlock()
	defer s.detach(w)
	since := req.GetSinceSeq()
	if since > last {
		return rpcstatus.InvalidArgument("since_seq", fmt.Sprintf("%d is beyond watch %q's last event %d", since, w.id, last))
	}
	if err := stream.Send(&agentv1.WatchFilesResponse{Event: &agentv1.WatchFilesResponse_Started{Started: &berthv1.FileWatchStarted{
		WatchId: w.id, Path: w.root, LastSeq: last}}}); err != nil {
		return err
	}
	ctx := stream.Context()
	next := since + 1
	for {
		w.mu.Lock()
		if next < w.first {
			lost := &berthv1.FileWatchOverflow{Reason: berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_RING, FirstSeq: next, LastSeq: w.first - 1}
			next = w.first
			w.mu.Unlock()
			if err := stream.Send(&agentv1.WatchFilesResponse{Event: &agentv1.WatchFilesResponse_Overflow{Overflow: lost}}); err != nil {
				return err
			}
			continue
		}
		batch := append([]*agentv1.WatchFilesResponse(nil), w.events[next-w.first:]...)
		wake, closed := w.wake, w.closed
		w.mu.Unlock()
		for _, ev := range batch {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		next += uint64(len(batch))
		if len(batch) > 0 {
			continue
		}
		if closed {
			return status.Error(codes.Unavailable, "berth-agent is shutting down; the watch ended")
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// watchFor returns the watch req resumes, or starts it.
func (s *Server) watchFor(req *berthv1.WatchFilesRequest) (*fileWatch, error) {
	id := req.GetWatchId()
	if err := validateSessionID("watch_id", id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	w := s.watches[id]
	s.mu.Unlock()
	if w != nil {
		return w, nil
	}
	root := req.GetPath()
	if root == "" {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonWatchNotFound,
			fmt.Sprintf("watch %q not found: it ended %v after its last stream, or never existed (a new watch needs a path)", id, watchRetention),
			map[string]string{"watch_id": id})
	}
	if !filepath.IsAbs(root) {
		return nil, rpcstatus.InvalidArgument("path", fmt.Sprintf("%q is not absolute", root))
	}
	root = filepath.Clean(root)
	if len(req.GetInclude()) > maxWatchIncludes {
		return nil, rpcstatus.InvalidArgument("include", fmt.Sprintf("has %d patterns; at most %d", len(req.GetInclude()), maxWatchIncludes))
	}
	for i, p := range req.GetInclude() {
		if _, err := path.Match(p, ""); err != nil {
			return nil, rpcstatus.InvalidArgument(fmt.Sprintf("include[%d]", i), fmt.Sprintf("%q is not a valid pattern: %v", p, err))
		}
	}
	limit := int(req.GetBufferEvents())
	switch {
	case limit == 0:
		limit = defaultWatchEvents
	case limit > maxWatchEvents:
		return nil, rpcstatus.InvalidArgument("buffer_events", fmt.Sprintf("%d is more than %d", limit, maxWatchEvents))
	}
	fi, err := os.Stat(root)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonFileNotFound, fmt.Sprintf("watch %s: no such directory", root), map[string]string{"path": root})
	case err != nil:
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonFileRefused, fmt.Sprintf("watch %s: %v", root, err), map[string]string{"path": root})
	case !fi.IsDir():
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNotADirectory, fmt.Sprintf("watch %s: not a directory", root), map[string]string{"path": root})
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		if limit := rpcstatus.SandboxLimit("inotify_init1 for watch "+id, err, map[string]string{"watch_id": id}); limit != nil {
			return nil, limit
		}
		return nil, rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonInternal, fmt.Sprintf("watch %s: inotify_init1: %v (fs.inotify.max_user_instances)", root, err), nil)
	}
	w = &fileWatch{id: id, root: root, recursive: req.GetRecursive(), include: req.GetInclude(), limit: limit,
		file: os.NewFile(uintptr(fd), "inotify"), fd: fd, dirs: make(map[int32]string), seeded: make(map[int32]map[string]bool), first: 1, wake: make(chan struct{})}
	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		w.file.Close()
		return nil, errUnavailable()
	case s.watches[id] != nil: // a concurrent start of the id
		s.mu.Unlock()
		w.file.Close()
		return s.watchFor(req)
	case len(s.watches) >= maxWatches:
		s.mu.Unlock()
		w.file.Close()
		return nil, rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonInternal, fmt.Sprintf("the sandbox has %d watches, the most it may have", maxWatches), nil)
	}
	s.watches[id] = w
	s.mu.Unlock()
	w.mu.Lock()
	w.add(root, false)
	w.mu.Unlock()
	s.execWG.Add(1)
	go s.readWatch(w)
	s.log.Info("watch started", "watch_id", id, "path", root, "recursive", w.recursive)
	return w, nil
}

// detach ends a stream of w; the last one arms the retention timer.
func (s *Server) detach(w *fileWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.streams--
	if w.streams == 0 && !w.closed {
		w.idle = time.AfterFunc(watchRetention, func() {
			w.mu.Lock()
			idle := w.streams == 0
			w.mu.Unlock()
			if idle {
				s.mu.Lock()
				delete(s.watches, w.id)
				s.mu.Unlock()
				w.file.Close()
			}
		})
	}
}

// add watches dir (and, for a recursive watch, the directories under it).
// With report, what it finds under dir is reported as created: it was
// made before the watch could see it. The caller holds w.mu.
func (w *fileWatch) add(dir string, report bool) {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			w.append(&agentv1.WatchFilesResponse{Event: &agentv1.WatchFilesResponse_Overflow{Overflow: &berthv1.FileWatchOverflow{
				Reason: berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_WATCHES, Path: dir}}})
		}
		return
	}
	w.dirs[int32(wd)] = dir
	if !w.recursive && !report {
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, ent := range entries {
		p := filepath.Join(dir, ent.Name())
		if report {
			if w.seeded[int32(wd)] == nil {
				w.seeded[int32(wd)] = make(map[string]bool)
			}
			w.seeded[int32(wd)][ent.Name()] = true
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_CREATE, p, "", ent.IsDir())
		}
		if ent.IsDir() && w.recursive {
			w.add(p, report)
		}
	}
}

// file1 appends a file event when its name passes the include filter.
// The caller holds w.mu.
func (w *fileWatch) file1(kind berthv1.FileEventKind, p, old string, dir bool) {
	if len(w.include) > 0 {
		ok := false
		for _, pat := range w.include {
			if m, _ := path.Match(pat, filepath.Base(p)); m {
				ok = true
				break
			}
		}
		if !ok {
			return
		}
	}
	// A proto string carries UTF-8 only: a name that is not is shown with
	// its other bytes as \xNN (tartree.Display, as files' display paths),
	// never an event that no stream can send.
	w.append(&agentv1.WatchFilesResponse{Event: &agentv1.WatchFilesResponse_File{File: &berthv1.FileEvent{Kind: kind, Path: tartree.Display(p), OldPath: tartree.Display(old), IsDir: dir}}})
}

// append numbers ev, adds it to the ring (shedding the oldest past the
// limit) and wakes the streams. The caller holds w.mu.
func (w *fileWatch) append(ev *agentv1.WatchFilesResponse) {
	seq := w.first + uint64(len(w.events))
	switch e := ev.Event.(type) {
	case *agentv1.WatchFilesResponse_File:
		e.File.Seq = seq
	case *agentv1.WatchFilesResponse_Overflow:
		e.Overflow.Seq = seq
	}
	w.events = append(w.events, ev)
	if len(w.events) > w.limit {
		shed := len(w.events) - w.limit
		clear(w.events[:shed])
		w.events = w.events[shed:]
		w.first += uint64(shed)
	}
	close(w.wake)
	w.wake = make(chan struct{})
}

// readWatch turns inotify events into the watch's events until its file
// is closed (retention, or the agent's stop).
func (s *Server) readWatch(w *fileWatch) {
	defer s.execWG.Done()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-s.stopping:
			w.file.Close()
		case <-done: // closed at the end of retention
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			w.mu.Lock()
			w.closed = true
			close(w.wake)
			w.wake = make(chan struct{})
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		w.parse(buf[:n])
		w.mu.Unlock()
	}
}

// moved is an IN_MOVED_FROM waiting for its IN_MOVED_TO.
type moved struct {
	cookie uint32
	path   string
	dir    bool
}

// parse turns one read of inotify events (inotify(7)) into file events.
// A rename within the tree is IN_MOVED_FROM followed by IN_MOVED_TO with
// the same cookie, which the kernel queues together; a lone MOVED_FROM is
// a move out (REMOVE), a lone MOVED_TO a move in (CREATE). The caller
// holds w.mu.
func (w *fileWatch) parse(b []byte) {
	var pending *moved
	flush := func() {
		if pending != nil {
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_REMOVE, pending.path, "", pending.dir)
			pending = nil
		}
	}
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			break
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		b = b[end:]
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			flush()
			w.append(&agentv1.WatchFilesResponse{Event: &agentv1.WatchFilesResponse_Overflow{Overflow: &berthv1.FileWatchOverflow{
				Reason: berthv1.FileWatchOverflowReason_FILE_WATCH_OVERFLOW_REASON_KERNEL}}})
			continue
		}
		dir, ok := w.dirs[ev.Wd]
		if ev.Mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, ev.Wd)
			delete(w.seeded, ev.Wd)
			continue
		}
		if !ok || name == "" {
			continue
		}
		if seeded := w.seeded[ev.Wd]; seeded[name] {
			// Reported by the scan already: this is its creation again,
			// or the name goes away and a later CREATE is a new one.
			delete(seeded, name)
			if ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
				continue
			}
		}
		p := filepath.Join(dir, name)
		isDir := ev.Mask&unix.IN_ISDIR != 0
		switch {
		case ev.Mask&unix.IN_MOVED_FROM != 0:
			flush()
			pending = &moved{cookie: ev.Cookie, path: p, dir: isDir}
		case ev.Mask&unix.IN_MOVED_TO != 0:
			if pending != nil && pending.cookie == ev.Cookie {
				w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_RENAME, p, pending.path, isDir)
				pending = nil
				if isDir && w.recursive {
					w.renameDirs(p)
				}
				continue
			}
			flush()
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_CREATE, p, "", isDir)
			if isDir && w.recursive {
				w.add(p, true)
			}
		case ev.Mask&unix.IN_CREATE != 0:
			flush()
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_CREATE, p, "", isDir)
			if isDir && w.recursive {
				w.add(p, true)
			}
		case ev.Mask&unix.IN_DELETE != 0:
			flush()
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_REMOVE, p, "", isDir)
		case ev.Mask&unix.IN_MODIFY != 0:
			flush()
			w.file1(berthv1.FileEventKind_FILE_EVENT_KIND_WRITE, p, "", isDir)
		}
	}
	flush()
}

// renameDirs re-adds a renamed directory so that its watch descriptors
// name its new path: inotify keeps watching the moved inodes, under
// their old names in w.dirs. Adding an inode watched already returns its
// descriptor, which add then maps to the new path.
func (w *fileWatch) renameDirs(to string) {
	_ = filepath.WalkDir(to, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if wd, err := unix.InotifyAddWatch(w.fd, p, watchMask); err == nil {
			w.dirs[int32(wd)] = p
		}
		return nil
	})
}
