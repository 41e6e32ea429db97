package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// maxSessions bounds the sessions of a sandbox, ended ones included: each
// holds a shell process (counted against the sandbox's pids limit) and
// three descriptors of the agent.
const maxSessions = 64

// maxSessionName bounds a session's name, in bytes.
const maxSessionName = 256

// sessionScript is the loop the session's shell runs, with %[1]s the
// session's directory; it needs nothing but a POSIX shell (dash, busybox
// ash, bash). It reads one line per command from its stdin, a pipe only
// the agent writes: an assignment of the command to berth_cmd as one
// single-quoted word, newlines spelled "$berth_nl" (sessionLine). It
// evaluates the command in the shell itself, so that cd, export, variables
// and functions persist, with stdin /dev/null and stdout and stderr
// redirected to the FIFOs the agent made for that command alone; then it
// writes the command's status as a decimal line to its stdout, a pipe only
// the agent reads. No command's output can reach the status pipe: the
// shell's own stdout waits on a close-on-exec descriptor while the
// redirection lasts, and no marker is looked for in any output. `command
// eval` keeps a syntax error from ending the shell (the special built-in's
// property is suppressed, POSIX "command"). The INT trap is Ctrl-C (a
// timeout): the shell's children get SIGINT with the default action, and
// the shell returns from berth_run with 130, abandoning the rest of the
// command as an interactive shell abandons the line (dash and busybox ash
// also leave a built-in loop so; bash finishes the built-in it runs
// first); a SIGINT while the shell waits for a command only makes it read
// again.
const sessionScript = `berth_run() { berth_busy=1; command eval "$berth_cmd"; }
trap 'if [ -n "$berth_busy" ]; then berth_busy=; return 130; fi; berth_intr=1' INT
while :; do
IFS= read -r berth_line || { [ -n "$berth_intr" ] && { berth_intr=; continue; }; exit 0; }
berth_nl='
'
eval "$berth_line"
berth_run </dev/null >%[1]s/out 2>%[1]s/err
printf '%%d\n' "$?"
berth_busy=
done`

// sessionLine encodes command for sessionScript: one line assigning it to
// berth_cmd, each ' spelled '\” and each newline '"$berth_nl"'.
func sessionLine(command string) []byte {
	var b strings.Builder
	b.Grow(len(command) + 16)
	b.WriteString("berth_cmd='")
	for _, c := range []byte(command) {
		switch c {
		case '\'':
			b.WriteString(`'\''`)
		case '\n':
			b.WriteString(`'"$berth_nl"'`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteString("'\n")
	return []byte(b.String())
}

// session is a shell that runs one command after another and keeps its
// state between them (docs/sessions.md).
type session struct {
	id, name, owner, user string
	shell                 berthv1.Shell
	createdAt             time.Time
	pid                   int    // the shell's, and its process group's
	dir                   string // holds the FIFOs out and err, made anew for every command
	uid, gid              uint32

	cmds   *os.File        // the shell's stdin: one sessionLine per command
	status chan int32      // the statuses the shell wrote, one per command
	ended  chan struct{}   // closed once the shell exited and was reaped
	wg     *sync.WaitGroup // the Server's execWG, for the discards

	mu       sync.Mutex
	busy     *execution // the command running, or nil
	commands uint64
	exitCode *int32 // set once the shell ended
	deleted  bool
}

// info describes the session.
func (ss *session) info() *berthv1.SessionInfo {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	in := &berthv1.SessionInfo{SessionId: ss.id, Name: ss.name, Owner: ss.owner, Shell: ss.shell, Pid: int64(ss.pid),
		CreatedAt: timestamppb.New(ss.createdAt), Commands: ss.commands, User: ss.user, State: berthv1.SessionState_SESSION_STATE_IDLE}
	switch {
	case ss.exitCode != nil:
		in.State, in.ExitCode = berthv1.SessionState_SESSION_STATE_ENDED, proto.Int32(*ss.exitCode)
	case ss.busy != nil:
		in.State, in.CurrentExecId = berthv1.SessionState_SESSION_STATE_BUSY, ss.busy.id
	}
	return in
}

// validateSessionID checks a session id like an exec id.
func validateSessionID(field, id string) error {
	if err := validateExecID(id); err != nil {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%q must be 1 to 128 characters from [A-Za-z0-9._-]", id))
	}
	return nil
}

// createSession starts the shell of a new session. It fails with
// INVALID_ARGUMENT naming the field, ALREADY_EXISTS SESSION_EXISTS,
// FAILED_PRECONDITION CWD_INVALID, RESOURCE_EXHAUSTED past maxSessions or
// when the shell cannot be started.
func (s *Server) createSession(req *berthv1.CreateSessionRequest, owner string) (*berthv1.SessionInfo, error) {
	id := req.GetSessionId()
	if err := validateSessionID("session_id", id); err != nil {
		return nil, err
	}
	if len(req.GetName()) > maxSessionName {
		return nil, rpcstatus.InvalidArgument("name", fmt.Sprintf("is %d bytes; at most %d", len(req.GetName()), maxSessionName))
	}
	shell := req.GetShell()
	if shell == berthv1.Shell_SHELL_UNSPECIFIED {
		shell = berthv1.Shell_SHELL_SH
	}
	dir := filepath.Join(s.cfg.SessionDir, id)
	// The same checks and environment as an exec's (planStart).
	p, err := s.planStart(&berthv1.ProcessSpec{ShellCommand: fmt.Sprintf(sessionScript, dir), Shell: shell,
		Cwd: req.GetCwd(), Env: req.GetEnv(), User: req.GetUser()}, berthv1.DetachedOutput_DETACHED_OUTPUT_UNSPECIFIED, true)
	if err != nil {
		// The request's cwd, env and user are its own fields.
		return nil, rpcstatus.RenameField(err, "process.", "")
	}
	s.mu.Lock()
	switch {
	case !s.serving || s.closing:
		s.mu.Unlock()
		return nil, errUnavailable()
	case s.sessions[id] != nil:
		s.mu.Unlock()
		return nil, rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSessionExists, fmt.Sprintf("session %q exists", id), map[string]string{"session_id": id})
	case len(s.sessions) >= maxSessions:
		s.mu.Unlock()
		return nil, rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonSessionExists,
			fmt.Sprintf("the sandbox has %d sessions, the most it may have; delete one first", maxSessions), map[string]string{"session_id": id})
	}
	ss := &session{id: id, name: req.GetName(), owner: owner, user: req.GetUser(), shell: shell, createdAt: time.Now(),
		dir: dir, uid: p.uid, gid: p.gid, status: make(chan int32, 1), ended: make(chan struct{}), wg: &s.execWG}
	s.sessions[id] = ss // reserved while the shell starts
	s.mu.Unlock()
	if err := s.startShell(ss, p); err != nil {
		s.mu.Lock()
		delete(s.sessions, id)
		s.mu.Unlock()
		os.RemoveAll(dir)
		return nil, err
	}
	s.log.Info("session started", "session_id", id, "pid", ss.pid, "shell", shell.String())
	return ss.info(), nil
}

// startShell makes the session's directory and starts its shell, in a
// process group of its own, with a command pipe as stdin and a status pipe
// as stdout.
func (s *Server) startShell(ss *session, p *plan) error {
	internal := func(what string, err error) error {
		meta := map[string]string{"session_id": ss.id}
		if limit := rpcstatus.SandboxLimit(fmt.Sprintf("%s for session %s", what, ss.id), err, meta); limit != nil {
			return limit
		}
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, fmt.Sprintf("%s for session %s: %v", what, ss.id, err), meta)
	}
	// The parent is traversable but not listable by every user (a session
	// of another user than the agent's reaches its own directory through
	// it); each session's directory is its user's alone.
	if err := os.MkdirAll(s.cfg.SessionDir, 0o711); err != nil {
		return internal("make the sessions directory", err)
	}
	// In a world-writable place (/dev/shm) another user could have made
	// it first: it must be the agent's own directory.
	if fi, err := os.Lstat(s.cfg.SessionDir); err != nil {
		return internal("make the sessions directory", err)
	} else if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || st.Uid != uint32(os.Getuid()) {
		return internal("make the sessions directory", fmt.Errorf("%s is not a directory of the agent's user", s.cfg.SessionDir))
	}
	if err := os.Chmod(s.cfg.SessionDir, 0o711); err != nil { // past the umask
		return internal("make the sessions directory", err)
	}
	if err := os.Mkdir(ss.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return internal("make the session directory", err)
	}
	if err := chownIfOther(ss.dir, ss.uid, ss.gid); err != nil {
		return internal("give the session directory to its user", err)
	}
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		return internal("create pipe", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cmdR.Close()
		cmdW.Close()
		return internal("create pipe", err)
	}
	errW, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		cmdR.Close()
		cmdW.Close()
		statusR.Close()
		statusW.Close()
		return internal("open /dev/null", err)
	}
	path, err := p.prog, error(nil)
	if path == "" {
		path, err = lookPath(p.argv[0], envPath(p.env))
	}
	var pid int
	var exited <-chan exitStatus
	if err == nil {
		req := &launcher.Request{Path: path, Argv: p.argv, Env: p.env, Dir: p.dir, Stdio: [3]*os.File{cmdR, statusW, errW}}
		s.starting.Lock()
		before, known := s.oom.count()
		pid, exited, err = s.startAs(p.uid, p.gid, req, before, known)
		s.starting.Unlock()
	}
	cmdR.Close()
	statusW.Close()
	errW.Close()
	if err != nil {
		cmdW.Close()
		statusR.Close()
		var execErr *launcher.ExecError
		if errors.As(err, &execErr) || errors.Is(err, unix.ENOENT) {
			return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonInternal,
				fmt.Sprintf("session %s: the image has no %s to run (%v)", ss.id, p.argv[0], err), map[string]string{"session_id": ss.id})
		}
		return internal("start the shell", err)
	}
	s.mu.Lock() // others see the session once pid is set, under s.mu
	ss.pid, ss.cmds = pid, cmdW
	s.mu.Unlock()
	s.execWG.Add(2)
	go s.readStatuses(ss, statusR)
	go s.awaitShell(ss, exited)
	return nil
}

// chownIfOther gives path to uid:gid unless the agent is that user.
func chownIfOther(path string, uid, gid uint32) error {
	if uid == uint32(os.Getuid()) && gid == uint32(os.Getgid()) {
		return nil
	}
	return os.Chown(path, int(uid), int(gid))
}

// fchownIfOther is chownIfOther of an open file.
func fchownIfOther(f *os.File, uid, gid uint32) error {
	if uid == uint32(os.Getuid()) && gid == uint32(os.Getgid()) {
		return nil
	}
	return f.Chown(int(uid), int(gid))
}

// readStatuses hands each status line of the shell to ss.status until the
// shell closes its stdout (it exited).
func (s *Server) readStatuses(ss *session, statusR *os.File) {
	defer s.execWG.Done()
	defer statusR.Close()
	sc := bufio.NewScanner(statusR)
	for sc.Scan() {
		code, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 32)
		if err != nil {
			s.log.Error("session status unreadable", "session_id", ss.id, "line", sc.Text())
			continue
		}
		select {
		case ss.status <- int32(code):
		case <-ss.ended:
			return
		}
	}
}

// awaitShell records the shell's exit and releases what the session holds.
func (s *Server) awaitShell(ss *session, exited <-chan exitStatus) {
	defer s.execWG.Done()
	var st exitStatus
	select {
	case st = <-exited:
	case <-s.stopping:
		_ = unix.Kill(-ss.pid, unix.SIGKILL)
		st = <-exited
	}
	code := resultOf(st, ss.createdAt).GetExitCode()
	ss.mu.Lock()
	ss.exitCode = &code
	ss.mu.Unlock()
	close(ss.ended)
	ss.cmds.Close()
	s.log.Info("session ended", "session_id", ss.id, "pid", ss.pid, "exit_code", code)
}

// deleteSession ends a session's shell and its process group: SIGHUP, then
// SIGKILL after KillGrace, and forgets it.
func (s *Server) deleteSession(id string) error {
	ss := s.session(id)
	if ss == nil {
		return sessionNotFound(id)
	}
	ss.mu.Lock()
	ss.deleted = true
	ss.mu.Unlock()
	select {
	case <-ss.ended:
	default:
		_ = unix.Kill(-ss.pid, unix.SIGHUP)
		select {
		case <-ss.ended:
		case <-time.After(s.cfg.KillGrace):
			_ = unix.Kill(-ss.pid, unix.SIGKILL)
			<-ss.ended
		}
	}
	// A background job of the shell may have left its group; what still
	// holds a command's FIFO is cut off.
	_ = unix.Kill(-ss.pid, unix.SIGKILL)
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
	os.RemoveAll(ss.dir)
	s.log.Info("session deleted", "session_id", id)
	return nil
}

// session returns the session id once its shell started, else nil.
func (s *Server) session(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.sessions[id]; ss != nil && ss.pid != 0 {
		return ss
	}
	return nil
}

func sessionNotFound(id string) error {
	return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSessionNotFound, fmt.Sprintf("session %q not found", id), map[string]string{"session_id": id})
}

// listSessions returns the sessions ordered by creation time.
func (s *Server) listSessions() []*berthv1.SessionInfo {
	s.mu.Lock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		if ss.pid != 0 {
			all = append(all, ss)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b *session) int { return a.createdAt.Compare(b.createdAt) })
	out := make([]*berthv1.SessionInfo, len(all))
	for i, ss := range all {
		out[i] = ss.info()
	}
	return out
}

// checkSessionSpec refuses the ProcessSpec fields a session command cannot
// have: the session's shell decides them.
func checkSessionSpec(spec *berthv1.ProcessSpec) error {
	bad := func(field string) error {
		return rpcstatus.InvalidArgument("process."+field, "may not be set with process.session_id: the session's shell decides it (set it with a command, e.g. cd or export)")
	}
	switch {
	case len(spec.GetArgv()) > 0:
		return rpcstatus.InvalidArgument("process.argv", "may not be set with process.session_id; a session runs process.shell_command")
	case spec.GetShellCommand() == "":
		return rpcstatus.InvalidArgument("process.shell_command", "is empty; a session command is a shell command")
	case len(spec.GetEnv()) > 0:
		return bad("env")
	case spec.GetCwd() != "":
		return bad("cwd")
	case spec.GetUser() != "":
		return bad("user")
	case spec.GetShell() != berthv1.Shell_SHELL_UNSPECIFIED:
		return bad("shell")
	case spec.GetTty() != nil:
		return rpcstatus.InvalidArgument("process.tty", "may not be set with process.session_id: session commands run without a terminal")
	case spec.GetStdin():
		return rpcstatus.InvalidArgument("process.stdin", "may not be set with process.session_id: session commands read /dev/null")
	}
	return nil
}

// sessionFor returns the session of a command start, ready for a command:
// NOT_FOUND SESSION_NOT_FOUND, FAILED_PRECONDITION SESSION_ENDED or
// SESSION_BUSY otherwise. It marks the session busy with e.
func (s *Server) sessionFor(id string, e *execution) (*session, error) {
	ss := s.session(id)
	if ss == nil {
		return nil, sessionNotFound(id)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	meta := map[string]string{"session_id": id}
	switch {
	case ss.exitCode != nil || ss.deleted:
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSessionEnded, fmt.Sprintf("session %q ended: its shell exited", id), meta)
	case ss.busy != nil:
		meta["exec_id"] = ss.busy.id
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSessionBusy,
			fmt.Sprintf("session %q is running exec %q; one command runs at a time", id, ss.busy.id), meta)
	}
	ss.busy = e
	ss.commands++
	return ss, nil
}

// launchInSession sends e's command to its session's shell and leaves e
// running: its output comes from two FIFOs made for it alone, its end from
// the status the shell writes. With follow it also returns a reader from
// the first event.
func (s *Server) launchInSession(e *execution, p *plan, follow bool, sessionID, command string) (_ *reader, err error) {
	ss, err := s.sessionFor(sessionID, e)
	if err != nil {
		return nil, err
	}
	var opened []*os.File
	defer func() {
		if err != nil {
			for _, f := range opened {
				f.Close()
			}
			ss.mu.Lock()
			ss.busy = nil
			ss.mu.Unlock()
			e.log.Drop()
		}
	}()
	internal := func(what string, err error) error {
		meta := map[string]string{"exec_id": e.id, "session_id": ss.id}
		if limit := rpcstatus.SandboxLimit(fmt.Sprintf("%s for exec %s", what, e.id), err, meta); limit != nil {
			return limit
		}
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, fmt.Sprintf("%s for exec %s in session %s: %v", what, e.id, ss.id, err), meta)
	}
	// New FIFOs for every command: a background job of an earlier command
	// holds the earlier ones, so its output cannot reach this command's.
	// The agent holds a write end of each until the status comes, so that
	// the reads see no end of file before the shell opens them.
	var reads, writes [2]*os.File
	for i, name := range []string{"out", "err"} {
		path := filepath.Join(ss.dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, internal("remove the last FIFO", err)
		}
		if err := unix.Mkfifo(path, 0o600); err != nil {
			return nil, internal("make FIFO", err)
		}
		// The directory is the session user's, whose processes may swap
		// the name for a symlink between the mkfifo and here: the FIFO is
		// opened without following one, checked to be a FIFO, given to
		// the user through its descriptor and opened again through it,
		// never by name (a chown by name gave the user any file).
		if reads[i], err = os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0); err != nil {
			return nil, internal("open FIFO", err)
		}
		opened = append(opened, reads[i])
		if fi, err := reads[i].Stat(); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			return nil, internal("open FIFO", fmt.Errorf("%s is no longer the FIFO the agent made", path))
		}
		if err := fchownIfOther(reads[i], ss.uid, ss.gid); err != nil {
			return nil, internal("give the FIFO to the session's user", err)
		}
		if writes[i], err = os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", reads[i].Fd()), os.O_WRONLY|unix.O_NONBLOCK, 0); err != nil {
			return nil, internal("open FIFO", err)
		}
		opened = append(opened, writes[i])
	}
	var r *reader
	if follow {
		r, _ = e.log.Follow(0) // cannot fail at 0
	}
	stdout := newPump(e.log, berthv1.Stream_STREAM_STDOUT, p.stdoutLimit)
	stderr := newPump(e.log, berthv1.Stream_STREAM_STDERR, p.stderrLimit)
	stdout.f, stderr.f = reads[0], reads[1]
	for _, pm := range []*pump{stdout, stderr} {
		pm.close = func() { ss.discard(pm.f) }
	}
	e.oomBefore, e.oomKnown = s.oom.count()
	start := time.Now()
	if _, err := ss.cmds.Write(sessionLine(command)); err != nil {
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonSessionEnded,
			fmt.Sprintf("session %q ended: its shell takes no command (%v)", ss.id, err), map[string]string{"session_id": ss.id})
	}
	e.setStarted(ss.pid, p)
	s.execWG.Add(1)
	go s.superviseCommand(e, ss, start, p.timeout, []*pump{stdout, stderr}, writes)
	return r, nil
}

// discard reads and drops what background jobs of an ended command still
// write to f, so that they run on (a closed FIFO would kill them with
// SIGPIPE), until they all closed it or the session ended.
func (ss *session) discard(f *os.File) {
	_ = f.SetReadDeadline(time.Time{})
	ss.wg.Add(1)
	go func() {
		defer ss.wg.Done()
		defer f.Close()
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-ss.ended:
				_ = f.SetReadDeadline(time.Unix(1, 0))
			case <-done:
			}
		}()
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
		}
	}()
}

// superviseCommand owns a session command until its status comes: at its
// timeout it interrupts it like Ctrl-C (SIGINT to the shell's process
// group, whose background jobs ignore it and whose shell traps it), after
// KillGrace it kills the group's processes that do not ignore SIGINT but
// the shell, and after another KillGrace the whole group, ending the
// session. It then drains the output as supervise does and records the
// result; the command's CPU and memory are not measured (it has no process
// of its own).
func (s *Server) superviseCommand(e *execution, ss *session, start time.Time, timeout time.Duration, pumps []*pump, writes [2]*os.File) {
	defer s.execWG.Done()
	pumped := make(chan *pump, len(pumps))
	for _, p := range pumps {
		go p.run(pumped)
	}
	var deadlineC, killC <-chan time.Time
	if timeout > 0 {
		deadline := time.NewTimer(timeout)
		defer deadline.Stop()
		deadlineC = deadline.C
	}
	var (
		timedOut bool
		kills    int
		code     int32
		ended    bool
	)
wait:
	for {
		select {
		case code = <-ss.status:
			break wait
		case <-ss.ended:
			ended = true
			break wait
		case <-deadlineC:
			timedOut, deadlineC = true, nil
			s.logSignalErr(e, ignoreESRCH(unix.Kill(-ss.pid, unix.SIGINT)))
			killC = time.After(s.cfg.KillGrace)
		case <-killC:
			kills++
			e.killSent.Store(true)
			if kills == 1 {
				for _, pid := range foreground(ss.pid) {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
				killC = time.After(s.cfg.KillGrace)
			} else {
				// The shell itself runs the command (a built-in loop):
				// only its end ends the command.
				s.logSignalErr(e, ignoreESRCH(unix.Kill(-ss.pid, unix.SIGKILL)))
				killC = nil
			}
		}
	}
	if ended {
		<-ss.ended
		ss.mu.Lock()
		code = *ss.exitCode
		ss.mu.Unlock()
	}
	for _, w := range writes {
		w.Close()
	}
	s.drain(pumps, pumped)
	res := &berthv1.ExecResult{ExitCode: proto.Int32(code), Duration: durationpb.New(time.Since(start)), TimedOut: timedOut,
		UserCpu: durationpb.New(0), SystemCpu: durationpb.New(0)}
	if code > 128 && code < 128+65 {
		res.Signal = unix.SignalName(syscall.Signal(code - 128))
	}
	for _, p := range pumps {
		p.fill(res)
	}
	ss.mu.Lock()
	ss.busy = nil
	ss.mu.Unlock()
	e.finish(res)
	s.retire(e)
	s.log.Info("session command finished", "exec_id", e.id, "session_id", ss.id, "exit_code", code, "timed_out", timedOut)
}

func ignoreESRCH(err error) error {
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// foreground returns the processes of process group pgid other than its
// leader (the shell) that do not ignore SIGINT: a non-interactive shell
// starts its background jobs with SIGINT ignored (POSIX "Shell Execution
// Environment"), so these are what the command runs in the foreground
// (/proc/<pid>/stat pgrp, /proc/<pid>/status SigIgn; proc(5)).
func foreground(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == pgid {
			continue
		}
		f, err := procfs.Stat(uint32(pid))
		if err != nil || f[5] != strconv.Itoa(pgid) {
			continue
		}
		if !ignoresSIGINT(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ignoresSIGINT reads the SigIgn mask of /proc/<pid>/status.
func ignoresSIGINT(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(unix.SIGINT-1)) != 0
		}
	}
	return false
}

// CreateSession starts a shell session (see createSession).
func (s *Server) CreateSession(_ context.Context, req *agentv1.CreateSessionRequest) (*agentv1.CreateSessionResponse, error) {
	s.activity.touch()
	info, err := s.createSession(req.GetSession(), req.GetOwner())
	if err != nil {
		return nil, err
	}
	return &agentv1.CreateSessionResponse{Session: info}, nil
}

// ListSessions lists the sessions, ordered by creation time.
func (s *Server) ListSessions(context.Context, *agentv1.ListSessionsRequest) (*agentv1.ListSessionsResponse, error) {
	return &agentv1.ListSessionsResponse{Sessions: s.listSessions()}, nil
}

// DeleteSession ends a session (see deleteSession).
func (s *Server) DeleteSession(_ context.Context, req *agentv1.DeleteSessionRequest) (*agentv1.DeleteSessionResponse, error) {
	s.activity.touch()
	if err := s.deleteSession(req.GetSessionId()); err != nil {
		return nil, err
	}
	return &agentv1.DeleteSessionResponse{}, nil
}
