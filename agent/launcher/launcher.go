// Package launcher starts berth-agent's workload processes from a small
// helper process, the launcher, instead of from the agent itself.
//
// The launcher is the native launcher (c/launcher.c, a static C program
// the agent binary carries and runs from a memfd, native_amd64.go), for
// the Launcher and the ReapingLauncher alike, or, where that cannot be
// run, the agent binary run again (/proc/self/exe); both get argv[0] Arg0, and this package's init
// turns such an agent process into a launcher before anything else in the
// binary starts. The native one has no Go runtime, whose monitor thread
// cost twice the launcher's own work a start, and starts each process with
// clone(CLONE_VM|CLONE_VFORK). It runs as the workload user,
// with the workload's soft RLIMIT_NOFILE, and forks every process the agent
// asks for, raising its OOM score to the highest (oom_score_adj 1000) for
// the fork and lowering it back to the agent's after. A child inherits both
// at fork, so it is born with them; the agent's own score stays at the
// lowest it may set at all times, the launcher's too but while it forks,
// and the agent keeps its descriptor limit raised to the hard one. The children are forked with
// CLONE_PARENT: their parent is the agent, which reaps them with wait4(2)
// as before. And because a child is forked from the launcher's small
// address space rather than the agent's, its ru_maxrss (which Linux
// carries over from the address space it exec'd from) is its own peak, or
// the launcher's few MiB, never the agent's.
//
// A kernel may ignore CLONE_PARENT: gVisor's (runsc 0.0~20221219) does, and
// the process is then the launcher's child, whose exit the agent would
// never see. The launcher checks every process it starts (waitid(2) with
// WNOWAIT) and, when it is its own, answers and exits: the process is
// re-parented to the agent (init of the sandbox, or its subreaper), and the
// next start runs a new launcher. Launcher.Left then says so, and the agent
// starts the next processes from a ReapingLauncher instead, which stays,
// reaps its children and reports their exits (reaping.go).
//
// The agent talks to the launcher over a unix socket pair: a request
// carries the process's stdin, stdout and stderr as SCM_RIGHTS descriptors
// with its path, argv, env, working directory and session mode; the answer
// is the new process's pid or the errno that stopped it.
package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The package imports only the standard library, and not net: its init must
// run before the rest of the agent binary's packages initialize, so that a
// launcher stays small (Go initializes a package after its dependencies).

// Arg0 is the argv[0] that makes the agent binary a launcher.
const Arg0 = "berth-agent-launcher"

// Comm is the launcher's command name (/proc/<pid>/comm, prctl(2)
// PR_SET_NAME): berthd counts the launcher's work as its agent's when it
// tells a busy agent from a hung one.
const Comm = "berth-launcher"

// OOMScoreAdj is the oom_score_adj (proc(5)) of every process the launcher
// starts: the highest, so that the kernel's OOM killer picks a workload
// process before the agent, and before the launcher, whenever it can.
const OOMScoreAdj = 1000

// Config configures a Launcher.
type Config struct {
	// Binary is the program to run as the launcher: the agent binary
	// (/proc/self/exe) or the native launcher. Default: the native
	// launcher (native_amd64.go), or the agent binary when it cannot be run.
	Binary string
	// Credential is the workload user the launcher, and every process it
	// starts, runs as; nil keeps the agent's.
	Credential *syscall.Credential
	// Nofile is the soft RLIMIT_NOFILE of the processes started, capped by
	// the hard limit; 0 keeps the launcher's.
	Nofile uint64
	// Stderr receives the launcher's own complaints; nil: discarded.
	Stderr *os.File
}

// Request is one process to start.
type Request struct {
	// Path is the program, resolved already; Argv its argument vector.
	Path string
	Argv []string
	// Env is its environment as KEY=value strings; Dir its working
	// directory.
	Env []string
	Dir string
	// Stdio are its descriptors 0, 1 and 2.
	Stdio [3]*os.File
	// Session makes it the leader of a new session with Stdio[0], a
	// terminal, as its controlling terminal (setsid(2), TIOCSCTTY);
	// otherwise it leads a new process group (setpgid(2)).
	Session bool
}

// Launcher is the agent's end of a running launcher process. Its methods
// are safe for concurrent use; requests are served one at a time.
type Launcher struct {
	cfg Config

	mu   sync.Mutex
	conn *os.File // the socket; nil until started, and after the launcher died
	proc *os.Process
	left bool // a launcher left after a start: the kernel ignored CLONE_PARENT
}

// New returns a Launcher for cfg; the process starts with the first Start.
func New(cfg Config) *Launcher {
	return &Launcher{cfg: cfg}
}

// ErrResources is wrapped by Start's error when the process could not be
// started for lack of resources: fork(2) failed with EAGAIN (the pids
// limit) or ENOMEM, or a descriptor could not be made (EMFILE, ENFILE).
// Nothing ran. The errno is in the chain too.
var ErrResources = errors.New("no resources to start a process")

// ExecError is Start's error when the process was forked but could not run
// its program: execve(2) failed with Errno (ENOENT, EACCES, ENOEXEC after
// the /bin/sh fallback, ...). Nothing of the program ran.
type ExecError struct{ Errno syscall.Errno }

func (e *ExecError) Error() string { return "execve: " + e.Errno.Error() }

// Unwrap returns the errno.
func (e *ExecError) Unwrap() error { return e.Errno }

// ErrNoAnswer is wrapped by Start's error when the launcher gave no answer:
// it died (ErrDied), or hung for requestTimeout and was killed. The next
// Start runs a new launcher. The process was most likely not started; a
// launcher killed between its fork and its answer leaves the process
// running, a child of the agent like any other orphan.
var ErrNoAnswer = errors.New("launcher gave no answer")

// ErrDied is wrapped, beside ErrNoAnswer, when the launcher died (the
// workload or the kernel's OOM killer killed it) or closed its socket
// before answering: the socket said EOF, EPIPE or ECONNRESET.
var ErrDied = errors.New("launcher died")

// Start starts req's process from the launcher and returns its pid. The
// process is a child of the agent (CLONE_PARENT): the caller reaps it. A
// launcher that is not running is started first. Errors: ErrResources
// (wrapped with the errno), an *ExecError, ErrNoAnswer (wrapped, naming
// the launcher and how it failed; ErrDied too when it died), or another
// error when the launcher cannot be run. Start does not ask again after
// ErrNoAnswer: the caller knows whether another launcher is worth starting
// (package agent does not start one in a sandbox whose OOM killer just
// struck).
func (l *Launcher) Start(req *Request) (int, error) {
	msg, err := encode(req)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		if err := l.startLocked(); err != nil {
			return 0, err
		}
	}
	pid, err := l.requestLocked(msg, req.Stdio)
	if errors.Is(err, ErrNoAnswer) {
		l.closeLocked()
	}
	return pid, err
}

// Left reports whether a launcher of l left after a start because the
// process was its own child: the kernel ignored CLONE_PARENT (gVisor), and
// a ReapingLauncher serves better.
func (l *Launcher) Left() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.left
}

// Close stops the launcher: it exits when its socket closes.
func (l *Launcher) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
}

// releaseLocked forgets a launcher that exits by itself: it is not
// killed, for its pid is reaped, and may be reused, as soon as it is gone.
func (l *Launcher) releaseLocked() {
	l.conn.Close()
	l.conn = nil
	_ = l.proc.Release()
	l.proc = nil
}

func (l *Launcher) closeLocked() {
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
	if l.proc != nil {
		// It exits on EOF; a hung one is killed. Its status is reaped by
		// whoever reaps the agent's children.
		_ = l.proc.Kill()
		_ = l.proc.Release()
		l.proc = nil
	}
}

// startLocked runs the launcher process: cfg's Binary, or the native
// launcher, or, when that cannot be made or run, the agent binary.
func (l *Launcher) startLocked() error {
	cfg := l.cfg
	if cfg.Binary == "" {
		path, err := nativeBinary()
		if err != nil {
			l.complain("the agent binary is the launcher: %v", err)
			path = agentBinary
		}
		cfg.Binary = path
	}
	conn, proc, err := run(cfg)
	if err != nil && cfg.Binary != l.cfg.Binary && cfg.Binary != agentBinary && !errors.Is(err, ErrResources) {
		l.complain("the agent binary is the launcher: the native one did not run: %v", err)
		cfg.Binary = agentBinary
		conn, proc, err = run(cfg)
	}
	if err != nil {
		return err
	}
	l.conn, l.proc = conn, proc
	return nil
}

// run runs a launcher process for cfg with one end of a socket pair as its
// descriptor 3 and extra after its arguments, and returns the other end.
func run(cfg Config, extra ...string) (*os.File, *os.Process, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, resourceErr("socketpair for the launcher", err)
	}
	// Ours is non-blocking, so that requests go through Go's poller and
	// honor a deadline.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("launcher socket: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "launcher")
	theirs := os.NewFile(uintptr(fds[1]), "launcher")
	defer theirs.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		ours.Close()
		return nil, nil, resourceErr("open "+os.DevNull+" for the launcher", err)
	}
	defer null.Close()
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = null
	}
	proc, err := os.StartProcess(cfg.Binary, append([]string{Arg0, strconv.FormatUint(cfg.Nofile, 10)}, extra...), &os.ProcAttr{
		Dir: "/",
		// One P is plenty to fork from; fewer threads count against the
		// sandbox's pids limit.
		Env:   []string{"GOMAXPROCS=1"},
		Files: []*os.File{null, null, stderr, theirs},
		Sys:   &syscall.SysProcAttr{Credential: cfg.Credential},
	})
	if err != nil {
		ours.Close()
		return nil, nil, resourceErr("start the launcher "+cfg.Binary, err)
	}
	return ours, proc, nil
}

// complain writes a line to l's Stderr, if any.
func (l *Launcher) complain(format string, args ...any) { complain(l.cfg, format, args...) }

// complain writes a line to cfg.Stderr, if any.
func complain(cfg Config, format string, args ...any) {
	if cfg.Stderr != nil {
		fmt.Fprintf(cfg.Stderr, "berth-agent launcher: "+format+"\n", args...)
	}
}

// agentBinary runs the agent binary again, as a Go launcher.
const agentBinary = "/proc/self/exe"

// requestTimeout bounds one request: a launcher that does not answer within
// it is replaced.
const requestTimeout = 30 * time.Second

// transportError means the launcher did not answer: it died, closed its
// socket or hung. It wraps ErrNoAnswer, ErrDied when it died, and the
// cause.
type transportError struct {
	pid int // the launcher's
	err error
}

// died reports whether the socket says that the launcher is gone.
func (e *transportError) died() bool {
	return errors.Is(e.err, io.EOF) || errors.Is(e.err, io.ErrUnexpectedEOF) || errors.Is(e.err, syscall.EPIPE) || errors.Is(e.err, syscall.ECONNRESET)
}

func (e *transportError) Error() string {
	if e.died() {
		return fmt.Sprintf("launcher pid %d died before answering (%v)", e.pid, e.err)
	}
	return fmt.Sprintf("launcher pid %d gave no usable answer: %v", e.pid, e.err)
}

func (e *transportError) Unwrap() []error {
	if e.died() {
		return []error{ErrNoAnswer, ErrDied, e.err}
	}
	return []error{ErrNoAnswer, e.err}
}

// transportErr returns a *transportError for the running launcher.
func (l *Launcher) transportErr(err error) error {
	return &transportError{pid: l.proc.Pid, err: err}
}

// answerSize is the size of the launcher's answer to a request: 4 bytes of
// pid, 4 bytes of errno, 1 byte of stage, and 1 byte that is 1 when the
// launcher exits after this answer (see isChild).
const answerSize = 10

// requestLocked sends one request with its descriptors and reads the
// answer (answerSize). A launcher that leaves after answering is let go:
// the next Start runs another.
func (l *Launcher) requestLocked(msg []byte, stdio [3]*os.File) (int, error) {
	if err := l.conn.SetDeadline(time.Now().Add(requestTimeout)); err != nil {
		return 0, l.transportErr(err)
	}
	if err := sendRequest(l.conn, msg, stdio); err != nil {
		return 0, l.transportErr(err)
	}
	var ans [answerSize]byte
	if _, err := io.ReadFull(l.conn, ans[:]); err != nil {
		return 0, l.transportErr(err)
	}
	if ans[9] == 1 {
		l.left = true
		defer l.releaseLocked() // after the answer is read: an error still names it
	}
	pid, err := parseAnswer(ans[:9])
	if errors.Is(err, errBadAnswer) {
		return 0, l.transportErr(err)
	}
	return pid, err
}

// sendRequest sends msg with stdio's descriptors on conn. The descriptors
// ride with the request, in one sendmsg(2) where the socket takes it all (a
// request is a few hundred bytes): the launcher's recvmsg of the length
// then finds the rest queued and does not sleep again (it was woken twice a
// start when the request followed its first byte apart, issue 23). What did
// not fit follows.
func sendRequest(conn *os.File, msg []byte, stdio [3]*os.File) error {
	rights := make([]int, len(stdio))
	for i, f := range stdio {
		rights[i] = int(f.Fd())
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var sent int
	var sendErr error
	if err := rc.Write(func(fd uintptr) bool {
		sent, sendErr = syscall.SendmsgN(int(fd), msg, syscall.UnixRights(rights...), nil, 0)
		return sendErr != syscall.EAGAIN
	}); err != nil {
		return err
	}
	if sendErr != nil {
		return sendErr
	}
	if sent < len(msg) {
		if _, err := conn.Write(msg[sent:]); err != nil {
			return err
		}
	}
	return nil
}

// errBadAnswer is wrapped by parseAnswer's error for an answer that makes
// no sense: the launcher is not to be trusted with another request.
var errBadAnswer = errors.New("bad answer")

// parseAnswer reads an answer's pid (4 bytes), errno (4) and stage (1):
// the pid, an *ExecError, the errno of a start that failed before its
// child ran (wrapped with ErrResources when it is one of lack), or
// errBadAnswer (a pid of 0 or 1 without an errno).
func parseAnswer(ans []byte) (int, error) {
	pid := int(int32(binary.LittleEndian.Uint32(ans[0:4])))
	errno := syscall.Errno(binary.LittleEndian.Uint32(ans[4:8]))
	switch {
	case errno == 0 && pid > 1:
		return pid, nil
	case errno == 0:
		return 0, fmt.Errorf("%w: answered pid %d", errBadAnswer, pid)
	case ans[8] == stageExec:
		return 0, &ExecError{Errno: errno}
	}
	return 0, resourceErr("launcher", errno)
}

// resourceErr wraps err with ErrResources when its errno says the sandbox
// ran out of processes, memory or descriptors.
func resourceErr(what string, err error) error {
	for _, e := range []syscall.Errno{syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE} {
		if errors.Is(err, e) {
			return fmt.Errorf("%s: %w (%w)", what, ErrResources, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Stages of a failure, in an answer.
const (
	stageFork = 0 // before the child ran: descriptors, fork(2)
	stageExec = 1 // in the child: execve(2) and what precedes it
)

// encode lays out req: a 4-byte length of the rest, then flags, and
// NUL-terminated strings: path, dir, the argv count, argv, env.
func encode(req *Request) ([]byte, error) {
	var b []byte
	b = append(b, 0, 0, 0, 0)
	flags := byte(0)
	if req.Session {
		flags = 1
	}
	b = append(b, flags)
	for _, s := range []string{req.Path, req.Dir, strconv.Itoa(len(req.Argv))} {
		b = append(append(b, s...), 0)
	}
	for _, list := range [][]string{req.Argv, req.Env} {
		for _, s := range list {
			b = append(append(b, s...), 0)
		}
	}
	if len(b)-4 > maxRequest {
		return nil, fmt.Errorf("launch request of %d bytes exceeds %d", len(b)-4, maxRequest)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
	return b, nil
}

// maxRequest bounds a request: argv and env together are limited by the
// kernel to far less (ARG_MAX).
const maxRequest = 64 << 20
