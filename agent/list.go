package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Bounds of the argv summary in ExecInfo (berth.v1.ExecInfo.argv).
const (
	listArgs     = 16
	listArgBytes = 256
)

// listBytes bounds the encoded ExecInfos of one ListExecs response: below
// gRPC's default 4 MiB message limit of the public client, with room for
// framing.
const listBytes = 3 << 20

// ListExecs lists the running execs and the finished ones still retained,
// ordered by start time (then id). When their encoded size exceeds
// listBytes, the oldest are left out and counted in omitted: an ExecInfo
// holds up to 4 KiB of argv, and thousands of execs may be retained.
func (s *Server) ListExecs(context.Context, *agentv1.ListExecsRequest) (*agentv1.ListExecsResponse, error) {
	s.mu.Lock()
	execs := make([]*execution, 0, len(s.execs))
	for _, e := range s.execs {
		if !e.isLaunched() {
			continue // its start is not done yet
		}
		execs = append(execs, e)
	}
	s.mu.Unlock()
	slices.SortFunc(execs, func(a, b *execution) int {
		if c := a.startedAt.Compare(b.startedAt); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	// Newest first within the budget, then back to start-time order.
	infos := make([]*berthv1.ExecInfo, 0, len(execs))
	size := 0
	for i := len(execs) - 1; i >= 0; i-- {
		in := execs[i].info()
		// Field tag, length prefix and message, as repeated field 1 encodes.
		n := proto.Size(in)
		size += 1 + protowire.SizeVarint(uint64(n)) + n
		if size > listBytes {
			break
		}
		infos = append(infos, in)
	}
	slices.Reverse(infos)
	return &agentv1.ListExecsResponse{Execs: infos, Omitted: uint32(len(execs) - len(infos))}, nil
}

// SignalExec sends a signal to an exec's process group, as a signal message
// on an Exec stream does. An exec that finished gets nothing and the answer
// says EXEC_STATE_EXITED. Errors: INVALID_ARGUMENT for an empty exec id or
// a bad signal, NOT_FOUND EXEC_NOT_FOUND for an unknown exec.
func (s *Server) SignalExec(_ context.Context, req *agentv1.SignalExecRequest) (*agentv1.SignalExecResponse, error) {
	id := req.GetExecId()
	if id == "" {
		return nil, rpcstatus.InvalidArgument("exec_id", "is empty")
	}
	sig, err := parseSignalField("signal", req.GetSignal())
	if err != nil {
		return nil, err
	}
	e, err := s.execOf(id)
	if err != nil {
		return nil, err
	}
	// running and signal each take e.mu; an exec that finishes in between
	// gets nothing from signal, which is what EXITED would say, and the
	// answer says RUNNING: the signal was sent as long as it could be.
	state := berthv1.ExecState_EXEC_STATE_EXITED
	if e.running() {
		state = berthv1.ExecState_EXEC_STATE_RUNNING
		if err := e.signal(sig); err != nil {
			return nil, rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, err.Error(), map[string]string{"exec_id": id})
		}
	}
	return &agentv1.SignalExecResponse{State: state}, nil
}

// execNotFound is the NOT_FOUND status for an exec id the agent does not
// know.
func (s *Server) execNotFound(id string) error {
	return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound,
		fmt.Sprintf("exec %q not found: never started in this agent, or finished more than %v ago", id, s.cfg.Retention),
		map[string]string{"exec_id": id})
}

// info describes e for ListExecs.
func (e *execution) info() *berthv1.ExecInfo {
	argv, cut := summarizeArgv(e.argv)
	in := &berthv1.ExecInfo{
		ExecId:        e.id,
		Argv:          argv,
		ArgvTruncated: cut,
		StartedAt:     timestamppb.New(e.startedAt),
		Tty:           e.hasTTY,
		Stdin:         e.hasStdin,
		LastSeq:       e.log.LastSeq(),
		State:         berthv1.ExecState_EXEC_STATE_RUNNING,
	}
	e.mu.Lock()
	// started is set before the exec is published, so it is there already.
	in.Pid = e.started.GetStarted().GetPid()
	in.Timeout = e.started.GetStarted().GetTimeout()
	if e.finished {
		in.State = berthv1.ExecState_EXEC_STATE_EXITED
		in.Result = e.exited.GetExited().GetResult()
	}
	e.mu.Unlock()
	return in
}

// summarizeArgv returns at most listArgs elements of argv, each cut to at
// most listArgBytes bytes at a UTF-8 character boundary (the elements are
// valid UTF-8: they arrived as protobuf strings), and whether anything was
// cut.
func summarizeArgv(argv []string) ([]string, bool) {
	cut := len(argv) > listArgs
	out := make([]string, 0, min(len(argv), listArgs))
	for _, a := range argv[:min(len(argv), listArgs)] {
		if len(a) > listArgBytes {
			n := listArgBytes
			for n > 0 && !utf8.RuneStart(a[n]) {
				n--
			}
			a, cut = a[:n], true
		}
		out = append(out, a)
	}
	return out, cut
}
