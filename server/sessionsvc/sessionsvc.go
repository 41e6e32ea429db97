// Package sessionsvc is berth.v1.SandboxService's shell-session RPCs —
// CreateSession, ListSessions, DeleteSession — one file's worth: it
// checks the request, names the session, records its owner and asks the
// sandbox's agent, which owns every session (docs/sessions.md). Commands
// run in a session through Exec and Run (process.session_id), served by
// execsvc unchanged.
package sessionsvc

import (
	"context"
	"fmt"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/validate"
)

// reacher reaches the agent of a sandbox the caller may see
// (*agentreach.Reacher): NOT_FOUND SANDBOX_NOT_FOUND for another
// principal's sandbox.
type reacher interface {
	Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error)
}

// Service implements the session RPCs of berth.v1.SandboxService.
type Service struct {
	reach reacher
}

// New returns the session RPCs over reach.
func New(reach reacher) *Service { return &Service{reach: reach} }

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

// CreateSession starts a shell session in the sandbox, minting its id
// ("ss-" + 12 characters) when the request has none, owned by the caller.
func (s *Service) CreateSession(ctx context.Context, req *berthv1.CreateSessionRequest) (*berthv1.CreateSessionResponse, error) {
	id := req.GetSessionId()
	if id == "" {
		id = sandboxid.New("ss-", 12)
	} else if err := validate.ExecID("session_id", id); err != nil {
		return nil, err
	}
	if req.GetShell() != berthv1.Shell_SHELL_UNSPECIFIED && berthv1.Shell_name[int32(req.GetShell())] == "" {
		return nil, apierr.InvalidArgument("shell", fmt.Sprintf("%d is not a known Shell value", req.GetShell()))
	}
	agent, meta, err := s.agent(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	owner := ""
	if p, ok := auth.FromContext(ctx); ok {
		owner = p.Name
	}
	spec := &berthv1.CreateSessionRequest{SandboxId: req.GetSandboxId(), SessionId: id, Name: req.GetName(), Shell: req.GetShell(),
		Cwd: req.GetCwd(), Env: req.GetEnv(), User: req.GetUser()}
	resp, err := agent.CreateSession(ctx, &agentv1.CreateSessionRequest{Session: spec, Owner: owner})
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.CreateSessionResponse{Session: resp.GetSession()}, nil
}

// ListSessions lists the sandbox's sessions, ordered by creation time.
func (s *Service) ListSessions(ctx context.Context, req *berthv1.ListSessionsRequest) (*berthv1.ListSessionsResponse, error) {
	agent, meta, err := s.agent(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp, err := agent.ListSessions(ctx, &agentv1.ListSessionsRequest{})
	if err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.ListSessionsResponse{Sessions: resp.GetSessions()}, nil
}

// DeleteSession ends a session and forgets it.
func (s *Service) DeleteSession(ctx context.Context, req *berthv1.DeleteSessionRequest) (*berthv1.DeleteSessionResponse, error) {
	if err := validate.ExecID("session_id", req.GetSessionId()); err != nil {
		return nil, err
	}
	agent, meta, err := s.agent(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if _, err := agent.DeleteSession(ctx, &agentv1.DeleteSessionRequest{SessionId: req.GetSessionId()}); err != nil {
		return nil, apierr.WithMeta(agentreach.AgentError(req.GetSandboxId(), err), meta)
	}
	return &berthv1.DeleteSessionResponse{}, nil
}
