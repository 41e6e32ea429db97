package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/agent/ring"
	"github.com/berth-sandbox/berth/internal/textsafe"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// chunkSize is the most output one event carries, in bytes: a pump reads
// what its pipe holds, up to this or its log's MaxEventBytes when that is
// smaller, into one event. Big events keep the per-message cost of the
// stream low when a process writes fast; a lone byte still goes out at
// once, since a read returns what is there.
const chunkSize = 256 << 10

// chunks holds the pumps' read buffers, so that an idle pump (most of them)
// holds none.
var chunks = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// execution is one exec: its process group, its event log and, once it
// ended, its result. It outlives its process for Config.Retention.
type execution struct {
	id        string
	pgid      int // the process group, equal to the pid; 0 when nothing ran
	hasStdin  bool
	hasTTY    bool      // started with process.tty; tty is nil when nothing ran
	argv      []string  // as run, for ListExecs
	startedAt time.Time // when the start was accepted
	// started is the ExecStarted event every stream begins with.
	started *agentv1.ExecResponse
	// log holds the output events; it is closed after exited is set.
	log *ring.Log[*outputEvent]
	// done is closed when the exec finished (after exited is set).
	done chan struct{}
	// launchedC is closed once the start is done: launched says whether it
	// succeeded (the fields above are set), or failed and the exec was
	// removed. Only then may others use the exec.
	launchedC chan struct{}
	launched  bool

	// stdin is where ExecStdin goes: the write end of the process's stdin
	// pipe, or the terminal's master for a tty exec; nil without stdin.
	// stdinMu makes each ExecStdin one write, in order; closing a pipe does
	// not take it, so that it unblocks a write stuck on a full pipe.
	stdin     *os.File
	stdinMu   sync.Mutex
	stdinOnce sync.Once
	// tty is the terminal's master for a tty exec, else nil. It is also the
	// stdout pump's file; supervise closes it with closeTTY once the
	// process is reaped and the output drained, under ttyMu so that a
	// resize never meets a closed file.
	tty       *os.File
	ttyMu     sync.Mutex
	ttyClosed bool
	// eotSent is set, under stdinMu, once close_stdin typed EOT into the
	// terminal; later stdin is dropped. midLine is true while the last
	// byte typed was not a line's end.
	eotSent bool
	midLine bool
	// stdinTaken counts, under stdinMu, the stdin bytes the exec has taken
	// from every caller (written, or dropped after the close or the
	// exit): WriteStdin's offsets are positions in that count.
	stdinTaken uint64

	// oomBefore is the sandbox's OOM kill count when the exec started;
	// oomKnown is false when the agent has no counter.
	oomBefore uint64
	oomKnown  bool
	// killSent is set once the agent sent SIGKILL to the group (timeout,
	// stop, or a client's signal): a SIGKILL death is then not the OOM
	// killer's.
	killSent atomic.Bool

	// retired is set once the exec is among the server's finished ones
	// (Server.retired); guarded by Server.mu.
	retired bool

	mu         sync.Mutex
	finished   bool                  // the result is known; the pgid may be reused
	finishedAt time.Time             // when finished became true
	exited     *agentv1.ExecResponse // the ExecExited event, set when finished
}

// outputEvent is one ExecOutput as the ExecResponse streams send it, already
// encoded: the data is copied once, from the pipe's buffer into buf, and
// every stream following the exec sends wire (see ring stamping) as it is,
// without encoding it again. It is never modified after the ring stamps
// its sequence number.
type outputEvent struct {
	stream berthv1.Stream
	// buf holds headRoom bytes for the headers, then the data.
	buf  []byte
	wire []byte // the encoded ExecResponse: a suffix of buf
}

// headRoom is the most bytes the headers of an encoded output event take:
// ExecResponse.output's tag and length, ExecOutput's seq, stream and data
// tags with their varints.
const headRoom = 1 + binary.MaxVarintLen64 + 1 + binary.MaxVarintLen64 + 1 + 1 + 1 + binary.MaxVarintLen64

// newOutputEvent returns an event of stream holding a copy of data.
func newOutputEvent(stream berthv1.Stream, data []byte) *outputEvent {
	// append, not make and copy: the runtime zeroes only what append does
	// not write, where make would zero the whole buffer first (5% of the
	// agent's CPU when output streams fast).
	var room [headRoom]byte
	return &outputEvent{stream: stream, buf: append(room[:], data...)}
}

// stampOutput numbers an event and encodes its headers in front of its
// data: ExecResponse{output: ExecOutput{seq, stream, data}}, fields in
// number order as proto.Marshal writes them. The ring calls it under its
// lock, before any reader can see the event.
func stampOutput(ev *outputEvent, seq uint64) {
	data := ev.buf[headRoom:]
	var innerBuf, headBuf [headRoom]byte
	inner := protowire.AppendTag(innerBuf[:0], wire.ExecOutputSeq, protowire.VarintType)
	inner = protowire.AppendVarint(inner, seq)
	inner = protowire.AppendTag(inner, wire.ExecOutputStream, protowire.VarintType)
	inner = protowire.AppendVarint(inner, uint64(ev.stream))
	inner = protowire.AppendTag(inner, wire.ExecOutputData, protowire.BytesType)
	inner = protowire.AppendVarint(inner, uint64(len(data)))
	head := protowire.AppendTag(headBuf[:0], wire.ExecResponseOutput, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(inner)+len(data)))
	head = append(head, inner...)
	start := headRoom - len(head)
	copy(ev.buf[start:], head)
	ev.wire = ev.buf[start:]
}

// newExecution makes the record of a new exec whose output log has
// ringBytes of the sandbox's retained-output pool.
func newExecution(id string, p *plan, ringBytes uint64, pool *ring.Pool) *execution {
	return &execution{
		id:        id,
		hasStdin:  p.stdin,
		hasTTY:    p.tty,
		argv:      p.argv,
		startedAt: time.Now(),
		done:      make(chan struct{}),
		launchedC: make(chan struct{}),
		log: ring.New(ring.Config[*outputEvent]{
			Limit: ringBytes, Overhead: EventOverhead, Block: p.block, Pool: pool, Stamp: stampOutput,
		}),
	}
}

// setLaunched ends the start: ok when it succeeded.
func (e *execution) setLaunched(ok bool) {
	e.launched = ok
	close(e.launchedC)
}

// awaitLaunched waits for the start to end and reports whether it
// succeeded.
func (e *execution) awaitLaunched() bool {
	<-e.launchedC
	return e.launched
}

// isLaunched reports, without waiting, whether the start succeeded.
func (e *execution) isLaunched() bool {
	select {
	case <-e.launchedC:
		return e.launched
	default:
		return false
	}
}

// setStarted records the ExecStarted event for pid (0 when nothing ran).
func (e *execution) setStarted(pid int, p *plan) {
	e.pgid = pid
	started := &berthv1.ExecStarted{
		ExecId:           e.id,
		Pid:              int64(pid),
		StdoutLimitBytes: p.stdoutLimit,
		StderrLimitBytes: p.stderrLimit,
	}
	if p.timeout > 0 { // unset: none
		started.Timeout = durationpb.New(p.timeout)
	}
	e.started = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: started}}
}

// signal sends sig to the exec's process group (kill(2) with -pgid).
func (e *execution) signal(sig syscall.Signal) error { return e.kill(sig, false) }

// terminate sends sig, for a timeout or the agent's stop, to everything the
// exec started: its process group, and for a tty exec every process group
// of its terminal session — a shell with job control puts each job in a
// group of its own, which a signal to the leader's group would miss. A
// process that made a session of its own (setsid) is out of reach, as it
// means to be.
func (e *execution) terminate(sig syscall.Signal) error { return e.kill(sig, e.hasTTY) }

// kill sends sig to the exec's process group, or with session to every
// group of its terminal session. After the exec finished it does nothing:
// a group id may belong to another process by then. A group that is
// already gone (ESRCH) is not an error.
func (e *execution) kill(sig syscall.Signal, session bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished || e.pgid == 0 {
		return nil
	}
	if sig == unix.SIGKILL {
		// Before the kill: the reaper may hand over the status at once.
		e.killSent.Store(true)
	}
	groups := []int{e.pgid}
	if session {
		groups = sessionGroups(e.pgid)
	}
	var errs []error
	for _, pgid := range groups {
		if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill process group %d (exec's group %d) with %v: %w", pgid, e.pgid, sig, err))
		}
	}
	return errors.Join(errs...)
}

// running reports whether the exec's result is not known yet.
func (e *execution) running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.finished
}

// groupAlive reports whether any process, zombies included, is still in the
// exec's process group, or for a tty exec in its session (see terminate).
func (e *execution) groupAlive() bool {
	if e.pgid == 0 {
		return false
	}
	if e.hasTTY {
		return len(sessionGroups(e.pgid)) > 0
	}
	return unix.Kill(-e.pgid, 0) == nil
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

// writeStdin writes data to the process's stdin, blocking while the pipe
// (or the terminal's input queue) is full. Errors after the process closed
// its end or the exec ended (EPIPE, EIO, closed file) are dropped: the bytes
// had no reader. After close_stdin on a tty exec the bytes are dropped too.
func (e *execution) writeStdin(data []byte) {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	e.writeStdinLocked(data)
}

// writeStdinAt writes the part of data that the exec's stdin has not taken
// yet, data being the bytes of stdin from offset on, and returns the count
// of bytes taken after it. A chunk wholly taken already (a retry) writes
// nothing; an offset beyond the count is errStdinGap with the count.
func (e *execution) writeStdinAt(offset uint64, data []byte) (uint64, error) {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	if offset > e.stdinTaken {
		return e.stdinTaken, &stdinGapError{expected: e.stdinTaken, offset: offset}
	}
	if skip := e.stdinTaken - offset; skip < uint64(len(data)) {
		e.writeStdinLocked(data[skip:])
	}
	return e.stdinTaken, nil
}

// stdinGapError is a WriteStdin offset beyond the bytes taken.
type stdinGapError struct{ expected, offset uint64 }

func (e *stdinGapError) Error() string {
	return fmt.Sprintf("offset %d is beyond the %d bytes of stdin taken: send from offset %d", e.offset, e.expected, e.expected)
}

// writeStdinLocked is writeStdin with stdinMu held.
func (e *execution) writeStdinLocked(data []byte) {
	e.stdinTaken += uint64(len(data))
	if e.eotSent {
		return
	}
	if e.tty != nil && len(data) > 0 {
		last := data[len(data)-1]
		e.midLine = last != '\n' && last != '\r'
	}
	_, _ = e.stdin.Write(data)
}

// closeStdin carries out close_stdin. A pipe is closed, delivering EOF;
// that is idempotent and safe while a write is blocked (that write then
// fails). A terminal gets EOT typed, after the stdin written before it,
// and stays open: closing the master would hang it up. Mid-line, one EOT
// only hands the reader the line so far (termios(3), VEOF), so a second
// one follows: the reader then reads zero bytes, end of file.
func (e *execution) closeStdin() {
	switch {
	case e.stdin == nil:
	case e.tty != nil:
		e.stdinMu.Lock()
		defer e.stdinMu.Unlock()
		if !e.eotSent {
			e.eotSent = true
			if e.midLine {
				_, _ = e.stdin.Write([]byte{eot, eot})
			} else {
				_, _ = e.stdin.Write([]byte{eot})
			}
		}
	default:
		e.stdinOnce.Do(func() { e.stdin.Close() })
	}
}

// endStdin releases the stdin of an exec whose process exited, unblocking
// a write stuck on a full pipe. A terminal's master is left to the stdout
// pump, which closes it once drained.
func (e *execution) endStdin() {
	if e.stdin != nil && e.tty == nil {
		e.stdinOnce.Do(func() { e.stdin.Close() })
	}
}

// resize sets the terminal size of a tty exec. Once the terminal is closed
// (the exec ended) it does nothing.
func (e *execution) resize(rows, cols uint16) error {
	e.ttyMu.Lock()
	defer e.ttyMu.Unlock()
	if e.tty == nil || e.ttyClosed {
		return nil
	}
	if err := resizeTTY(e.tty, rows, cols); err != nil {
		return fmt.Errorf("resize terminal of exec %s: %w", e.id, err)
	}
	return nil
}

// closeTTY closes the terminal's master, which hangs the terminal up.
func (e *execution) closeTTY() {
	e.ttyMu.Lock()
	defer e.ttyMu.Unlock()
	e.ttyClosed = true
	e.tty.Close()
}

// finish records the result and ends the log; streams then send exited.
func (e *execution) finish(res *berthv1.ExecResult) {
	e.mu.Lock()
	e.finished = true
	e.finishedAt = time.Now()
	e.exited = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}}
	e.mu.Unlock()
	e.log.Close()
	close(e.done)
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
// limit bytes and counting all of them. It reads only while the log takes
// more: when the slowest attached reader is the log's budget behind,
// Append waits, the pipe fills up and the process's writes block.
type pump struct {
	log    *ring.Log[*outputEvent]
	f      *os.File // the pipe's read end or a terminal's master
	close  func()   // called instead of f.Close once run is done, when set
	stream berthv1.Stream
	limit  uint64 // bytes kept at most; 0: no cap
	// event is the most bytes read into one event: chunkSize, or less so
	// that one event fits the log's limit (newPump).
	event int
	kept  uint64 // bytes appended to the log
	total uint64 // bytes read

	// waitedNs is the time spent in Append so far, in nanoseconds, and
	// appendStart when the Append in progress began (0: none), so that
	// the drain after the process's exit does not count time spent waiting
	// for readers (waited).
	waitedNs    atomic.Int64
	appendStart atomic.Int64
}

// newPump returns a pump of stream's output into log, keeping the
// first limit bytes (0: all). Its events hold at most chunkSize bytes, and
// no more than the log retains within its limit: a ring smaller than a
// pipe's burst still holds at most its bytes, and sheds the rest.
func newPump(log *ring.Log[*outputEvent], stream berthv1.Stream, limit uint64) *pump {
	return &pump{log: log, stream: stream, limit: limit, event: int(min(chunkSize, log.MaxEventBytes()))}
}

// run reads until EOF or an error (EIO from a terminal whose slave side is
// closed everywhere; a read deadline set by the exec's supervising
// goroutine), closes the file and sends itself on done.
func (p *pump) run(done chan<- *pump) {
	rc, err := p.f.SyscallConn()
	for err == nil {
		var buf *[]byte
		var n int
		n, buf, err = readBurst(rc, p.event)
		if n > 0 {
			p.write((*buf)[:n])
		}
		if buf != nil {
			chunks.Put(buf)
		}
	}
	if p.close != nil {
		p.close()
	} else {
		p.f.Close()
	}
	done <- p
}

// readBurst waits until the file is readable, then reads what it holds, up
// to size bytes (at most chunkSize), into a buffer from chunks (nil when
// nothing was read). It returns io.EOF at end of file,
// os.ErrDeadlineExceeded past the read deadline, and read(2)'s error
// otherwise; n > 0 may come with an error.
func readBurst(rc syscall.RawConn, size int) (n int, buf *[]byte, err error) {
	var readErr error
	err = rc.Read(func(fd uintptr) bool {
		if buf == nil {
			buf = chunks.Get().(*[]byte)
		}
		b := (*buf)[:size]
		for n < len(b) {
			m, err := unix.Read(int(fd), b[n:])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				if n == 0 {
					// Nothing yet: wait for the poller without a buffer.
					chunks.Put(buf)
					buf = nil
					return false
				}
				return true
			case err != nil:
				readErr = err
				return true
			case m == 0:
				readErr = io.EOF
				return true
			}
			n += m
		}
		return true
	})
	if err == nil {
		err = readErr
	}
	return n, buf, err
}

// write accounts for b and appends the part within the cap, copied, as one
// output event, waiting while the log's readers are behind (see
// ring.Log.Append). Beyond the cap it only counts: no allocation, no wait.
func (p *pump) write(b []byte) {
	p.total += uint64(len(b))
	n := uint64(len(b))
	if p.limit > 0 {
		if p.kept >= p.limit {
			return
		}
		n = min(n, p.limit-p.kept)
	}
	p.kept += n
	ev := newOutputEvent(p.stream, b[:n])
	start := time.Now().UnixNano()
	p.appendStart.Store(start)
	p.log.Append(ev, int(n))
	p.appendStart.Store(0)
	p.waitedNs.Add(time.Now().UnixNano() - start)
}

// waited returns the time the pump has spent in Append, the one in
// progress included.
func (p *pump) waited() time.Duration {
	w := p.waitedNs.Load()
	if s := p.appendStart.Load(); s != 0 {
		w += max(time.Now().UnixNano()-s, 0)
	}
	return time.Duration(w)
}

// fill sets the byte counts and truncation flag of p's stream in res.
func (p *pump) fill(res *berthv1.ExecResult) {
	truncated := p.limit > 0 && p.total > p.limit
	switch p.stream {
	case berthv1.Stream_STREAM_STDOUT:
		res.StdoutBytes, res.StdoutTruncated = p.total, truncated
	case berthv1.Stream_STREAM_STDERR:
		res.StderrBytes, res.StderrTruncated = p.total, truncated
	}
}

// supervise owns a started exec until it finishes: it enforces the timeout
// and the agent's stop (SIGTERM to the group, SIGKILL after KillGrace),
// waits for the reaper's exit status, drains the output (two pipes, or one
// terminal) for at most DrainGrace of reading (a background child may hold
// it open forever; time spent waiting for slow readers does not count), and
// records the result. It owns the pump goroutines and waits for them.
func (s *Server) supervise(e *execution, exited <-chan exitStatus, start time.Time, timeout time.Duration, pumps []*pump) {
	defer s.execWG.Done()
	pumped := make(chan *pump, len(pumps))
	for _, p := range pumps {
		go p.run(pumped)
	}

	var deadlineC <-chan time.Time // none without a timeout
	if timeout > 0 {
		deadline := time.NewTimer(timeout)
		defer deadline.Stop()
		deadlineC = deadline.C
	}
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
		s.logSignalErr(e, e.terminate(unix.SIGTERM))
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
		case <-deadlineC:
			timedOut = true
			escalate()
		case <-stopping:
			stopping = nil
			escalate()
		case <-killC:
			s.logSignalErr(e, e.terminate(unix.SIGKILL))
			killSent, killC = true, nil
		}
	}
	oomAfter, _ := s.oom.count()
	e.endStdin()
	if termSent && !killSent {
		// The process exited after SIGTERM; what it left in its group (a
		// grandchild ignoring SIGTERM) still gets its grace, then SIGKILL.
		if e.groupAlive() {
			<-killC
			s.logSignalErr(e, e.terminate(unix.SIGKILL))
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

	s.drain(pumps, pumped)

	if e.tty != nil {
		// The process is reaped: hanging up its terminal can only reach
		// what it left behind.
		e.closeTTY()
	}

	res := resultOf(st, start)
	res.TimedOut = timedOut
	res.OomKilled = oomVerdict(st.ws, e.oomBefore, oomAfter, e.oomKnown, e.killSent.Load(), &s.ooms)
	for _, p := range pumps {
		p.fill(res)
	}
	e.finish(res)
	s.retire(e)
	s.cfg.ExecLogger.Info("exec finished", "exec_id", e.id, "pid", e.pgid, "program", textsafe.Cut(e.argv[0], maxLoggedProgram), "tty", e.hasTTY,
		"exit_code", res.GetExitCode(), "signal", res.Signal, "timed_out", timedOut, "oom_killed", res.OomKilled, "duration", res.Duration.AsDuration())
}

// drain waits for the pumps to reach the end of their output after the
// process exited. Completion is the process's exit, not pipe EOF: a pump
// whose file stays open for DrainGrace of reading is cut (its reads get a
// past deadline; it closes its file). Time a pump spends waiting for slow
// readers is not reading time: what the process wrote before it exited
// reaches every attached reader, however slow.
func (s *Server) drain(pumps []*pump, pumped <-chan *pump) {
	exitAt := time.Now()
	waitedAt := make(map[*pump]time.Duration, len(pumps))
	for _, p := range pumps {
		waitedAt[p] = p.waited()
	}
	timer := time.NewTimer(s.cfg.DrainGrace)
	defer timer.Stop()
	for len(waitedAt) > 0 {
		select {
		case p := <-pumped:
			delete(waitedAt, p)
		case <-timer.C:
			next := s.cfg.DrainGrace
			for p, w := range waitedAt {
				reading := time.Since(exitAt) - (p.waited() - w)
				if reading >= s.cfg.DrainGrace {
					_ = p.f.SetReadDeadline(time.Unix(1, 0))
					continue
				}
				next = min(next, s.cfg.DrainGrace-reading)
			}
			timer.Reset(max(next, time.Millisecond))
		}
	}
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
		ExitCode:    proto.Int32(0),
		Duration:    durationpb.New(st.at.Sub(start)),
		UserCpu:     durationpb.New(time.Duration(st.ru.Utime.Nano())),
		SystemCpu:   durationpb.New(time.Duration(st.ru.Stime.Nano())),
		MaxRssBytes: uint64(max(st.ru.Maxrss, 0)) * 1024,
	}
	switch {
	case st.ws.Exited():
		res.ExitCode = proto.Int32(int32(st.ws.ExitStatus()))
	case st.ws.Signaled():
		sig := st.ws.Signal()
		res.ExitCode = proto.Int32(128 + int32(sig))
		res.Signal = unix.SignalName(sig)
		if res.Signal == "" {
			res.Signal = fmt.Sprintf("SIG%d", int(sig))
		}
	}
	return res
}
