package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/textsafe"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Exit codes of a command that could not be run, as a shell reports them
// (bash(1) "EXIT STATUS"; POSIX "Command Search and Execution").
const (
	exitNotExecutable = 126
	exitNotFound      = 127
)

// launch starts the process of the new exec e for p and leaves e running,
// or finished with exit code 127 or 126 and a message on stderr (on the
// terminal for a tty exec) when the program cannot be found or executed, as
// a shell would. Errors mean nothing ran and the caller must forget e:
// RESOURCE_EXHAUSTED with the limit's reason when the process could not be
// forked or its pipes made (PIDS_LIMIT_REACHED for EAGAIN,
// MEMORY_LIMIT_REACHED, DESCRIPTOR_LIMIT_REACHED) or its launcher was
// OOM-killed (MEMORY_LIMIT_REACHED, see startProcess), INTERNAL otherwise
// (a launcher that died twice is named in the message). With
// follow it also returns a reader attached to the exec's output from
// before the process starts. The caller does not hold s.mu; starts take
// s.starting, one at a time, so that a burst of starts holds the
// descriptors of one start in flight, not of all.
func (s *Server) launch(e *execution, p *plan, follow bool) (_ *reader, err error) {
	s.starting.Lock()
	defer s.starting.Unlock()
	id := e.id
	var r *reader
	if follow {
		r, _ = e.log.Follow(0) // cannot fail at 0
	}
	defer func() {
		if err != nil {
			e.log.Drop()
		}
	}()
	stdout := newPump(e.log, berthv1.Stream_STREAM_STDOUT, p.stdoutLimit)
	stderr := newPump(e.log, berthv1.Stream_STREAM_STDERR, p.stderrLimit)
	pumps := []*pump{stdout, stderr}
	if p.tty {
		// One stream: the terminal's output.
		pumps, stderr = pumps[:1], stdout
	}

	path, err := p.prog, error(nil)
	if path == "" {
		path, err = lookPath(p.argv[0], envPath(p.env))
	}
	if err != nil {
		s.cannotRun(e, p, stderr, err)
		return r, nil
	}

	// The child gets the write ends of two pipes and the read end of a
	// third (or /dev/null), or a terminal's slave side for all three. The
	// agent reads the parent ends itself.
	var closeOnErr []*os.File
	defer func() {
		for _, f := range closeOnErr {
			f.Close()
		}
	}()
	internal := func(what string, err error) error {
		meta := map[string]string{"exec_id": id}
		if limit := rpcstatus.SandboxLimit(fmt.Sprintf("%s for exec %s", what, id), err, meta); limit != nil {
			return limit // out of descriptors, processes or memory: the sandbox's limits
		}
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, fmt.Sprintf("%s for exec %s: %v", what, id, err), meta)
	}
	pipe := func(childReads bool) (r, w *os.File, err error) {
		r, w, err = stdioPipe(childReads)
		if err != nil {
			return nil, nil, internal("create pipe", err)
		}
		closeOnErr = append(closeOnErr, r, w)
		return r, w, nil
	}
	req := &launcher.Request{Path: path, Argv: p.argv, Env: p.env, Dir: p.dir}
	var childEnds []*os.File // closed in the agent once the child holds them
	if p.tty {
		master, slave, err := openPTY(p.ttyRows, p.ttyCols)
		if err != nil {
			return nil, internal("open terminal", err)
		}
		closeOnErr = append(closeOnErr, master, slave)
		// The master stays open until the process is reaped (supervise
		// closes it): closing it hangs the terminal up, and a program
		// that closed its own terminal descriptors (GNU cat's
		// close_stdout) but has not exited yet would die of SIGHUP.
		stdout.f, stdout.close = master, func() {}
		e.tty = master
		if p.stdin {
			e.stdin = master
		}
		req.Stdio, childEnds = [3]*os.File{slave, slave, slave}, []*os.File{slave}
		// A new session with the terminal as its controlling terminal
		// (setsid(2), TIOCSCTTY): job control and ^C work, and the
		// session leader's process group is the exec's group.
		req.Session = true
	} else {
		var outW, errW *os.File
		if stdout.f, outW, err = pipe(false); err != nil {
			return nil, err
		}
		if stderr.f, errW, err = pipe(false); err != nil {
			return nil, err
		}
		inR := s.devNull
		if p.stdin {
			if inR, e.stdin, err = pipe(true); err != nil {
				return nil, err
			}
			childEnds = append(childEnds, inR)
		}
		// Its own process group (not a session), so that a signal or a
		// timeout reaches the grandchildren too.
		req.Stdio, childEnds = [3]*os.File{inR, outW, errW}, append(childEnds, outW, errW)
	}
	e.oomBefore, e.oomKnown = s.oom.count()
	start := time.Now()
	// The launcher forks the process as the agent's child, born with the
	// workload's OOM score and descriptor limit and as p's user (package
	// launcher).
	pid, exited, err := s.startAs(p.uid, p.gid, req, e.oomBefore, e.oomKnown)
	var execErr *launcher.ExecError
	switch {
	case errors.As(err, &execErr):
		// It failed in the child, at execve(2): nothing of it ran.
		s.cannotRun(e, p, stderr, execErr.Errno)
		return r, nil
	case errors.Is(err, errLauncherOOMKilled):
		return nil, rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonMemoryLimit,
			fmt.Sprintf("exec %s: the process could not be started: the sandbox is out of memory (%v)", id, err),
			map[string]string{"exec_id": id, "limit": "memory"})
	case err != nil:
		return nil, internal("start the process", err)
	}
	// The child holds its ends now; keep only the agent's.
	closeOnErr = nil
	for _, f := range childEnds {
		f.Close()
	}

	e.setStarted(pid, p)
	// No log line here: the exec's one line is written when it finishes
	// (supervise). Each line is a write the sandbox's shim wakes up to copy
	// into agent.log; two an exec cost the shims about 0.4 ms of CPU an
	// exec in the concurrent benchmark (issue 23). ListExecs shows what
	// runs.
	s.execWG.Add(1)
	go s.supervise(e, exited, start, p.timeout, pumps)
	return r, nil
}

// stdioPipe returns a pipe (r, w) for a process's stdout or stderr, or
// its stdin when childReads: the agent's end is non-blocking and in Go's
// poller, the child's a blocking descriptor outside it, which the launcher
// receives as it is. os.Pipe puts both ends in the poller non-blocking,
// and os.File.Fd made the child's end blocking again before it was sent:
// five system calls more a pipe (fcntl twice to set O_NONBLOCK, epoll_ctl
// to add, fcntl twice to clear it, epoll_ctl to remove at close; issue 23).
// Both ends are close-on-exec.
func stdioPipe(childReads bool) (r, w *os.File, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, nil, fmt.Errorf("pipe2: %w", err)
	}
	child := 1
	if childReads {
		child = 0
	}
	// A pipe end's only status flag is O_NONBLOCK (fcntl(2) F_SETFL leaves
	// the access mode alone): 0 makes the child's end blocking.
	if _, err := unix.FcntlInt(uintptr(fds[child]), unix.F_SETFL, 0); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("make the child's end of a pipe blocking: %w", err)
	}
	// os.NewFile takes a non-blocking descriptor into the poller and leaves
	// a blocking one out.
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// errLauncherOOMKilled is wrapped by startProcess's error when the
// launcher died while the sandbox's OOM killer struck.
var errLauncherOOMKilled = errors.New("the kernel's OOM killer killed the launcher starting it")

// startAs starts req as uid:gid from a launcher and returns its pid and
// the channel that receives its exit status; errors are startProcess's.
// The caller holds s.starting. The first start whose launcher left because
// the kernel ignored CLONE_PARENT (gVisor) makes every later start use a
// reaping launcher (startReaped).
func (s *Server) startAs(uid, gid uint32, req *launcher.Request, before uint64, known bool) (int, <-chan exitStatus, error) {
	if s.reaping {
		return s.startReaped(uid, gid, req, before, known)
	}
	l := s.launcherFor(uid, gid)
	pid, exited, err := s.sup.start(func() (int, error) { return s.startProcess(l.Start, req, before, known) })
	if err == nil && l.Left() {
		s.reaping = true
	}
	return pid, exited, err
}

// startProcess starts req with start. A launcher that gave no answer
// (launcher.ErrNoAnswer: the workload may kill it) is replaced and asked
// once more, unless it died (launcher.ErrDied, not hung) while the cgroup
// counted an OOM kill that no exec has taken (oomLedger): the launcher is
// then taken for its victim, and the error wraps errLauncherOOMKilled. No
// second launcher is started into a sandbox that has just run out of
// memory: in a 64 MiB sandbox it died too (issue 21), and starting it
// would have the OOM killer kill a workload process to make room for it.
// before and known are the cgroup's OOM kill count read just now (the
// exec's own; reading it again cost every start a file, issue 23).
func (s *Server) startProcess(start func(*launcher.Request) (int, error), req *launcher.Request, before uint64, known bool) (int, error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			before, known = s.oom.count()
		}
		pid, err := start(req)
		if !errors.Is(err, launcher.ErrNoAnswer) {
			return pid, err
		}
		if after, ok := s.oom.count(); errors.Is(err, launcher.ErrDied) && known && ok && after > before && s.ooms.claim(before, after) {
			return 0, fmt.Errorf("%w: %w", errLauncherOOMKilled, err)
		}
		if attempt > 0 {
			return 0, err
		}
	}
}

// cannotRun finishes e without a process: exit code 127 when the program
// does not exist (ENOENT), 126 otherwise, with a shell-like message on
// stderr ("berth-agent: <argv0>: command not found"), which is the stdout
// pump for a tty exec.
func (s *Server) cannotRun(e *execution, p *plan, stderr *pump, err error) {
	code := int32(exitNotExecutable)
	var msg string
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errno == unix.ENOENT && !strings.Contains(p.argv[0], "/"):
		code, msg = exitNotFound, "command not found"
	case errno == unix.ENOENT:
		code, msg = exitNotFound, "No such file or directory"
	case errno == unix.EACCES:
		msg = "Permission denied"
	case errno != 0:
		msg = errno.Error()
	default:
		msg = err.Error()
	}
	e.setStarted(0, p)
	e.stdin, e.tty = nil, nil // nothing reads it; stdin messages are dropped
	stderr.write([]byte(fmt.Sprintf("berth-agent: %s: %s\n", p.argv[0], msg)))
	res := &berthv1.ExecResult{ExitCode: proto.Int32(code), Duration: durationpb.New(0), UserCpu: durationpb.New(0), SystemCpu: durationpb.New(0)}
	stderr.fill(res)
	e.finish(res)
	s.retire(e)
	s.cfg.ExecLogger.Info("exec could not run", "exec_id", e.id, "program", textsafe.Cut(p.argv[0], maxLoggedProgram), "exit_code", code, "err", textsafe.Cut(msg, maxLoggedProgram))
}

// maxLoggedProgram bounds the program name the agent logs, in bytes: it is
// the caller's argv[0], of any length (the log handler escapes what is not
// printable).
const maxLoggedProgram = 256

// lookPath resolves file like execvp(3): a name with a slash is used as is
// (execve(2) decides), any other is searched in the absolute directories of
// path. It fails with ENOENT when no candidate exists and EACCES when the
// only candidates are not executable. Relative PATH entries are skipped:
// they would be resolved against the agent's directory, not the process's.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	err := error(unix.ENOENT)
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		// unix.Stat into a Stat_t here: os.Stat allocated a FileInfo for
		// each PATH entry tried, six for a program in /bin (issue 23).
		var st unix.Stat_t
		statErr := unix.Stat(p, &st)
		for statErr == unix.EINTR {
			statErr = unix.Stat(p, &st)
		}
		switch {
		case statErr != nil, st.Mode&unix.S_IFMT == unix.S_IFDIR:
		case st.Mode&0o111 != 0:
			return p, nil
		default:
			err = unix.EACCES
		}
	}
	return "", err
}

// maxUserLaunchers bounds the launchers kept for users other than the
// workload user (process.user): each is a process counted against the
// sandbox's pids limit.
const maxUserLaunchers = 4

// launcherFor returns the launcher whose processes run as uid:gid: the
// workload user's, or one started for another user at its first exec
// (process.user), since a launcher holds no capability to change its
// user. Past maxUserLaunchers one of the others is stopped first;
// processes it started live on (they are the agent's children). The
// caller holds s.starting, so no other launcher is in use meanwhile.
func (s *Server) launcherFor(uid, gid uint32) *launcher.Launcher {
	if uid == s.cfg.UID && gid == s.cfg.GID {
		return s.launcher
	}
	key := [2]uint32{uid, gid}
	if l := s.userLaunchers[key]; l != nil {
		return l
	}
	if len(s.userLaunchers) >= maxUserLaunchers {
		for k, l := range s.userLaunchers {
			l.Close()
			delete(s.userLaunchers, k)
			break
		}
	}
	l := launcher.New(launcher.Config{Credential: credential(uid, gid), Nofile: s.cfg.WorkloadNofile, Stderr: os.Stderr})
	s.userLaunchers[key] = l
	return l
}

// closeLaunchers stops every launcher.
func (s *Server) closeLaunchers() {
	s.starting.Lock()
	defer s.starting.Unlock()
	s.launcher.Close()
	for k, l := range s.userLaunchers {
		l.Close()
		delete(s.userLaunchers, k)
	}
	for k, l := range s.reapingLaunchers {
		l.Close()
		delete(s.reapingLaunchers, k)
	}
}

// credential returns the user uid:gid for a child, or nil when the agent
// runs as that user already (setting it would call setgroups(2), which
// needs CAP_SETGID).
func credential(uid, gid uint32) *syscall.Credential {
	if uid == uint32(os.Getuid()) && gid == uint32(os.Getgid()) {
		return nil
	}
	return &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
}
