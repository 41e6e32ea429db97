package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

const (
	// stdinChunkBytes is the largest ExecStdin message the client sends.
	stdinChunkBytes = 1 << 20
	// runDefaultRecvBytes is gRPC's default receive limit, and
	// runResponseOverhead a bound on a RunResponse beyond its output.
	runDefaultRecvBytes = 4 << 20
	runResponseOverhead = 64 << 10
	// finalStatusWait bounds the wait for the stream's status after the
	// exited event.
	finalStatusWait = time.Second
)

var (
	// ErrProtocol is wrapped by the error Exec, Attach or Wait return when
	// berthd broke the Exec stream protocol: a first event other than
	// started, an output whose sequence number skips ahead without a
	// dropped event, an unknown output stream, an exited event without a
	// result, or a stream that ends without exited. Output may have been
	// lost, so the exec is abandoned rather than its output silently cut.
	ErrProtocol = errors.New("exec stream protocol violation")

	// ErrStreamClosed is returned by Stdin writes and Signal once the Exec
	// stream has ended; Wait says why it ended.
	ErrStreamClosed = errors.New("exec stream closed")

	// ErrNoStdin is returned by writes to Execution.Stdin when the exec was
	// started with ProcessSpec.Stdin false.
	ErrNoStdin = errors.New("exec has no stdin: started with ProcessSpec.Stdin false")
)

// ExecOption configures Exec, Attach and Run.
type ExecOption func(*execConfig)

type execConfig struct {
	execID   string
	detached berthv1.DetachedOutput
	hangup   bool
	tty      *berthv1.TtySize
	stdout   io.Writer
	stderr   io.Writer
	onEvent  func(*berthv1.ExecResponse)
}

// WithHangupOnDisconnect makes berthd send SIGHUP to the exec's process
// group when the stream breaks while the exec runs (this process dies, its
// connection drops), as a terminal hangup does for ssh
// (ExecStart.hangup_on_disconnect). Exec only; the default leaves the exec
// running, to be attached again.
func WithHangupOnDisconnect() ExecOption {
	return func(c *execConfig) { c.hangup = true }
}

func newExecConfig(opts []ExecOption) execConfig {
	var cfg execConfig
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// WithExecID names the exec (1 to 128 characters from [A-Za-z0-9._-]); by
// default berthd mints an id. Starting an exec whose id already exists in
// the sandbox runs nothing and follows the existing exec from its first
// event, so a caller that lost its stream can retry Exec safely. Attach
// ignores it.
func WithExecID(id string) ExecOption {
	return func(c *execConfig) { c.execID = id }
}

// WithDetachedOutput says what the exec does with output while no caller
// is attached and reading (ExecStart.detached_output): by default the
// server keeps the newest output within its ring and drops the oldest;
// DETACHED_OUTPUT_BLOCK makes the process's writes wait for a reader
// instead. While a caller reads, no output is ever dropped. Exec and
// ExecBackground only.
func WithDetachedOutput(mode berthv1.DetachedOutput) ExecOption {
	return func(c *execConfig) { c.detached = mode }
}

// WithTTY runs the process on a pseudo-terminal of rows x cols character
// cells, as its controlling terminal (it sets ProcessSpec.Tty on a copy of
// the spec). The terminal's output, stderr included, arrives as stdout, with
// the terminal's line discipline applied ("\n" becomes "\r\n", input is
// echoed). Closing Stdin types EOT (^D) instead of closing the terminal;
// Execution.Resize changes the size. Exec and ExecBackground only.
func WithTTY(rows, cols uint16) ExecOption {
	return func(c *execConfig) { c.tty = &berthv1.TtySize{Rows: uint32(rows), Cols: uint32(cols)} }
}

// WithStdout has the exec's stdout bytes written to w exactly as berthd sent
// them, in sequence order, from the Execution's receive goroutine. The
// default discards them. A Write error ends the stream: Wait returns it
// wrapped, and the process keeps running in the sandbox (Attach can follow
// it again). A Write that blocks blocks the stream.
func WithStdout(w io.Writer) ExecOption {
	return func(c *execConfig) { c.stdout = w }
}

// WithStderr is WithStdout for stderr. The same writer may be given to both
// to interleave the streams in sequence order.
func WithStderr(w io.Writer) ExecOption {
	return func(c *execConfig) { c.stderr = w }
}

// WithEventHandler has fn called with every event after started (outputs,
// heartbeats, dropped notes, exited, and event types newer than this client),
// in stream order, from the Execution's receive goroutine, after the
// event's output bytes were written. fn must not block for long and must not
// call Wait.
func WithEventHandler(fn func(*berthv1.ExecResponse)) ExecOption {
	return func(c *execConfig) { c.onEvent = fn }
}

// Execution is a process started by Exec or followed by Attach. A goroutine
// owned by the Execution receives its events until the exited event arrives,
// the stream fails, or the context given to Exec ends; Wait waits for it.
// The methods are safe for concurrent use.
type Execution struct {
	sandboxID string
	started   *berthv1.ExecStarted
	stream    grpc.BidiStreamingClient[berthv1.ExecRequest, berthv1.ExecResponse]
	ctx       context.Context
	cancel    context.CancelFunc
	cfg       execConfig
	stdin     *stdinWriter

	// sendSem serializes Sends, which gRPC forbids to run concurrently on
	// one stream. It is a channel, not a mutex, so that waiting for it can
	// honor a context: a Signal must not hang behind a stdin write that
	// flow control holds up.
	sendSem chan struct{}

	lastSeq   atomic.Uint64
	lastEvent atomic.Int64 // unix nanoseconds

	mu      sync.Mutex
	dropped []*berthv1.ExecDropped

	done   chan struct{}
	result *berthv1.ExecResult // set before done is closed
	err    error               // set before done is closed
}

// Exec starts spec in the sandbox sandboxID and returns once berthd reports
// that the process runs. The Execution lives as long as ctx: canceling ctx
// ends the stream (Wait then returns a codes.Canceled *Error) but not the
// process, which runs on in the sandbox until it exits or times out.
//
// Errors before the start: codes.InvalidArgument for a malformed spec,
// codes.NotFound (ReasonSandboxNotFound), codes.FailedPrecondition
// (ReasonCwdInvalid) when spec.Cwd is not a directory.
func (c *Client) Exec(ctx context.Context, sandboxID string, spec *berthv1.ProcessSpec, opts ...ExecOption) (*Execution, error) {
	cfg := newExecConfig(opts)
	first := &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId:          sandboxID,
		ExecId:             cfg.execID,
		Process:            cfg.spec(spec),
		DetachedOutput:     cfg.detached,
		HangupOnDisconnect: cfg.hangup,
	}}}
	return c.openExec(ctx, sandboxID, first, 0, spec.GetStdin(), cfg)
}

// spec returns spec with the options' terminal, copied when it changes.
func (cfg execConfig) spec(spec *berthv1.ProcessSpec) *berthv1.ProcessSpec {
	if cfg.tty == nil {
		return spec
	}
	spec = proto.CloneOf(spec)
	if spec == nil {
		spec = &berthv1.ProcessSpec{}
	}
	spec.Tty = cfg.tty
	return spec
}

// ExecBackground starts spec in the sandbox sandboxID and returns berthd's
// started event (exec id, pid, effective timeout and caps) as soon as the
// process runs; it runs on without a stream. Follow it with Attach (which
// also feeds its stdin when spec.Stdin is set), list it with ListExecs and
// signal it with SignalExec. Of the ExecOptions WithExecID and WithTTY
// apply. Errors as for Exec.
func (c *Client) ExecBackground(ctx context.Context, sandboxID string, spec *berthv1.ProcessSpec, opts ...ExecOption) (*berthv1.ExecStarted, error) {
	cfg := newExecConfig(opts)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.sandboxes.Exec(ctx)
	if err != nil {
		return nil, convertError(err)
	}
	first := &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId:      sandboxID,
		ExecId:         cfg.execID,
		Process:        cfg.spec(spec),
		Background:     true,
		DetachedOutput: cfg.detached,
	}}}
	if err := stream.Send(first); err != nil {
		if errors.Is(err, io.EOF) {
			err = streamStatus(stream)
		}
		return nil, convertError(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: stream ended before started", ErrProtocol)
		}
		return nil, convertError(err)
	}
	started := resp.GetStarted()
	if started == nil {
		return nil, fmt.Errorf("%w: first event is %T, want started", ErrProtocol, resp.GetEvent())
	}
	// berthd ends the stream now; reading its status finishes the call
	// cleanly, but a berthd that streams on must not hold the caller.
	t := time.AfterFunc(finalStatusWait, cancel)
	_, _ = stream.Recv()
	t.Stop()
	return started, nil
}

// ListExecs lists the execs of the sandbox sandboxID that run or ended
// within the agent's retention time, ordered by start time. The listing is
// bounded in size: resp.Omitted counts the oldest execs left out. Errors:
// codes.NotFound (ReasonSandboxNotFound).
func (c *Client) ListExecs(ctx context.Context, sandboxID string) (*berthv1.ListExecsResponse, error) {
	resp, err := c.sandboxes.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: sandboxID})
	if err != nil {
		return nil, convertError(err)
	}
	return resp, nil
}

// SignalExec sends the signal name ("TERM", "SIGKILL", "15"; see signal(7))
// to the process group of the exec execID without a stream. It returns
// berthv1.ExecState_EXEC_STATE_RUNNING when the signal was sent and
// EXEC_STATE_EXITED when the exec had ended already (nothing was sent).
// Errors: codes.InvalidArgument for an unknown signal, codes.NotFound
// (ReasonSandboxNotFound, ReasonExecNotFound).
func (c *Client) SignalExec(ctx context.Context, sandboxID, execID, signal string) (berthv1.ExecState, error) {
	resp, err := c.sandboxes.SignalExec(ctx, &berthv1.SignalExecRequest{SandboxId: sandboxID, ExecId: execID, Signal: signal})
	if err != nil {
		return berthv1.ExecState_EXEC_STATE_UNSPECIFIED, convertError(err)
	}
	return resp.GetState(), nil
}

// Attach follows the exec execID of sandbox sandboxID: berthd replays every
// retained event with a sequence number greater than sinceSeq (zero replays
// all), then follows live. Pass the LastSeq of an Execution whose stream
// broke to lose nothing still retained. Events berthd no longer retains are
// reported as dropped (see Dropped). Errors: codes.NotFound
// (ReasonSandboxNotFound, ReasonExecNotFound).
func (c *Client) Attach(ctx context.Context, sandboxID, execID string, sinceSeq uint64, opts ...ExecOption) (*Execution, error) {
	cfg := newExecConfig(opts)
	first := &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Attach{Attach: &berthv1.ExecAttach{
		SandboxId: sandboxID,
		ExecId:    execID,
		SinceSeq:  sinceSeq,
	}}}
	// Whether the exec has a stdin pipe is berthd's to say.
	return c.openExec(ctx, sandboxID, first, sinceSeq, true, cfg)
}

// openExec opens an Exec stream with first and waits for started, retrying
// the opening under the Client's retry policy.
func (c *Client) openExec(ctx context.Context, sandboxID string, first *berthv1.ExecRequest, sinceSeq uint64, stdin bool, cfg execConfig) (*Execution, error) {
	var e *Execution
	err := c.retry(ctx, func() (err error) {
		e, err = c.openExecOnce(ctx, sandboxID, first, sinceSeq, stdin, cfg)
		return err
	})
	return e, err
}

func (c *Client) openExecOnce(ctx context.Context, sandboxID string, first *berthv1.ExecRequest, sinceSeq uint64, stdin bool, cfg execConfig) (*Execution, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.sandboxes.Exec(ctx, wire.CallOption())
	if err != nil {
		cancel()
		return nil, convertError(err)
	}
	if err := stream.Send(first); err != nil {
		if errors.Is(err, io.EOF) {
			// berthd ended the stream; its status says why.
			err = streamStatus(stream)
		}
		cancel()
		return nil, convertError(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: stream ended before started", ErrProtocol)
		}
		return nil, convertError(err)
	}
	started := resp.GetStarted()
	if started == nil {
		cancel()
		return nil, fmt.Errorf("%w: first event is %T, want started", ErrProtocol, resp.GetEvent())
	}
	e := &Execution{
		sandboxID: sandboxID,
		started:   started,
		stream:    stream,
		ctx:       ctx,
		cancel:    cancel,
		cfg:       cfg,
		sendSem:   make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	e.stdin = &stdinWriter{e: e, enabled: stdin}
	e.lastSeq.Store(sinceSeq)
	e.lastEvent.Store(time.Now().UnixNano())
	go e.receive()
	return e, nil
}

// streamStatus returns why a stream that refused a Send ended: the status
// error that follows any messages still buffered.
func streamStatus(stream grpc.BidiStreamingClient[berthv1.ExecRequest, berthv1.ExecResponse]) error {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: stream ended before started", ErrProtocol)
			}
			return err
		}
	}
}

// ID returns the exec's id, the caller's or the one berthd minted.
func (e *Execution) ID() string { return e.started.GetExecId() }

// SandboxID returns the id of the sandbox the exec runs in.
func (e *Execution) SandboxID() string { return e.sandboxID }

// Started returns berthd's started event: pid, and the effective timeout
// (the server's default when none was asked) and output caps.
func (e *Execution) Started() *berthv1.ExecStarted { return e.started }

// LastSeq returns the sequence number of the last output event delivered (or
// reported dropped), the value to give Attach to resume after it.
func (e *Execution) LastSeq() uint64 { return e.lastSeq.Load() }

// LastEventTime returns when the last event, heartbeats included, arrived:
// a stream that is alive hears from berthd at least every heartbeat period.
func (e *Execution) LastEventTime() time.Time { return time.Unix(0, e.lastEvent.Load()) }

// Dropped returns the dropped events received so far: ranges of sequence
// numbers whose output berthd's retention ring lost before this stream read
// them, with the number of bytes lost. The result is not affected.
func (e *Execution) Dropped() []*berthv1.ExecDropped {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*berthv1.ExecDropped(nil), e.dropped...)
}

// Done is closed when the receive goroutine has ended; Wait then returns at
// once.
func (e *Execution) Done() <-chan struct{} { return e.done }

// Wait waits until the stream ends and returns the result from berthd's
// exited event, or why the stream ended without one: an *Error (codes.Canceled
// when the context given to Exec was canceled), a WithStdout or WithStderr
// writer's error, or ErrProtocol. It never makes up a result. All output has
// been written when Wait returns. Wait may be called more than once.
func (e *Execution) Wait() (*berthv1.ExecResult, error) {
	<-e.done
	return e.result, e.err
}

// Stdin returns the exec's standard input. Write sends p as ExecStdin
// messages of at most 1 MiB; concurrent Writes are sent one after the other,
// each in one piece. Close sends close_stdin, delivering EOF to the process
// (or typing EOT into its terminal); it is idempotent. Writing fails with ErrNoStdin when the exec was started
// without ProcessSpec.Stdin, with ErrStreamClosed once the stream has ended,
// and with io.ErrClosedPipe after Close.
func (e *Execution) Stdin() io.WriteCloser { return e.stdin }

// Signal sends the signal name ("TERM", "SIGKILL", "15"; see signal(7)) to
// the exec's process group. It returns once the request is sent, not when
// the process reacts; the result says how it ended. It fails with ctx's
// error when ctx ends while another send (a large stdin write) holds the
// stream, and with ErrStreamClosed once the stream has ended.
func (e *Execution) Signal(ctx context.Context, name string) error {
	if err := e.acquire(ctx); err != nil {
		return err
	}
	defer e.release()
	return e.sendLocked(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Signal{Signal: &berthv1.ExecSignal{Signal: name}}})
}

// Resize sets the terminal size of an exec started with WithTTY (or
// ProcessSpec.Tty) to rows x cols character cells; the process gets
// SIGWINCH. It fails like Signal, and the stream fails with
// codes.InvalidArgument when the exec has no terminal or a size is 0.
func (e *Execution) Resize(ctx context.Context, rows, cols uint16) error {
	if err := e.acquire(ctx); err != nil {
		return err
	}
	defer e.release()
	return e.sendLocked(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Resize{Resize: &berthv1.ExecResize{Rows: uint32(rows), Cols: uint32(cols)}}})
}

func (e *Execution) acquire(ctx context.Context) error {
	select {
	case e.sendSem <- struct{}{}:
		return nil
	case <-e.done:
		return ErrStreamClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Execution) release() { <-e.sendSem }

// sendLocked sends req; the caller holds sendSem.
func (e *Execution) sendLocked(req *berthv1.ExecRequest) error {
	select {
	case <-e.done:
		return ErrStreamClosed
	default:
	}
	if err := e.stream.Send(req); err != nil {
		if errors.Is(err, io.EOF) {
			return ErrStreamClosed
		}
		return convertError(err)
	}
	return nil
}

type stdinWriter struct {
	e       *Execution
	enabled bool
	// closed is set while holding e.sendSem and read without it, so that a
	// Write after Close fails the same way whether or not the stream ended.
	closed atomic.Bool
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	if !w.enabled {
		return 0, ErrNoStdin
	}
	if w.closed.Load() {
		return 0, io.ErrClosedPipe
	}
	if err := w.e.acquire(w.e.ctx); err != nil {
		return 0, streamEnded(err)
	}
	defer w.e.release()
	if w.closed.Load() {
		return 0, io.ErrClosedPipe
	}
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), stdinChunkBytes)]
		// Send marshals the message before it returns: the caller may reuse
		// p once Write returns.
		if err := w.e.sendLocked(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{Data: chunk}}}); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func (w *stdinWriter) Close() error {
	if !w.enabled {
		return ErrNoStdin
	}
	if w.closed.Load() {
		return nil
	}
	if err := w.e.acquire(w.e.ctx); err != nil {
		return streamEnded(err)
	}
	defer w.e.release()
	if w.closed.Swap(true) {
		return nil
	}
	return w.e.sendLocked(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_CloseStdin{CloseStdin: &berthv1.ExecCloseStdin{}}})
}

// streamEnded maps the end of the Execution's own context, which also ends
// the stream, to ErrStreamClosed.
func streamEnded(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ErrStreamClosed
	}
	return err
}

// receive is the Execution's receive goroutine.
func (e *Execution) receive() {
	defer close(e.done)
	defer e.cancel()
	e.result, e.err = e.follow()
}

func (e *Execution) follow() (*berthv1.ExecResult, error) {
	// Output events are read as they are on the wire: their bytes go to
	// the writers from gRPC's buffers, without protobuf's decode (an
	// allocation and two copies of every byte). Other events, and outputs
	// when an event handler wants them, are decoded.
	var (
		fr  wire.Frame
		buf []byte
	)
	defer fr.Free()
	for {
		err := e.stream.RecvMsg(&fr)
		var resp *berthv1.ExecResponse
		if err == nil {
			if seq, stream, ok := fr.ExecOutput(); ok && e.cfg.onEvent == nil {
				e.lastEvent.Store(time.Now().UnixNano())
				if _, err := e.output(seq, stream, fr.Data(&buf)); err != nil {
					return nil, err
				}
				continue
			}
			resp = new(berthv1.ExecResponse)
			if err = fr.Decode(resp); err != nil {
				err = fmt.Errorf("%w: %w", ErrProtocol, err)
			}
			fr.Free()
		}
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: stream ended without exited", ErrProtocol)
		}
		if errors.Is(err, ErrProtocol) {
			return nil, err
		}
		if err != nil {
			return nil, convertError(err)
		}
		e.lastEvent.Store(time.Now().UnixNano())
		switch ev := resp.GetEvent().(type) {
		case *berthv1.ExecResponse_Output:
			fresh, err := e.output(ev.Output.GetSeq(), ev.Output.GetStream(), ev.Output.GetData())
			if err != nil {
				return nil, err
			}
			if !fresh {
				continue
			}
		case *berthv1.ExecResponse_Dropped:
			fresh, err := e.drop(ev.Dropped)
			if err != nil {
				return nil, err
			}
			if !fresh {
				continue
			}
		case *berthv1.ExecResponse_Heartbeat:
			// Liveness only, recorded above.
		case *berthv1.ExecResponse_Exited:
			res := ev.Exited.GetResult()
			if res == nil {
				return nil, fmt.Errorf("%w: exited without a result", ErrProtocol)
			}
			e.emit(resp)
			// berthd ends the stream after exited; reading its status lets
			// the call finish cleanly instead of being reset, but a server
			// that keeps the stream open must not hold Wait up.
			t := time.AfterFunc(finalStatusWait, e.cancel)
			_, _ = e.stream.Recv()
			t.Stop()
			return res, nil
		case *berthv1.ExecResponse_Started:
			return nil, fmt.Errorf("%w: second started event", ErrProtocol)
		default:
			// An event type newer than this client: only handlers see it.
		}
		e.emit(resp)
	}
}

// output delivers the output event numbered seq of stream, data. It
// reports false for a replayed event already delivered, which is skipped.
func (e *Execution) output(seq uint64, stream berthv1.Stream, data []byte) (bool, error) {
	last := e.lastSeq.Load()
	if seq <= last {
		return false, nil
	}
	if seq != last+1 {
		return false, fmt.Errorf("%w: output seq %d follows %d without a dropped event", ErrProtocol, seq, last)
	}
	var w io.Writer
	switch stream {
	case berthv1.Stream_STREAM_STDOUT:
		w = e.cfg.stdout
	case berthv1.Stream_STREAM_STDERR:
		w = e.cfg.stderr
	default:
		return false, fmt.Errorf("%w: output seq %d on stream %v", ErrProtocol, seq, stream)
	}
	if w != nil {
		if _, err := w.Write(data); err != nil {
			return false, fmt.Errorf("write %s of exec %s: %w", streamName(stream), e.ID(), err)
		}
	}
	e.lastSeq.Store(seq)
	return true, nil
}

// drop records d. It reports false for a note about events already
// delivered, which is skipped.
func (e *Execution) drop(d *berthv1.ExecDropped) (bool, error) {
	last := e.lastSeq.Load()
	if d.GetLastSeq() < d.GetFirstSeq() || d.GetFirstSeq() == 0 {
		return false, fmt.Errorf("%w: dropped range %d..%d", ErrProtocol, d.GetFirstSeq(), d.GetLastSeq())
	}
	if d.GetLastSeq() <= last {
		return false, nil
	}
	if d.GetFirstSeq() > last+1 {
		return false, fmt.Errorf("%w: dropped range %d..%d follows %d", ErrProtocol, d.GetFirstSeq(), d.GetLastSeq(), last)
	}
	e.mu.Lock()
	e.dropped = append(e.dropped, d)
	e.mu.Unlock()
	e.lastSeq.Store(d.GetLastSeq())
	return true, nil
}

func (e *Execution) emit(resp *berthv1.ExecResponse) {
	if e.cfg.onEvent != nil {
		e.cfg.onEvent(resp)
	}
}

func streamName(s berthv1.Stream) string {
	if s == berthv1.Stream_STREAM_STDERR {
		return "stderr"
	}
	return "stdout"
}

// Run runs spec in the sandbox sandboxID to completion and returns its
// result with the head of stdout and stderr, up to their caps (berthd's
// defaults when unset: 2 MiB and 1 MiB; the result says whether each was
// truncated), without streaming. Every byte within the caps is there: Run
// fails with codes.DataLoss (ReasonOutputLost) rather than return less.
// The client accepts a response as large as the caps, beyond gRPC's
// default 4 MiB. spec.Stdin must be false. Of the ExecOptions only
// WithExecID applies. Errors as for Exec, and codes.InvalidArgument naming
// the cap when the caps exceed berthd's Run maximum.
func (c *Client) Run(ctx context.Context, sandboxID string, spec *berthv1.ProcessSpec, opts ...ExecOption) (*berthv1.RunResponse, error) {
	cfg := newExecConfig(opts)
	var resp *berthv1.RunResponse
	// A response holds at most the two caps and the result: accept that
	// much when the caps exceed gRPC's default 4 MiB receive limit.
	var callOpts []grpc.CallOption
	if caps := spec.GetStdoutLimitBytes() + spec.GetStderrLimitBytes(); caps > runDefaultRecvBytes-runResponseOverhead {
		callOpts = append(callOpts, grpc.MaxCallRecvMsgSize(int(min(caps+runResponseOverhead, math.MaxInt32))))
	}
	err := c.retry(ctx, func() (err error) {
		resp, err = c.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sandboxID, ExecId: cfg.execID, Process: spec}, callOpts...)
		return convertError(err)
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
