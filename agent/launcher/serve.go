package launcher

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// init turns the process into a launcher when argv[0] is Arg0, before the
// binary's other packages initialize (this package sorts, and so runs,
// before the gRPC and protobuf packages the agent also imports): the
// launcher stays small.
func init() {
	switch {
	case len(os.Args) == 2 && os.Args[0] == Arg0:
		os.Exit(serve(os.Args[1]))
	case len(os.Args) == 3 && os.Args[0] == Arg0 && os.Args[2] == reapArg:
		os.Exit(serveReaping(os.Args[1]))
	}
}

// socketFD is the launcher's end of the socket pair.
const socketFD = 3

// serve is the launcher: it sets its descriptor limit, which its children
// inherit, then starts one process per request until the agent closes the
// socket. It returns the exit code.
func serve(nofile string) int {
	score := prepare(nofile)
	for {
		req, fds, err := readRequest()
		if errors.Is(err, io.EOF) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "berth-agent launcher: %v\n", err)
			return 1
		}
		pid, errno, stage := spawn(req, fds, score, syscall.CLONE_PARENT)
		for _, fd := range fds {
			syscall.Close(fd)
		}
		// A kernel that ignored CLONE_PARENT made the process ours, and
		// only the agent reaps: the launcher leaves, so that the process is
		// re-parented to init, the agent (PID 1 of the sandbox).
		leaving := pid > 0 && isChild(pid)
		var ans [answerSize]byte
		binary.LittleEndian.PutUint32(ans[0:4], uint32(pid))
		binary.LittleEndian.PutUint32(ans[4:8], uint32(errno))
		ans[8] = stage
		if leaving {
			ans[9] = 1
		}
		if _, err := syscall.Write(socketFD, ans[:]); err != nil || leaving {
			return 0
		}
	}
}

// prepare makes the process a launcher: its socket not inherited, its
// name, its descriptor limit (which its children inherit), and its OOM
// score, which it returns.
func prepare(nofile string) oomScore {
	// The processes started must not inherit the socket.
	syscall.CloseOnExec(socketFD)
	setComm(Comm)
	score, err := newOOMScore()
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-agent launcher: %v\n", err)
	}
	if n, err := strconv.ParseUint(nofile, 10, 64); err == nil && n > 0 {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
			lim.Cur = min(n, lim.Max)
			// Setrlimit also stops ForkExec from restoring the limit the
			// process started with.
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				fmt.Fprintf(os.Stderr, "berth-agent launcher: RLIMIT_NOFILE %d: %v\n", n, err)
			}
		}
	}
	return score
}

// isChild reports whether pid is the launcher's own child, which it is
// only when the kernel ignored CLONE_PARENT: gVisor's (runsc 2022) does.
// It asks waitid(2) with WNOWAIT, which leaves a child's exit status for
// its reaper; for a process that is not its child the answer is ECHILD.
func isChild(pid int) bool {
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOHANG|syscall.WNOWAIT, 0, 0)
		if e != syscall.EINTR {
			return e != syscall.ECHILD
		}
	}
}

// pPID is waitid(2)'s P_PID idtype: wait for the process id given.
const pPID = 1

// readRequest reads one request and the descriptors that came with it. A
// request whose descriptors could not be received (the launcher is out of
// descriptors) comes back with fds nil.
func readRequest() (*Request, []int, error) {
	var head [4]byte
	oob := make([]byte, syscall.CmsgSpace(3*4))
	n, oobn, flags, _, err := syscall.Recvmsg(socketFD, head[:], oob, syscall.MSG_CMSG_CLOEXEC)
	for errors.Is(err, syscall.EINTR) {
		n, oobn, flags, _, err = syscall.Recvmsg(socketFD, head[:], oob, syscall.MSG_CMSG_CLOEXEC)
	}
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("receive a request: %w", err)
	case n == 0:
		return nil, nil, io.EOF
	}
	var fds []int
	if flags&syscall.MSG_CTRUNC == 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("parse descriptors: %w", err)
		}
		for _, m := range msgs {
			rights, err := syscall.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	if err := readFull(head[n:]); err != nil {
		return nil, nil, err
	}
	body := make([]byte, binary.LittleEndian.Uint32(head[:]))
	if err := readFull(body); err != nil {
		return nil, nil, err
	}
	req, err := decode(body)
	return req, fds, err
}

func readFull(b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Read(socketFD, b)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("receive a request: %w", err)
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

// decode parses what encode laid out (without the length).
func decode(b []byte) (*Request, error) {
	if len(b) < 1 {
		return nil, errors.New("empty request")
	}
	req := &Request{Session: b[0] == 1}
	fields := bytes.Split(b[1:], []byte{0})
	if len(fields) < 4 { // path, dir, argc, and the empty tail
		return nil, errors.New("short request")
	}
	req.Path, req.Dir = string(fields[0]), string(fields[1])
	argc, err := strconv.Atoi(string(fields[2]))
	rest := fields[3 : len(fields)-1] // the last NUL leaves an empty field
	if err != nil || argc < 1 || argc > len(rest) {
		return nil, fmt.Errorf("bad argv count %q", fields[2])
	}
	for i, f := range rest {
		if i < argc {
			req.Argv = append(req.Argv, string(f))
		} else {
			req.Env = append(req.Env, string(f))
		}
	}
	return req, nil
}

// oomScore is the launcher's oom_score_adj (proc(5)): the agent's, which
// it inherited, except around a fork, when it is OOMScoreAdj so that the
// child is born with it (the score is copied at fork). The launcher itself
// — a Go process of a few MiB, more than a program that has just started —
// is then never the OOM killer's pick when memory runs out as processes
// start (it was, at 1000: starts failed with "launcher: EOF").
//
// The file stays open: opening it twice for every start cost the launcher
// as much as its fork (issue 23).
type oomScore struct {
	f        *os.File // /proc/self/oom_score_adj; nil when it cannot be raised
	own, top []byte   // the agent's score and OOMScoreAdj, as written
}

// newOOMScore reads the launcher's score and checks that it can be raised
// to OOMScoreAdj and lowered back (a process may lower its own score down
// to the oom_score_adj_min it inherited without CAP_SYS_RESOURCE).
func newOOMScore() (oomScore, error) {
	f, err := os.OpenFile(oomScorePath, os.O_RDWR, 0)
	if err != nil {
		return oomScore{}, fmt.Errorf("processes keep the agent's OOM score: %w", err)
	}
	b, err := io.ReadAll(f)
	s := oomScore{f: f, own: bytes.TrimSpace(b), top: []byte(strconv.Itoa(OOMScoreAdj))}
	if err == nil {
		err = s.set(s.top)
	}
	if err != nil {
		f.Close()
		return oomScore{}, fmt.Errorf("processes keep the agent's OOM score: %w", err)
	}
	if err := s.set(s.own); err != nil {
		// Stuck at the highest: children still get it, the launcher too.
		f.Close()
		return oomScore{}, fmt.Errorf("the launcher keeps OOM score %d: %w", OOMScoreAdj, err)
	}
	return s, nil
}

// raise sets the score children are born with; lower restores the
// launcher's own.
func (s oomScore) raise() {
	if s.f != nil {
		_ = s.set(s.top)
	}
}

func (s oomScore) lower() {
	if s.f != nil {
		_ = s.set(s.own)
	}
}

// set writes v as the launcher's score, from the file's start.
func (s oomScore) set(v []byte) error {
	_, err := s.f.WriteAt(v, 0)
	return err
}

const oomScorePath = "/proc/self/oom_score_adj"

// spawn forks req's process with cloneflags (CLONE_PARENT: a child of the
// launcher's parent; 0: the launcher's own), born with score's
// OOMScoreAdj. A file the kernel cannot execute is run by /bin/sh,
// as execvp(3) does. It returns the pid, or the errno and whether it
// struck before or in the child.
func spawn(req *Request, fds []int, score oomScore, cloneflags uintptr) (int, syscall.Errno, byte) {
	if len(fds) != 3 {
		return 0, syscall.EMFILE, stageFork
	}
	score.raise()
	defer score.lower()
	sys := &syscall.SysProcAttr{Cloneflags: cloneflags}
	if req.Session {
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
	}
	attr := &syscall.ProcAttr{Dir: req.Dir, Env: req.Env, Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}, Sys: sys}
	pid, err := syscall.ForkExec(req.Path, req.Argv, attr)
	if errors.Is(err, syscall.ENOEXEC) {
		pid, err = syscall.ForkExec("/bin/sh", append([]string{"/bin/sh", req.Path}, req.Argv[1:]...), attr)
	}
	if err == nil {
		return pid, 0, 0
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = syscall.EINVAL
	}
	switch errno {
	case syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE:
		return 0, errno, stageFork
	}
	return 0, errno, stageExec
}

// setComm sets the calling thread's command name, which is the process's
// for its main thread (prctl(2) PR_SET_NAME; at most 15 bytes). Failure only
// costs the name.
func setComm(name string) {
	b := append([]byte(name), 0)
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0)
}
