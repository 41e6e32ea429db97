package agentreach

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/apierr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAgentError: transport failures of an agent call are Unreachable
// (the request may have taken effect), the agent's own verdicts pass
// unchanged, and context ends stay context ends.
func TestAgentError(t *testing.T) {
	verdict := rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid, "cwd /x: no such directory", nil)
	if got := AgentError("sb", verdict); got != verdict {
		t.Errorf("AgentError(agent verdict) = %v, want it unchanged", got)
	}
	var u *apierr.Unreachable
	err := AgentError("sb", status.Error(codes.Unavailable, "connection reset"))
	if !errors.As(err, &u) {
		t.Fatalf("AgentError(UNAVAILABLE) = %v, want *apierr.Unreachable", err)
	}
	for _, w := range []string{"sandbox sb", "connection reset", "the request reached the agent, whether it took effect is unknown"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q lacks %q", err, w)
		}
	}
	if got := AgentError("sb", status.Error(codes.Canceled, "x")); !errors.Is(got, context.Canceled) {
		t.Errorf("AgentError(CANCELED) = %v, want context.Canceled", got)
	}
	if got := AgentError("sb", status.Error(codes.Internal, "raw")); rpcstatus.Reason(got) != "" || !strings.Contains(got.Error(), "agent of sandbox sb") {
		t.Errorf("AgentError(INTERNAL without reason) = %v, want it wrapped for the boundary to treat as internal", got)
	}
}
