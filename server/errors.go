package server

import (
	"context"
	"errors"
	"log/slog"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errAgentUnreachable means the sandbox's agent did not answer or its task
// does not run; nothing was started.
var errAgentUnreachable = errors.New("sandbox agent unreachable")

// toStatus converts err to the gRPC status returned to the caller. It is the
// one place where domain errors become codes: statuses that already carry a
// berth ErrorInfo (built by a handler or by the agent) pass unchanged, and
// anything unclassified becomes INTERNAL with its cause logged, never passed
// through. meta names what the request was about, e.g. the sandbox id.
func (s *Service) toStatus(ctx context.Context, err error, meta map[string]string) error {
	if err == nil {
		return nil
	}
	if rpcstatus.Reason(err) != "" {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, msg, meta)
	case errors.Is(err, runtime.ErrSandboxExists):
		return rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSandboxExists, msg, meta)
	case errors.Is(err, runtime.ErrImageNotFound):
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonImageNotFound, msg, meta)
	case errors.Is(err, runtime.ErrImageArchive):
		return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonImageArchive, msg, meta)
	case errors.Is(err, errAgentUnreachable):
		return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, msg, meta)
	case errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled:
		return status.Error(codes.Canceled, "request canceled: "+msg)
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return rpcstatus.Error(codes.DeadlineExceeded, "DEADLINE_EXCEEDED", "deadline exceeded: "+msg, meta)
	}
	s.log.ErrorContext(ctx, "internal error", slog.Any("error", err), slog.Any("meta", meta))
	return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, "internal error; the server log has the cause", meta)
}
