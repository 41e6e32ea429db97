package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// WriteStdin writes req.data to the stdin of exec req.exec_id from
// req.offset on, then closes it when req.close_stdin is set. The bytes
// the exec's stdin has taken already (ExecStdin of its streams included)
// are dropped, so a chunk sent again is never written twice; it answers
// with the count of bytes taken, once the rest is written (a process that
// does not read makes it wait, as ExecStdin does). Errors: INVALID_ARGUMENT
// for an exec without stdin (closing one is allowed: it reads /dev/null),
// FAILED_PRECONDITION STDIN_OFFSET_GAP (metadata "expected_offset") for an
// offset beyond the count, NOT_FOUND EXEC_NOT_FOUND.
func (s *Server) WriteStdin(_ context.Context, req *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	s.activity.touch()
	e, err := s.execOf(req.GetExecId())
	if err != nil {
		return nil, err
	}
	if !e.hasStdin {
		if len(req.GetData()) > 0 {
			return nil, rpcstatus.InvalidArgument("data", fmt.Sprintf("exec %q was started without stdin (process.stdin is false)", e.id))
		}
		return &agentv1.WriteStdinResponse{}, nil
	}
	next, err := e.writeStdinAt(req.GetOffset(), req.GetData())
	if gap := (*stdinGapError)(nil); errors.As(err, &gap) {
		return nil, rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonStdinOffsetGap, fmt.Sprintf("exec %q: %v", e.id, err),
			map[string]string{"exec_id": e.id, "expected_offset": strconv.FormatUint(gap.expected, 10)})
	}
	if req.GetCloseStdin() {
		e.closeStdin()
	}
	return &agentv1.WriteStdinResponse{NextOffset: next}, nil
}

// ResizeExec sets the terminal size of tty exec req.exec_id. Errors:
// INVALID_ARGUMENT for an exec without a tty or a size outside 1-65535,
// NOT_FOUND EXEC_NOT_FOUND.
func (s *Server) ResizeExec(_ context.Context, req *agentv1.ResizeExecRequest) (*agentv1.ResizeExecResponse, error) {
	s.activity.touch()
	e, err := s.execOf(req.GetExecId())
	if err != nil {
		return nil, err
	}
	if !e.hasTTY {
		return nil, rpcstatus.InvalidArgument("exec_id", fmt.Sprintf("exec %q was started without a terminal (process.tty is unset)", e.id))
	}
	if err := e.applyResize("size", req.GetSize()); err != nil {
		return nil, err
	}
	return &agentv1.ResizeExecResponse{}, nil
}

// execOf returns the exec named id, or INVALID_ARGUMENT for an empty id and
// NOT_FOUND EXEC_NOT_FOUND for an unknown one.
func (s *Server) execOf(id string) (*execution, error) {
	if id == "" {
		return nil, rpcstatus.InvalidArgument("exec_id", "is empty")
	}
	e := s.lookup(id)
	if e == nil {
		return nil, s.execNotFound(id)
	}
	return e, nil
}
