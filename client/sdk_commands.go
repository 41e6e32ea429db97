package client

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Commands runs commands in one sandbox (Sandbox.Commands): the Python
// SDK's sb.commands, the TypeScript SDK's sb.commands.
type Commands struct {
	c  *Client
	id string
}

// RunOptions configure Commands.Run and Start. Zero fields take the
// sandbox's defaults.
type RunOptions struct {
	Cwd  string
	Env  map[string]string // added to the sandbox's environment
	User string            // "uid", "uid:gid" or a name from the sandbox's /etc/passwd
	// Timeout is the command's own (ProcessSpec.timeout, 1 s to 24 h;
	// default berthd's 30 min): at expiry berthd sends the process group
	// SIGTERM, then SIGKILL after its grace, and the result says TimedOut.
	// The command really stops; no deadline is put on the stream.
	Timeout time.Duration
	// Stdin, when set, is copied to the command's stdin, which is then
	// closed. Start with StdinOpen leaves stdin open for SendStdin.
	Stdin     io.Reader
	StdinOpen bool
	// OnStdout and OnStderr get the output's bytes exactly as received, in
	// order, from the receiving goroutine; a slow callback slows the
	// command (gRPC flow control), nothing is dropped. The slice is valid
	// only during the call.
	OnStdout, OnStderr func([]byte)
	// NoCapture keeps no output in the result (for large outputs).
	NoCapture bool
	// ExecID names the command; default berthd mints one.
	ExecID string
}

// CommandResult is a finished command: the Python SDK's CommandResult.
// A non-zero exit is a result, not an error.
type CommandResult struct {
	ExecID string
	// ExitCode is the exit status, or -1 when a signal ended the command.
	ExitCode  int
	Signal    string // e.g. "SIGKILL"; empty when it exited
	TimedOut  bool   // RunOptions.Timeout ended it
	OOMKilled bool   // the kernel's OOM killer ended it
	// Stdout and Stderr hold the output exactly as received (empty with
	// NoCapture).
	Stdout, Stderr           []byte
	StdoutBytes, StderrBytes uint64 // written by the command
	DroppedBytes             uint64 // lost while nobody read (reattached handles)
	Duration                 time.Duration
}

// Run runs cmd under the sandbox's shell (sh -c) to completion, streaming
// its output to opts' callbacks; RunArgv runs an argv. When ctx ends
// before the command, the command is killed (SIGKILL) and ctx's error
// returned. Errors are *Error (ReasonCwdInvalid, ReasonSandboxNotFound,
// codes.InvalidArgument naming the field, ...), the opening retried under
// the Client's RetryPolicy.
func (cs *Commands) Run(ctx context.Context, cmd string, opts RunOptions) (*CommandResult, error) {
	return cs.run(ctx, &berthv1.ProcessSpec{ShellCommand: cmd}, opts)
}

// RunArgv is Run of an argv, without a shell.
func (cs *Commands) RunArgv(ctx context.Context, argv []string, opts RunOptions) (*CommandResult, error) {
	return cs.run(ctx, &berthv1.ProcessSpec{Argv: argv}, opts)
}

func (cs *Commands) run(ctx context.Context, spec *berthv1.ProcessSpec, opts RunOptions) (*CommandResult, error) {
	out := newOutput(opts)
	e, err := cs.c.Exec(ctx, cs.id, opts.spec(spec), append(out.options(), WithHangupOnDisconnect())...)
	if err != nil {
		if cerr := ctxEnded(ctx, err); cerr != nil {
			// ctx ended while the stream opened (a loaded server): a
			// command that started hangs up with the stream.
			return nil, cerr
		}
		return nil, err
	}
	h := &CommandHandle{ExecID: e.ID(), cs: cs, e: e, out: out}
	h.feed(opts.Stdin)
	r, err := h.Wait()
	if cerr := ctxEnded(ctx, err); cerr != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = cs.c.SignalExec(kctx, cs.id, h.ExecID, "SIGKILL")
		return nil, cerr
	}
	return r, err
}

// ctxEnded returns ctx's error when err (not nil) is ctx ending, else nil:
// ctx.Err(), or context.DeadlineExceeded for berthd's DEADLINE_EXCEEDED
// when ctx has a deadline — berthd got it with the call (grpc-timeout)
// and may see it pass, and end the stream, before this process does.
func ctxEnded(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if _, ok := ctx.Deadline(); ok && status.Code(err) == codes.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return nil
}

// Start starts cmd (under sh -c) as a background command, which outlives
// the stream and this process, and follows it: the returned handle's Wait
// gives its result. StartArgv starts an argv. The handle's stream lives
// as long as ctx.
func (cs *Commands) Start(ctx context.Context, cmd string, opts RunOptions) (*CommandHandle, error) {
	return cs.start(ctx, &berthv1.ProcessSpec{ShellCommand: cmd}, opts)
}

// StartArgv is Start of an argv, without a shell.
func (cs *Commands) StartArgv(ctx context.Context, argv []string, opts RunOptions) (*CommandHandle, error) {
	return cs.start(ctx, &berthv1.ProcessSpec{Argv: argv}, opts)
}

func (cs *Commands) start(ctx context.Context, spec *berthv1.ProcessSpec, opts RunOptions) (*CommandHandle, error) {
	var eo []ExecOption
	if opts.ExecID != "" {
		eo = append(eo, WithExecID(opts.ExecID))
	}
	var started *berthv1.ExecStarted
	err := cs.c.retry(ctx, func() (err error) {
		started, err = cs.c.ExecBackground(ctx, cs.id, opts.spec(spec), eo...)
		return err
	})
	if err != nil {
		return nil, err
	}
	h, err := cs.Connect(ctx, started.GetExecId(), ConnectOptions{OnStdout: opts.OnStdout, OnStderr: opts.OnStderr, NoCapture: opts.NoCapture})
	if err != nil {
		return nil, err
	}
	h.feed(opts.Stdin)
	return h, nil
}

// ConnectOptions configure Commands.Connect.
type ConnectOptions struct {
	// SinceSeq replays the retained output after this sequence number
	// (a handle's LastSeq); zero replays all that berthd retains.
	SinceSeq           uint64
	OnStdout, OnStderr func([]byte)
	NoCapture          bool
}

// Connect follows the command execID again (started by Start, or by
// another process), replaying its retained output after opts.SinceSeq.
// Errors: *Error with ReasonExecNotFound, ReasonSandboxNotFound.
func (cs *Commands) Connect(ctx context.Context, execID string, opts ConnectOptions) (*CommandHandle, error) {
	out := newOutput(RunOptions{OnStdout: opts.OnStdout, OnStderr: opts.OnStderr, NoCapture: opts.NoCapture})
	ctx, cancel := context.WithCancel(ctx)
	e, err := cs.c.Attach(ctx, cs.id, execID, opts.SinceSeq, out.options()...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &CommandHandle{ExecID: execID, cs: cs, e: e, out: out, cancel: cancel}, nil
}

// List lists the sandbox's commands (running and retained exited ones).
func (cs *Commands) List(ctx context.Context) ([]*berthv1.ExecInfo, error) {
	resp, err := cs.c.ListExecs(ctx, cs.id)
	return resp.GetExecs(), err
}

// Kill sends the command execID's process group signal (default
// SIGKILL; "TERM" or "SIGTERM" style names); false when it had ended.
func (cs *Commands) Kill(ctx context.Context, execID string, signal ...string) (bool, error) {
	st, err := cs.c.SignalExec(ctx, cs.id, execID, signalName(signal))
	return st == berthv1.ExecState_EXEC_STATE_RUNNING, err
}

// CommandHandle is a running command followed by a stream: the Python
// SDK's CommandHandle.
type CommandHandle struct {
	ExecID string
	cs     *Commands
	e      *Execution
	out    *output
	cancel context.CancelFunc // nil for Run's own stream
}

// Wait waits for the command to end and returns its result. A stream that
// breaks returns its error; the command keeps running (Connect again with
// SinceSeq: LastSeq()).
func (h *CommandHandle) Wait() (*CommandResult, error) {
	res, err := h.e.Wait()
	if h.cancel != nil {
		h.cancel() // the stream has ended
	}
	if err != nil {
		return nil, err
	}
	return h.out.result(h.ExecID, res, h.e.Dropped()), nil
}

// Kill sends the command's process group signal (default SIGKILL).
func (h *CommandHandle) Kill(ctx context.Context, signal ...string) error {
	_, err := h.cs.Kill(ctx, h.ExecID, signal...)
	return err
}

func signalName(signal []string) string {
	if len(signal) > 0 && signal[0] != "" {
		return signal[0]
	}
	return "SIGKILL"
}

// SendStdin writes p to the command's stdin (StdinOpen or Stdin given).
func (h *CommandHandle) SendStdin(p []byte) error {
	_, err := h.e.Stdin().Write(p)
	return err
}

// CloseStdin closes the command's stdin: it reads end of file.
func (h *CommandHandle) CloseStdin() error { return h.e.Stdin().Close() }

// Disconnect ends the stream and leaves the command running, to be
// followed again with Commands.Connect.
func (h *CommandHandle) Disconnect() {
	if h.cancel != nil {
		h.cancel()
	}
}

// LastSeq is the sequence number of the last event received: the SinceSeq
// that replays what came after.
func (h *CommandHandle) LastSeq() uint64 { return h.e.LastSeq() }

func (h *CommandHandle) feed(stdin io.Reader) {
	if stdin == nil {
		return
	}
	go func() {
		if _, err := io.Copy(h.e.Stdin(), stdin); err == nil {
			_ = h.e.Stdin().Close()
		}
	}()
}

func (opts RunOptions) spec(spec *berthv1.ProcessSpec) *berthv1.ProcessSpec {
	spec.Cwd, spec.Env, spec.User = opts.Cwd, opts.Env, opts.User
	spec.Stdin = opts.Stdin != nil || opts.StdinOpen
	if opts.Timeout > 0 {
		spec.Timeout = durationpb.New(opts.Timeout)
	}
	return spec
}

// output collects a command's output for its result and its callbacks.
type output struct {
	mu             sync.Mutex
	capture        bool
	stdout, stderr bytes.Buffer
	opts           RunOptions
}

func newOutput(opts RunOptions) *output { return &output{capture: !opts.NoCapture, opts: opts} }

func (o *output) options() []ExecOption {
	opts := []ExecOption{WithStdout(streamWriter{o, &o.stdout, o.opts.OnStdout}), WithStderr(streamWriter{o, &o.stderr, o.opts.OnStderr})}
	if o.opts.ExecID != "" {
		opts = append(opts, WithExecID(o.opts.ExecID))
	}
	return opts
}

type streamWriter struct {
	o   *output
	buf *bytes.Buffer
	fn  func([]byte)
}

func (w streamWriter) Write(p []byte) (int, error) {
	if w.fn != nil {
		w.fn(p)
	}
	if w.o.capture {
		w.o.mu.Lock()
		w.buf.Write(p)
		w.o.mu.Unlock()
	}
	return len(p), nil
}

func (o *output) result(execID string, res *berthv1.ExecResult, dropped []*berthv1.ExecDropped) *CommandResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := &CommandResult{
		ExecID: execID, ExitCode: -1, Signal: res.GetSignal(), TimedOut: res.GetTimedOut(), OOMKilled: res.GetOomKilled(),
		Stdout: bytes.Clone(o.stdout.Bytes()), Stderr: bytes.Clone(o.stderr.Bytes()),
		StdoutBytes: res.GetStdoutBytes(), StderrBytes: res.GetStderrBytes(), Duration: res.GetDuration().AsDuration(),
	}
	if res.ExitCode != nil {
		r.ExitCode = int(res.GetExitCode())
	}
	for _, d := range dropped {
		r.DroppedBytes += d.GetLostBytes()
	}
	return r
}
