package agent

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/agent/ring"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// chunkSize is the largest read from an output pipe, and so the largest
// ExecOutput data, in bytes.
const chunkSize = 32 << 10

// execution is one exec: its process group, its event log and, once it
// ended, its result. It outlives its process for Config.Retention.
type execution struct {
	id       string
	pgid     int // the process group, equal to the pid; 0 when nothing ran
	hasStdin bool
	// started is the ExecStarted event every stream begins with.
	started *agentv1.ExecResponse
	// log holds the output events; it is closed after exited is set.
	log *ring.Log[*outputEvent]

	// stdin is the write end of the process's stdin pipe, nil without
	// stdin. stdinMu makes each ExecStdin one write, in order; Close does
	// not take it, so closing unblocks a write stuck on a full pipe.
	stdin     *os.File
	stdinMu   sync.Mutex
	stdinOnce sync.Once

	mu         sync.Mutex
	finished   bool                  // the result is known; the pgid may be reused
	finishedAt time.Time             // when finished became true
	exited     *agentv1.ExecResponse // the ExecExited event, set when finished
}

// outputEvent is one ExecOutput wrapped as the ExecResponse streams send, in
// a single allocation. It is shared by every stream following the exec and
// is never modified after the ring stamps its sequence number.
type outputEvent struct {
	resp agentv1.ExecResponse
	wrap agentv1.ExecResponse_Output
	out  berthv1.ExecOutput
}

// stampOutput sets an event's sequence number; the ring calls it under its
// lock, before any reader can see the event.
func stampOutput(ev *outputEvent, seq uint64) { ev.out.Seq = seq }

func newExecution(id string, p *plan, ringBytes uint64) *execution {
	return &execution{
		id:       id,
		hasStdin: p.stdin,
		log:      ring.New(ringBytes, EventOverhead, stampOutput),
	}
}

// setStarted records the ExecStarted event for pid (0 when nothing ran).
func (e *execution) setStarted(pid int, p *plan) {
	e.pgid = pid
	e.started = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &berthv1.ExecStarted{
		ExecId:           e.id,
		Pid:              int64(pid),
		Timeout:          durationpb.New(p.timeout),
		StdoutLimitBytes: p.stdoutLimit,
		StderrLimitBytes: p.stderrLimit,
	}}}
}

// signal sends sig to the exec's process group (kill(2) with -pgid). After
// the exec finished it does nothing: the group id may belong to another
// process by then. A group that is already gone (ESRCH) is not an error.
func (e *execution) signal(sig syscall.Signal) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished || e.pgid == 0 {
		return nil
	}
	if err := unix.Kill(-e.pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill process group %d with %v: %w", e.pgid, sig, err)
	}
	return nil
}

// groupAlive reports whether any process, zombies included, is still in the
// exec's process group.
func (e *execution) groupAlive() bool {
	return e.pgid != 0 && unix.Kill(-e.pgid, 0) == nil
}

// awaitGroupGone polls until the process group is empty (its members were
// killed and reaped) or d has passed. It polls every 5ms: there is no
// notification for a group becoming empty.
func (e *execution) awaitGroupGone(d time.Duration) {
	deadline := time.Now().Add(d)
	for e.groupAlive() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// writeStdin writes data to the process's stdin pipe, blocking while the
// pipe is full. Errors after the process closed its end or the exec ended
// (EPIPE, closed file) are dropped: the bytes had no reader.
func (e *execution) writeStdin(data []byte) {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	_, _ = e.stdin.Write(data)
}

// closeStdin closes the stdin pipe, delivering EOF; it is idempotent and
// safe while a write is blocked (that write then fails).
func (e *execution) closeStdin() {
	if e.stdin != nil {
		e.stdinOnce.Do(func() { e.stdin.Close() })
	}
}

// finish records the result and ends the log; streams then send exited.
func (e *execution) finish(res *berthv1.ExecResult) {
	e.mu.Lock()
	e.finished = true
	e.finishedAt = time.Now()
	e.exited = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}}
	e.mu.Unlock()
	e.log.Close()
}

// exitedEvent returns the ExecExited event; call it after the log is done.
func (e *execution) exitedEvent() *agentv1.ExecResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.exited
}

// finishedBefore reports whether the exec finished before t.
func (e *execution) finishedBefore(t time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finished && e.finishedAt.Before(t)
}

// pump reads one output pipe of an exec into its log, keeping the first
// limit bytes and counting all of them.
type pump struct {
	log    *ring.Log[*outputEvent]
	f      *os.File // the pipe's read end, closed by run
	stream berthv1.Stream
	limit  uint64 // bytes kept at most
	kept   uint64 // bytes appended to the log
	total  uint64 // bytes read
}

// run reads until EOF or an error (a read deadline set by the exec's
// supervising goroutine ends it), closes the pipe and signals done.
func (p *pump) run(done chan<- struct{}) {
	buf := make([]byte, chunkSize)
	for {
		n, err := p.f.Read(buf)
		if n > 0 {
			p.write(buf[:n])
		}
		if err != nil {
			break
		}
	}
	p.f.Close()
	done <- struct{}{}
}

// write accounts for b and appends the part within the cap, copied, as one
// output event. Beyond the cap it only counts: no allocation.
func (p *pump) write(b []byte) {
	p.total += uint64(len(b))
	if p.kept >= p.limit {
		return
	}
	n := min(uint64(len(b)), p.limit-p.kept)
	p.kept += n
	ev := new(outputEvent)
	ev.out.Stream = p.stream
	ev.out.Data = append([]byte(nil), b[:n]...)
	ev.wrap.Output = &ev.out
	ev.resp.Event = &ev.wrap
	p.log.Append(ev, int(n))
}

// fill sets the byte counts and truncation flag of p's stream in res.
func (p *pump) fill(res *berthv1.ExecResult) {
	switch p.stream {
	case berthv1.Stream_STREAM_STDOUT:
		res.StdoutBytes, res.StdoutTruncated = p.total, p.total > p.limit
	case berthv1.Stream_STREAM_STDERR:
		res.StderrBytes, res.StderrTruncated = p.total, p.total > p.limit
	}
}

// supervise owns a started exec until it finishes: it enforces the timeout
// and the agent's stop (SIGTERM to the group, SIGKILL after KillGrace),
// waits for the reaper's exit status, drains the pipes for at most
// DrainGrace (a background child may hold them open forever), and records
// the result. It owns the two pump goroutines and waits for both.
func (s *Server) supervise(e *execution, exited <-chan exitStatus, start time.Time, timeout time.Duration, stdout, stderr *pump) {
	defer s.execWG.Done()
	pumped := make(chan struct{}, 2)
	go stdout.run(pumped)
	go stderr.run(pumped)

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var (
		killTimer          *time.Timer
		killC              <-chan time.Time
		timedOut, termSent bool
		killSent           bool
	)
	escalate := func() {
		if termSent {
			return
		}
		termSent = true
		s.logSignalErr(e, e.signal(unix.SIGTERM))
		killTimer = time.NewTimer(s.cfg.KillGrace)
		killC = killTimer.C
	}
	stopping := s.stopping
	var st exitStatus
wait:
	for {
		select {
		case st = <-exited:
			break wait
		case <-deadline.C:
			timedOut = true
			escalate()
		case <-stopping:
			stopping = nil
			escalate()
		case <-killC:
			s.logSignalErr(e, e.signal(unix.SIGKILL))
			killSent, killC = true, nil
		}
	}
	e.closeStdin()
	if termSent && !killSent {
		// The process exited after SIGTERM; what it left in its group (a
		// grandchild ignoring SIGTERM) still gets its grace, then SIGKILL.
		if e.groupAlive() {
			<-killC
			s.logSignalErr(e, e.signal(unix.SIGKILL))
			killSent = true
		} else {
			killTimer.Stop()
		}
	}
	if killSent {
		// Report the exec done only once its killed group is gone, so a
		// client that sees the result sees no survivor either.
		e.awaitGroupGone(s.cfg.DrainGrace)
	}

	drain := time.NewTimer(s.cfg.DrainGrace)
	defer drain.Stop()
	for n := 0; n < 2; {
		select {
		case <-pumped:
			n++
		case <-drain.C:
			// Completion is the process's exit, not pipe EOF: unblock the
			// reads; each pump closes its pipe.
			past := time.Unix(1, 0)
			_ = stdout.f.SetReadDeadline(past)
			_ = stderr.f.SetReadDeadline(past)
		}
	}

	res := resultOf(st, start)
	res.TimedOut = timedOut
	stdout.fill(res)
	stderr.fill(res)
	e.finish(res)
	s.log.Info("exec finished", "exec_id", e.id, "pid", e.pgid, "exit_code", res.ExitCode,
		"signal", res.Signal, "timed_out", timedOut, "duration", res.Duration.AsDuration())
}

func (s *Server) logSignalErr(e *execution, err error) {
	if err != nil {
		s.log.Error("signal exec", "exec_id", e.id, "err", err)
	}
}

// resultOf converts a wait4(2) status and rusage into an ExecResult: exit
// code 128+N and the signal's name when killed by signal N (bash(1) "EXIT
// STATUS"), CPU times, and max RSS converted from KiB to bytes
// (getrusage(2)).
func resultOf(st exitStatus, start time.Time) *berthv1.ExecResult {
	res := &berthv1.ExecResult{
		Duration:    durationpb.New(st.at.Sub(start)),
		UserCpu:     durationpb.New(time.Duration(st.ru.Utime.Nano())),
		SystemCpu:   durationpb.New(time.Duration(st.ru.Stime.Nano())),
		MaxRssBytes: uint64(max(st.ru.Maxrss, 0)) * 1024,
	}
	switch {
	case st.ws.Exited():
		res.ExitCode = int32(st.ws.ExitStatus())
	case st.ws.Signaled():
		sig := st.ws.Signal()
		res.ExitCode = 128 + int32(sig)
		res.Signal = unix.SignalName(sig)
		if res.Signal == "" {
			res.Signal = fmt.Sprintf("SIG%d", int(sig))
		}
	}
	return res
}
