package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// CreateSession starts a shell session in the sandbox sandboxID: a shell
// whose cwd, environment, variables, functions and background jobs persist
// from one command to the next (docs/sessions.md). Run a command in it with
// RunInSession, or with Run or Exec and a ProcessSpec whose SessionId is
// set. An empty req.SessionId is minted ("ss-..."). Errors:
// codes.InvalidArgument naming the field, codes.AlreadyExists
// (ReasonSessionExists), codes.NotFound (ReasonSandboxNotFound),
// codes.FailedPrecondition (ReasonCwdInvalid).
func (c *Client) CreateSession(ctx context.Context, req *berthv1.CreateSessionRequest) (*berthv1.SessionInfo, error) {
	resp, err := c.sandboxes.CreateSession(ctx, req)
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetSession(), nil
}

// ListSessions lists the sessions of the sandbox sandboxID, ordered by
// creation time. Errors: codes.NotFound (ReasonSandboxNotFound).
func (c *Client) ListSessions(ctx context.Context, sandboxID string) ([]*berthv1.SessionInfo, error) {
	resp, err := c.sandboxes.ListSessions(ctx, &berthv1.ListSessionsRequest{SandboxId: sandboxID})
	if err != nil {
		return nil, convertError(err)
	}
	return resp.GetSessions(), nil
}

// DeleteSession ends the session sessionID (SIGHUP, then SIGKILL, to its
// shell's process group, background jobs included) and forgets it.
// Errors: codes.NotFound (ReasonSandboxNotFound, ReasonSessionNotFound).
func (c *Client) DeleteSession(ctx context.Context, sandboxID, sessionID string) error {
	_, err := c.sandboxes.DeleteSession(ctx, &berthv1.DeleteSessionRequest{SandboxId: sandboxID, SessionId: sessionID})
	return convertError(err)
}

// RunInSession runs command in the session sessionID of the sandbox
// sandboxID to completion and returns its own exit code and output, as Run
// does. Errors as for Run, and codes.FailedPrecondition
// (ReasonSessionBusy, ReasonSessionEnded), codes.NotFound
// (ReasonSessionNotFound).
func (c *Client) RunInSession(ctx context.Context, sandboxID, sessionID, command string, opts ...ExecOption) (*berthv1.RunResponse, error) {
	return c.Run(ctx, sandboxID, &berthv1.ProcessSpec{SessionId: sessionID, ShellCommand: command}, opts...)
}
