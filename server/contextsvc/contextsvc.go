// Package contextsvc is berth.v1.SandboxService's code-context RPCs —
// CreateCodeContext, ListCodeContexts, DeleteCodeContext, ExecuteCode,
// InterruptCodeContext, RestartCodeContext (docs/contexts.md). A context is
// a background exec of the sandbox's agent running python3 with a small
// driver (driver.py, passed as `python3 -c SOURCE`: nothing is written
// into the sandbox). A cell goes to the driver's stdin as one JSON line;
// the driver answers on its stdout in JSON lines, each cell's own output
// being data inside them. The agent owns the exec, so a context survives
// berthd restarts, is listed by ListExecs, and follows the sandbox's
// ownership; berthd keeps no state but a lock per context.
package contextsvc

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// driver is the Python program a context's interpreter runs.
//
//go:embed driver.py
var driver string

const (
	// execPrefix starts the exec id of every context's interpreter:
	// "ctx." + context id + "." + generation.
	execPrefix = "ctx."
	// maxContextID bounds a context id so that its exec id fits 128.
	maxContextID = 100
	// maxCode bounds a cell's source, in bytes.
	maxCode = 1 << 20
	// specChunk is the size of the argv elements that carry a context's
	// spec: ListExecs lists at most 16 elements of at most 256 bytes, and
	// a restart reads the spec back from there.
	specChunk = 256
	// maxSpecChunks is what is left of 16 after python3 -c SOURCE.
	maxSpecChunks = 13
	// defaultTimeout and maxTimeout bound a cell's run time.
	defaultTimeout = 30 * time.Minute
	maxTimeout     = 24 * time.Hour
	// interruptGrace is how long a timed-out cell has to end after its
	// KeyboardInterrupt before it is interrupted again.
	interruptGrace = 5 * time.Second
	// maxFrameBytes bounds the driver frame (one JSON line) berthd holds
	// while it waits for the line's end: a result's PNG or repr fits. A
	// cell reaches the driver's descriptor (the driver is its own
	// process), so it can write there without a newline; past the bound
	// the cell fails rather than grow berthd's memory.
	maxFrameBytes = 16 << 20
)

var contextIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

// reacher reaches the agent of a sandbox the caller may see
// (*agentreach.Reacher): NOT_FOUND SANDBOX_NOT_FOUND for another
// principal's sandbox.
type reacher interface {
	Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error)
}

// Service implements the code-context RPCs of berth.v1.SandboxService.
type Service struct {
	reach reacher

	mu    sync.Mutex
	locks map[string]chan struct{} // by sandbox id + "/" + context id: one cell at a time
}

// New returns the code-context RPCs over reach.
func New(reach reacher) *Service {
	return &Service{reach: reach, locks: map[string]chan struct{}{}}
}

// lock serializes the calls that write to one context's interpreter (a
// cell waits for the one before it) and returns the unlock, or ctx's error.
func (s *Service) lock(ctx context.Context, sandboxID, contextID string) (func(), error) {
	s.mu.Lock()
	key := sandboxID + "/" + contextID
	l := s.locks[key]
	if l == nil {
		l = make(chan struct{}, 1)
		s.locks[key] = l
	}
	s.mu.Unlock()
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// spec is what a context's interpreter is started with, kept in its argv.
type spec struct {
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
}

// argv is the interpreter's command line: python3 -c driver, then sp as
// base64 JSON in pieces that ListExecs lists whole.
func (sp spec) argv() ([]string, error) {
	js, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	enc := base64.RawStdEncoding.EncodeToString(js)
	argv := []string{"python3", "-c", driver}
	for len(enc) > 0 {
		n := min(len(enc), specChunk)
		argv, enc = append(argv, enc[:n]), enc[n:]
	}
	if len(argv)-3 > maxSpecChunks {
		return nil, apierr.InvalidArgument("env", fmt.Sprintf("cwd, user and env take %d bytes as JSON; a context keeps them for restarts in at most %d", len(js), maxSpecChunks*specChunk*3/4))
	}
	return argv, nil
}

// specOf reads the spec back from a listed interpreter's argv.
func specOf(argv []string) (spec, error) {
	var sp spec
	if len(argv) < 3 {
		return sp, fmt.Errorf("argv has %d elements", len(argv))
	}
	js, err := base64.RawStdEncoding.DecodeString(strings.Join(argv[3:], ""))
	if err != nil {
		return sp, err
	}
	return sp, json.Unmarshal(js, &sp)
}

// interp is one interpreter of a context, as ListExecs lists it.
type interp struct {
	contextID string
	gen       int
	info      *berthv1.ExecInfo
	// next is the generation the context's next interpreter takes: one
	// past every exec of the context the agent lists, started or not.
	next int
}

func (in *interp) running() bool {
	return in.info.GetState() == berthv1.ExecState_EXEC_STATE_RUNNING
}

func (in *interp) proto() *berthv1.CodeContextInfo {
	return &berthv1.CodeContextInfo{ContextId: in.contextID, Language: "python", ExecId: in.info.GetExecId(),
		Pid: in.info.GetPid(), StartedAt: in.info.GetStartedAt()}
}

// parseExecID splits "ctx.<id>.<generation>".
func parseExecID(execID string) (string, int, bool) {
	rest, ok := strings.CutPrefix(execID, execPrefix)
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", 0, false
	}
	gen, err := strconv.Atoi(rest[i+1:])
	if err != nil || gen < 1 || !contextIDPattern.MatchString(rest[:i]) {
		return "", 0, false
	}
	return rest[:i], gen, true
}

// latest lists the newest interpreter that started (a pid) of every
// context the agent knows. An exec whose interpreter never started (no
// python3: CreateCodeContext or RestartCodeContext answered
// INTERPRETER_MISSING) is no interpreter: a context with nothing else has
// info nil and is not found, one restarted in vain keeps its last
// interpreter (ended). Either way next counts it.
func latest(ctx context.Context, agent agentv1.AgentServiceClient) (map[string]*interp, error) {
	resp, err := agent.ListExecs(ctx, &agentv1.ListExecsRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]*interp{}
	for _, e := range resp.GetExecs() {
		id, gen, ok := parseExecID(e.GetExecId())
		if !ok {
			continue
		}
		cur := out[id]
		if cur == nil {
			cur = &interp{contextID: id}
			out[id] = cur
		}
		cur.next = max(cur.next, gen+1)
		if e.GetPid() != 0 && (cur.info == nil || cur.gen < gen) {
			cur.gen, cur.info = gen, e
		}
	}
	return out, nil
}

func contextNotFound(id string) error {
	return apierr.New(codes.NotFound, rpcstatus.ReasonContextNotFound, fmt.Sprintf("code context %q not found", id), map[string]string{"context_id": id})
}

// agent validates sandboxID and reaches its agent.
func (s *Service) agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, map[string]string, error) {
	meta := map[string]string{"sandbox_id": sandboxID}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return nil, meta, err
	}
	agent, err := s.reach.Agent(ctx, sandboxID)
	if err != nil {
		return nil, meta, apierr.WithMeta(err, meta)
	}
	return agent, meta, nil
}

// find reaches the sandbox's agent and the newest interpreter of
// contextID (NOT_FOUND CONTEXT_NOT_FOUND when there is none).
func (s *Service) find(ctx context.Context, sandboxID, contextID string) (agentv1.AgentServiceClient, *interp, map[string]string, error) {
	if err := checkContextID(contextID); err != nil {
		return nil, nil, nil, err
	}
	agent, meta, err := s.agent(ctx, sandboxID)
	if err != nil {
		return nil, nil, meta, err
	}
	meta["context_id"] = contextID
	all, err := latest(ctx, agent)
	if err != nil {
		return nil, nil, meta, apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
	}
	in := all[contextID]
	if in == nil || in.info == nil {
		return nil, nil, meta, apierr.WithMeta(contextNotFound(contextID), meta)
	}
	return agent, in, meta, nil
}

func checkContextID(id string) error {
	if !contextIDPattern.MatchString(id) {
		return apierr.InvalidArgument("context_id", fmt.Sprintf("%q must be 1 to %d characters from [A-Za-z0-9_-]", id, maxContextID))
	}
	return nil
}

// start starts generation gen of contextID's interpreter as a background
// exec with a stdin pipe. FAILED_PRECONDITION INTERPRETER_MISSING when the
// image has no python3.
func start(ctx context.Context, agent agentv1.AgentServiceClient, contextID string, gen int, sp spec) (*interp, error) {
	argv, err := sp.argv()
	if err != nil {
		return nil, err
	}
	execID := execPrefix + contextID + "." + strconv.Itoa(gen)
	stream, err := agent.Exec(ctx)
	if err != nil {
		return nil, err
	}
	defer stream.CloseSend()
	err = stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: execID,
		Process:    &berthv1.ProcessSpec{Argv: argv, Cwd: sp.Cwd, Env: sp.Env, User: sp.User, Stdin: true},
		Background: true, DetachedOutput: berthv1.DetachedOutput_DETACHED_OUTPUT_DROP_OLDEST}}})
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if st := resp.GetStarted(); st != nil {
			if st.GetPid() == 0 {
				return nil, apierr.New(codes.FailedPrecondition, rpcstatus.ReasonInterpreterMissing,
					fmt.Sprintf("code context %s: the image has no python3 in PATH (a Python context needs python3)", contextID),
					map[string]string{"context_id": contextID, "language": "python"})
			}
			all, err := latest(ctx, agent)
			if err != nil {
				return nil, err
			}
			if in := all[contextID]; in != nil && in.gen == gen {
				return in, nil
			}
			return nil, fmt.Errorf("exec %s started but is not listed", execID)
		}
	}
}

// CreateCodeContext starts a Python interpreter in the sandbox, minting
// the context id ("cx-" + 12 characters) when the request has none.
func (s *Service) CreateCodeContext(ctx context.Context, req *berthv1.CreateCodeContextRequest) (*berthv1.CreateCodeContextResponse, error) {
	id := req.GetContextId()
	if id == "" {
		id = sandboxid.New("cx-", 12)
	} else if err := checkContextID(id); err != nil {
		return nil, err
	}
	if l := req.GetLanguage(); l != "" && l != "python" {
		return nil, apierr.InvalidArgument("language", fmt.Sprintf("%q is not a supported language; want \"python\"", l))
	}
	agent, meta, err := s.agent(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	meta["context_id"] = id
	unlock, err := s.lock(ctx, req.GetSandboxId(), id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	all, err := latest(ctx, agent)
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	gen := 1
	if in := all[id]; in != nil {
		if in.running() {
			return nil, apierr.New(codes.AlreadyExists, rpcstatus.ReasonContextExists, fmt.Sprintf("code context %q exists", id), meta)
		}
		gen = in.next
	}
	in, err := start(ctx, agent, id, gen, spec{Cwd: req.GetCwd(), User: req.GetUser(), Env: req.GetEnv()})
	if err != nil {
		// The agent checks cwd, env and user as its exec's process.cwd,
		// process.env and process.user: they are this request's fields.
		err = rpcstatus.RenameField(err, "process.", "")
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.CreateCodeContextResponse{Context: in.proto()}, nil
}

// ListCodeContexts lists the contexts whose interpreter runs, ordered by
// its start time.
func (s *Service) ListCodeContexts(ctx context.Context, req *berthv1.ListCodeContextsRequest) (*berthv1.ListCodeContextsResponse, error) {
	agent, meta, err := s.agent(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	all, err := latest(ctx, agent)
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	var out []*berthv1.CodeContextInfo
	for _, in := range all {
		if in.running() {
			out = append(out, in.proto())
		}
	}
	slices.SortFunc(out, func(a, b *berthv1.CodeContextInfo) int {
		return a.GetStartedAt().AsTime().Compare(b.GetStartedAt().AsTime())
	})
	return &berthv1.ListCodeContextsResponse{Contexts: out}, nil
}

// DeleteCodeContext kills a context's interpreter (SIGKILL to its process
// group).
func (s *Service) DeleteCodeContext(ctx context.Context, req *berthv1.DeleteCodeContextRequest) (*berthv1.DeleteCodeContextResponse, error) {
	agent, in, meta, err := s.find(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return nil, err
	}
	if !in.running() {
		return nil, apierr.WithMeta(contextNotFound(in.contextID), meta)
	}
	if err := killRunning(ctx, agent, in); err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.DeleteCodeContextResponse{}, nil
}

// InterruptCodeContext sends SIGINT to the interpreter: KeyboardInterrupt
// in the running cell.
func (s *Service) InterruptCodeContext(ctx context.Context, req *berthv1.InterruptCodeContextRequest) (*berthv1.InterruptCodeContextResponse, error) {
	agent, in, meta, err := s.find(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return nil, err
	}
	if !in.running() {
		return nil, apierr.WithMeta(contextEnded(in), meta)
	}
	if _, err := agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: in.info.GetExecId(), Signal: "INT"}); err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.InterruptCodeContextResponse{}, nil
}

// killRunning sends SIGKILL to the interpreter's process group when it
// runs.
func killRunning(ctx context.Context, agent agentv1.AgentServiceClient, in *interp) error {
	if !in.running() {
		return nil
	}
	_, err := agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: in.info.GetExecId(), Signal: "KILL"})
	return err
}

func contextEnded(in *interp) error {
	return apierr.New(codes.FailedPrecondition, rpcstatus.ReasonContextEnded,
		fmt.Sprintf("code context %q: its interpreter ended (exit code %d); RestartCodeContext starts a new one", in.contextID, in.info.GetResult().GetExitCode()),
		map[string]string{"context_id": in.contextID, "exec_id": in.info.GetExecId()})
}

// RestartCodeContext kills the context's interpreter, if it runs, and
// starts a fresh one with the same cwd, user and env.
func (s *Service) RestartCodeContext(ctx context.Context, req *berthv1.RestartCodeContextRequest) (*berthv1.RestartCodeContextResponse, error) {
	if err := checkContextID(req.GetContextId()); err != nil {
		return nil, err
	}
	// Kill the interpreter first: a running cell's ExecuteCode holds the
	// lock, and ends (CONTEXT_ENDED) with its interpreter.
	agent, in, meta, err := s.find(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return nil, err
	}
	if err := killRunning(ctx, agent, in); err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	unlock, err := s.lock(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	agent, in, meta, err = s.find(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return nil, err
	}
	sp, err := specOf(in.info.GetArgv())
	if err != nil {
		return nil, apierr.WithMeta(fmt.Errorf("code context %s: read its spec from exec %s: %w", in.contextID, in.info.GetExecId(), err), meta)
	}
	// Still listed as running: not reaped yet, or another restart raced
	// this one.
	if err := killRunning(ctx, agent, in); err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	next, err := start(ctx, agent, in.contextID, in.next, sp)
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.RestartCodeContextResponse{Context: next.proto()}, nil
}

// frame is one JSON line of the driver (driver.py).
type frame struct {
	Cell      *string           `json:"cell"`
	Type      string            `json:"type"`
	Text      string            `json:"text"`
	Data      map[string]string `json:"data"`
	Main      bool              `json:"main"`
	Name      string            `json:"name"`
	Value     string            `json:"value"`
	Traceback []string          `json:"traceback"`
}

// binaryMIME are the MIME types the driver sends as base64.
var binaryMIME = map[string]bool{"image/png": true, "image/jpeg": true}

// ExecuteCode runs one cell in the context and streams its events. At the
// cell's timeout the interpreter gets SIGINT (KeyboardInterrupt), again
// every interruptGrace until the cell ends.
func (s *Service) ExecuteCode(req *berthv1.ExecuteCodeRequest, out berthv1.SandboxService_ExecuteCodeServer) error {
	ctx := out.Context()
	if len(req.GetCode()) > maxCode {
		return apierr.InvalidArgument("code", fmt.Sprintf("is %d bytes; at most %d", len(req.GetCode()), maxCode))
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = req.GetTimeout().AsDuration()
		if timeout < time.Second || timeout > maxTimeout {
			return apierr.InvalidArgument("timeout", fmt.Sprintf("%v is outside 1s to %v", timeout, maxTimeout))
		}
	}
	if err := checkContextID(req.GetContextId()); err != nil {
		return err
	}
	unlock, err := s.lock(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return err
	}
	defer unlock()
	agent, in, meta, err := s.find(ctx, req.GetSandboxId(), req.GetContextId())
	if err != nil {
		return err
	}
	if !in.running() {
		return apierr.WithMeta(contextEnded(in), meta)
	}
	agentErr := func(err error) error { return apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta) }
	execID := in.info.GetExecId()
	// Follow the interpreter's output from now on, then send the cell.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := agent.Exec(ctx)
	if err != nil {
		return agentErr(err)
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Attach{Attach: &agentv1.ExecAttach{ExecId: execID, SinceSeq: in.info.GetLastSeq()}}}); err != nil {
		return agentErr(err)
	}
	cell := sandboxid.New("cell-", 12)
	line, err := json.Marshal(map[string]string{"cell": cell, "code": req.GetCode()})
	if err != nil {
		return err
	}
	taken, err := agent.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: execID})
	if err != nil {
		return agentErr(err)
	}
	started := time.Now()
	if _, err := agent.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: execID, Offset: taken.GetNextOffset(), Data: append(line, '\n')}); err != nil {
		return agentErr(err)
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(timeout, func() {
		timedOut.Store(true)
		for {
			if _, err := agent.SignalExec(ctx, &agentv1.SignalExecRequest{ExecId: execID, Signal: "INT"}); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interruptGrace):
			}
		}
	})
	defer timer.Stop()
	var buf []byte
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return agentErr(fmt.Errorf("the interpreter's output stream ended before the cell did"))
		}
		if err != nil {
			return agentErr(err)
		}
		if ex := resp.GetExited(); ex != nil {
			return apierr.WithMeta(apierr.New(codes.FailedPrecondition, rpcstatus.ReasonContextEnded,
				fmt.Sprintf("code context %q: its interpreter ended during the cell (exit code %d, signal %q); RestartCodeContext starts a new one",
					in.contextID, ex.GetResult().GetExitCode(), ex.GetResult().GetSignal()), nil), meta)
		}
		o := resp.GetOutput()
		if o == nil || o.GetStream() != berthv1.Stream_STREAM_STDOUT {
			continue
		}
		buf = append(buf, o.GetData()...)
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			var f frame
			err := json.Unmarshal(buf[:i], &f)
			buf = buf[i+1:]
			if err != nil || f.Cell == nil || *f.Cell != cell {
				continue // another cell's, or the tail of a line before this cell
			}
			ev, done := f.event()
			if done {
				ev = &berthv1.ExecuteCodeResponse{Event: &berthv1.ExecuteCodeResponse_Done{Done: &berthv1.CodeDone{
					Duration: durationpb.New(time.Since(started)), TimedOut: timedOut.Load()}}}
			}
			if ev != nil {
				if err := out.Send(ev); err != nil {
					return err
				}
			}
			if done {
				return nil
			}
		}
		if len(buf) > maxFrameBytes {
			return apierr.WithMeta(apierr.New(codes.ResourceExhausted, rpcstatus.ReasonCellFrameTooLarge,
				fmt.Sprintf("code context %q: the interpreter wrote a line of over %d bytes on its protocol descriptor (a result that large, or a cell writing there itself); the cell is abandoned, RestartCodeContext starts a new interpreter",
					in.contextID, maxFrameBytes), nil), meta)
		}
	}
}

// event converts a driver frame; done is true for the cell's end.
func (f *frame) event() (ev *berthv1.ExecuteCodeResponse, done bool) {
	switch f.Type {
	case "stdout":
		return &berthv1.ExecuteCodeResponse{Event: &berthv1.ExecuteCodeResponse_Stdout{Stdout: f.Text}}, false
	case "stderr":
		return &berthv1.ExecuteCodeResponse{Event: &berthv1.ExecuteCodeResponse_Stderr{Stderr: f.Text}}, false
	case "result":
		data := make(map[string][]byte, len(f.Data))
		for mime, v := range f.Data {
			if binaryMIME[mime] {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					continue
				}
				data[mime] = b
				continue
			}
			data[mime] = []byte(v)
		}
		return &berthv1.ExecuteCodeResponse{Event: &berthv1.ExecuteCodeResponse_Result{Result: &berthv1.CodeResult{Data: data, IsMainResult: f.Main}}}, false
	case "error":
		return &berthv1.ExecuteCodeResponse{Event: &berthv1.ExecuteCodeResponse_Error{Error: &berthv1.CodeError{Name: f.Name, Value: f.Value, Traceback: f.Traceback}}}, false
	case "done":
		return nil, true
	}
	return nil, false
}
