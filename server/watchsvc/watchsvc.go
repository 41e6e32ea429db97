// Package watchsvc is berth.v1.SandboxService's WatchFiles: it checks the
// request, names the watch and relays the stream of the sandbox's agent,
// which owns the watch (inotify) and the ring of its numbered events, so
// that a caller resumes a watch across its own reconnects and berthd's
// restarts.
package watchsvc

import (
	"context"
	"errors"
	"io"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/validate"
)

// reacher reaches the agent of a sandbox the caller may see
// (*agentreach.Reacher).
type reacher interface {
	Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error)
}

// Service implements WatchFiles.
type Service struct {
	reach reacher
}

// New returns WatchFiles over reach.
func New(reach reacher) *Service { return &Service{reach: reach} }

// WatchFiles opens or resumes a watch (watch_id minted "wt-" + 12
// characters when empty) and relays its events until the caller cancels.
func (s *Service) WatchFiles(req *berthv1.WatchFilesRequest, stream berthv1.SandboxService_WatchFilesServer) error {
	ctx := stream.Context()
	sandboxID := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": sandboxID}
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	id := req.GetWatchId()
	if id == "" {
		id = sandboxid.New("wt-", 12)
	} else if err := validate.ExecID("watch_id", id); err != nil {
		return err
	}
	agent, err := s.reach.Agent(ctx, sandboxID)
	if err != nil {
		return apierr.WithMeta(err, meta)
	}
	fwd := &berthv1.WatchFilesRequest{WatchId: id, Path: req.GetPath(), Recursive: req.GetRecursive(), Include: req.GetInclude(),
		SinceSeq: req.GetSinceSeq(), BufferEvents: req.GetBufferEvents()}
	events, err := agent.WatchFiles(ctx, &agentv1.WatchFilesRequest{Watch: fwd})
	if err != nil {
		return apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
	}
	for {
		msg, err := events.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return apierr.WithMeta(agentreach.AgentError(sandboxID, err), meta)
		}
		if err := stream.Send(public(msg)); err != nil {
			return err
		}
	}
}

// public is the berth.v1 message of an agent's watch event (the same
// events, one oneof).
func public(msg *agentv1.WatchFilesResponse) *berthv1.WatchFilesResponse {
	switch ev := msg.GetEvent().(type) {
	case *agentv1.WatchFilesResponse_Started:
		return &berthv1.WatchFilesResponse{Event: &berthv1.WatchFilesResponse_Started{Started: ev.Started}}
	case *agentv1.WatchFilesResponse_File:
		return &berthv1.WatchFilesResponse{Event: &berthv1.WatchFilesResponse_File{File: ev.File}}
	case *agentv1.WatchFilesResponse_Overflow:
		return &berthv1.WatchFilesResponse{Event: &berthv1.WatchFilesResponse_Overflow{Overflow: ev.Overflow}}
	}
	return &berthv1.WatchFilesResponse{}
}
