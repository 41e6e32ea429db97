package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
)

// reach returns a client for the agent of a running sandbox and the runtime
// it belongs to, once the agent has answered an Info call. Before anything
// is sent to the agent it makes sure someone answers: it fails with
// ErrSandboxNotFound, or with an *unreachableError (nothing ran) when the
// sandbox's task is not running (TASK_STOPPED), the agent's socket is
// missing (SOCKET_MISSING), or the agent did not connect and answer within
// Config.ConnectBudget (CONNECT_TIMEOUT: stopped, hung or overloaded).
// execID, which may be empty, only goes into the error. A sandbox the
// caller of ctx may not see (auth.Sees) is ErrSandboxNotFound, worded as
// for a missing one, decided before anything reaches its agent.
//
// When berthd knows the sandbox's runtime and containerd has not reported
// its task gone, the agent answering with that runtime's boot id proves the
// task runs (the agent is its PID 1), and containerd is not asked: that
// saves a third of an exec's latency (BenchmarkTaskState). Otherwise, and
// whenever the agent does not answer, containerd's record decides.
func (s *Service) reach(ctx context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, identity, error) {
	began := time.Now()
	last, known := s.ids.live(sandboxID)
	var (
		sb      runtime.Sandbox
		checked bool // sb holds containerd's record
	)
	check := func() error {
		var err error
		sb, err = s.rt.Get(ctx, sandboxID)
		if err != nil {
			return err
		}
		if !auth.Sees(ctx, sb.Owner) {
			return sandboxNotFound(sandboxID)
		}
		checked = true
		unreachable := func(cause berthv1.UnreachableCause, what string) error {
			return &unreachableError{sandboxID: sandboxID, execID: execID, cause: cause, taskRunning: sb.Running,
				runtime: last, waited: time.Since(began), admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, what: what}
		}
		if !sb.Running {
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED, "the sandbox's task is not running")
		}
		switch err := agentconn.CheckSocket(sb.SocketPath); {
		case errors.Is(err, fs.ErrNotExist):
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING,
				"the agent's socket does not exist: the agent has not started listening")
		case errors.Is(err, agentconn.ErrNotSocket):
			// Something in the sandbox replaced it: berthd never follows it.
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING,
				"the agent's socket was replaced by something that is not a socket (berthd does not follow symlinks there)")
		}
		return nil
	}
	// The owner berthd verified for the live runtime spares containerd;
	// without one, containerd's record decides before the agent is asked.
	owner, ownerKnown := s.ids.ownerOf(sandboxID, last.BootID)
	if known && ownerKnown && !auth.Sees(ctx, owner) {
		return nil, identity{}, sandboxNotFound(sandboxID)
	}
	if !known || !ownerKnown {
		if err := check(); err != nil {
			return nil, identity{}, err
		}
	}
	agent, err := s.agents.Get(s.rt.SocketPath(sandboxID))
	if err != nil {
		return nil, identity{}, err
	}
	infoCtx, cancel := context.WithTimeout(ctx, s.cfg.ConnectBudget)
	info, err := agent.Info(infoCtx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, identity{}, ctx.Err()
		}
		if !checked {
			if err := check(); err != nil {
				return nil, identity{}, err
			}
		}
		return nil, identity{}, &unreachableError{sandboxID: sandboxID, execID: execID, cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT,
			taskRunning: sb.Running, runtime: last, waited: time.Since(began), admitted: berthv1.Admitted_ADMITTED_NOT_STARTED,
			what: fmt.Sprintf("the agent did not answer within the connect budget of %v (%v)", s.cfg.ConnectBudget, grpcMessage(err))}
	}
	if known && info.GetBootId() == last.BootID {
		if checked {
			s.ids.setOwner(sandboxID, last.BootID, sb.Owner)
		}
		return agent, last, nil
	}
	if !checked {
		// A runtime berthd has not seen: containerd names its task.
		if err := check(); err != nil {
			return nil, identity{}, err
		}
	}
	id := identity{BootID: info.GetBootId(), TaskPID: sb.TaskPID, AgentVersion: info.GetVersion()}
	if last.TaskPID == id.TaskPID && last.BootID == id.BootID && !last.StartedAt.IsZero() {
		id.StartedAt = last.StartedAt
	} else {
		id.StartedAt, _ = procStartTime(id.TaskPID)
	}
	s.ids.observe(sandboxID, id)
	s.ids.setOwner(sandboxID, id.BootID, sb.Owner)
	return agent, id, nil
}
