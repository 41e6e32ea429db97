package launcher

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Exit is how a process a ReapingLauncher started ended: its pid, and the
// wait status and rusage of wait4(2) in the launcher.
type Exit struct {
	Pid    int
	Status syscall.WaitStatus
	Rusage syscall.Rusage
}

// ReapingLauncher is the agent's end of a launcher that stays: it starts
// each process as its own child (no CLONE_PARENT), reaps it, and sends its
// wait status and rusage over its socket, which the agent takes as if it
// had reaped the process itself. It serves kernels that ignore
// CLONE_PARENT (gVisor), where a Launcher must leave after every start and
// each start runs a launcher again: a Go start of hundreds of system
// calls, each a ptrace stop in gVisor. The process is the native
// launcher's reaping mode (c/launcher.c, one thread woken by its socket or
// a SIGCHLD signalfd), or, where that cannot be run, the agent binary's
// (serveReaping: the Go runtime, a reaper thread beside the serving one,
// each wake-up more system calls, which gVisor's ptrace platform makes
// ptrace stops, docs/performance.md).
//
// A reaping launcher that dies (the workload or the OOM killer killed it)
// leaves its running children to the agent: they are re-parented to it (it
// is the sandbox's init or subreaper) and it reaps them itself. The next
// Start runs a new launcher.
//
// Its methods are safe for concurrent use; requests are served one at a
// time.
type ReapingLauncher struct {
	cfg      Config
	exited   func(Exit)
	orphaned func(launcher int, pids []int)

	mu  sync.Mutex // held by a request; guards run
	run *reapingRun
}

// reapingRun is one launcher process of a ReapingLauncher and the
// goroutine that reads its socket (read).
type reapingRun struct {
	conn *os.File
	proc *os.Process
	// answers receives the answer to the request in flight (frame bytes
	// 1 to 9: pid, errno, stage).
	answers chan [9]byte
	// done is closed when read ends: err says why (EOF when the launcher
	// died or the socket was closed).
	done chan struct{}
	err  error

	// outstanding are the pids the launcher started and has not reported
	// exited (read's own).
	outstanding map[int]struct{}

	mu sync.Mutex
	// started is the request in flight's, called by read with the new pid
	// before it reads the next frame; nil when none waits.
	started func(pid int)
}

// NewReaping returns a ReapingLauncher for cfg whose processes' exits are
// handed to exited, one at a time, in the order the launcher reaped them,
// each after the started of its own Start. exited must not block. When a
// launcher process is gone (its socket ended) with processes it started
// whose exits it did not report, orphaned gets its pid and theirs: they are
// re-parented to the agent once it has exited, except one it reaped in the
// instant before it died, whose status is lost. The launcher process
// starts with the first Start.
func NewReaping(cfg Config, exited func(Exit), orphaned func(launcher int, pids []int)) *ReapingLauncher {
	return &ReapingLauncher{cfg: cfg, exited: exited, orphaned: orphaned}
}

// Start starts req's process from the launcher and returns its pid. The
// process is the launcher's child: its exit is handed to the exited
// function of NewReaping, or, when the launcher died first, reaped by the
// agent as its orphan. started is called with the pid before that exit can
// be handed over (it registers the pid with whoever waits for it), from
// another goroutine, before Start returns. Errors are Launcher.Start's.
func (l *ReapingLauncher) Start(req *Request, started func(pid int)) (int, error) {
	msg, err := encode(req)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run == nil {
		conn, proc, err := l.startProcess()
		if err != nil {
			return 0, err
		}
		l.run = &reapingRun{conn: conn, proc: proc, answers: make(chan [9]byte, 1), done: make(chan struct{}), outstanding: make(map[int]struct{})}
		go l.run.read(l.exited, l.orphaned)
	}
	r := l.run
	r.setStarted(started)
	pid, err := r.request(msg, req.Stdio)
	if err != nil {
		r.setStarted(nil)
		var transport *transportError
		if errors.As(err, &transport) {
			l.closeLocked()
		}
	}
	return pid, err
}

// startProcess runs a reaping launcher process: cfg's Binary, or the
// native launcher, or, when that cannot be made or run, the agent binary
// (as Launcher.startLocked).
func (l *ReapingLauncher) startProcess() (*os.File, *os.Process, error) {
	cfg := l.cfg
	if cfg.Binary == "" {
		path, err := nativeBinary()
		if err != nil {
			complain(cfg, "the agent binary is the reaping launcher: %v", err)
			path = agentBinary
		}
		cfg.Binary = path
	}
	conn, proc, err := run(cfg, reapArg)
	if err != nil && cfg.Binary != l.cfg.Binary && cfg.Binary != agentBinary && !errors.Is(err, ErrResources) {
		complain(cfg, "the agent binary is the reaping launcher: the native one did not run: %v", err)
		cfg.Binary = agentBinary
		conn, proc, err = run(cfg, reapArg)
	}
	return conn, proc, err
}

// request sends one request and waits for its answer, for the launcher's
// death or for requestTimeout.
func (r *reapingRun) request(msg []byte, stdio [3]*os.File) (int, error) {
	if err := sendRequest(r.conn, msg, stdio); err != nil {
		return 0, r.transportErr(err)
	}
	timer := time.NewTimer(requestTimeout)
	defer timer.Stop()
	var ans [9]byte
	select {
	case ans = <-r.answers:
	case <-r.done:
		select {
		case ans = <-r.answers: // answered, then died
		default:
			return 0, r.transportErr(r.err)
		}
	case <-timer.C:
		return 0, r.transportErr(os.ErrDeadlineExceeded)
	}
	pid, err := parseAnswer(ans[:])
	if errors.Is(err, errBadAnswer) {
		return 0, r.transportErr(err)
	}
	return pid, err
}

func (r *reapingRun) transportErr(err error) error {
	return &transportError{pid: r.proc.Pid, err: err}
}

func (r *reapingRun) setStarted(f func(pid int)) {
	r.mu.Lock()
	r.started = f
	r.mu.Unlock()
}

// read reads the launcher's frames until its socket ends: answers go to
// answers (after started has the pid), exits to exited; then the pids it
// started and did not report go to orphaned.
func (r *reapingRun) read(exited func(Exit), orphaned func(launcher int, pids []int)) {
	defer close(r.done)
	defer func() {
		if len(r.outstanding) > 0 {
			pids := make([]int, 0, len(r.outstanding))
			for pid := range r.outstanding {
				pids = append(pids, pid)
			}
			orphaned(r.proc.Pid, pids)
		}
	}()
	frame := make([]byte, frameSize)
	for {
		if _, err := io.ReadFull(r.conn, frame); err != nil {
			r.err = err
			return
		}
		pid := int(int32(binary.LittleEndian.Uint32(frame[1:5])))
		switch frame[0] {
		case frameAnswer:
			r.mu.Lock()
			started := r.started
			r.started = nil
			r.mu.Unlock()
			if started != nil && pid > 1 && binary.LittleEndian.Uint32(frame[5:9]) == 0 {
				r.outstanding[pid] = struct{}{}
				started(pid)
			}
			select {
			case r.answers <- [9]byte(frame[1:10]):
			default: // nobody asked: a launcher that misbehaves
			}
		case frameExit:
			x := Exit{Pid: pid, Status: syscall.WaitStatus(binary.LittleEndian.Uint32(frame[5:9]))}
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&x.Rusage)), unsafe.Sizeof(x.Rusage)), frame[10:])
			delete(r.outstanding, pid)
			exited(x)
		default:
			r.err = errors.New("unknown frame from the launcher")
			return
		}
	}
}

// Close stops the launcher: it exits when its socket closes. Processes it
// started live on, re-parented to the agent.
func (l *ReapingLauncher) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
}

func (l *ReapingLauncher) closeLocked() {
	if l.run == nil {
		return
	}
	// It exits on EOF; a hung one is killed. Its status is reaped by
	// whoever reaps the agent's children.
	l.run.conn.Close()
	_ = l.run.proc.Kill()
	_ = l.run.proc.Release()
	l.run = nil
}
