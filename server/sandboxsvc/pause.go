package sandboxsvc

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/validate"
)

// PauseSandbox freezes every process of the sandbox and returns it,
// paused (see the proto). Pausing a paused sandbox succeeds. Errors:
// NOT_FOUND for a missing sandbox or another principal's,
// FAILED_PRECONDITION SANDBOX_NOT_RUNNING when its task does not run.
func (s *Service) PauseSandbox(ctx context.Context, req *berthv1.PauseSandboxRequest) (*berthv1.PauseSandboxResponse, error) {
	sb, err := s.freeze(ctx, req.GetSandboxId(), true)
	if err != nil {
		return nil, err
	}
	return &berthv1.PauseSandboxResponse{Sandbox: sb}, nil
}

// ResumeSandbox thaws a paused sandbox and returns it, running; resuming
// a running one succeeds. Errors as for PauseSandbox.
func (s *Service) ResumeSandbox(ctx context.Context, req *berthv1.ResumeSandboxRequest) (*berthv1.ResumeSandboxResponse, error) {
	sb, err := s.freeze(ctx, req.GetSandboxId(), false)
	if err != nil {
		return nil, err
	}
	return &berthv1.ResumeSandboxResponse{Sandbox: sb}, nil
}

// Descriptions of a hibernation (HibernateSandboxResponse.description).
const (
	processesEndedDescription = "processes ended, filesystem kept: memory, processes and connections are gone; the next call starts a new task with a new agent"
	memoryKeptDescription     = "memory kept: the sandbox's memory and processes were checkpointed to disk (gVisor) and its task removed; the next call restores them, with the same agent and exec ids"
)

// HibernateSandbox releases the sandbox's memory and CPU, keeping its
// files (under gVisor its memory too, checkpointed), and returns it,
// hibernated, with what was kept (see the proto). Hibernating a
// hibernated sandbox succeeds. Errors as for PauseSandbox.
func (s *Service) HibernateSandbox(ctx context.Context, req *berthv1.HibernateSandboxRequest) (*berthv1.HibernateSandboxResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	p, err := s.callerSeeing(ctx, id)
	if err != nil {
		return nil, err
	}
	h, err := s.life.Hibernate(ctx, id, p)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	sb, err := s.visibleSandbox(ctx, id)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	resp := &berthv1.HibernateSandboxResponse{Sandbox: s.Describe(sb, nil, nil),
		Hibernation: berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED, Description: processesEndedDescription}
	switch {
	case h.Kept == runtime.HibernatedMemoryKept:
		resp.Hibernation, resp.Description = berthv1.Hibernation_HIBERNATION_MEMORY_KEPT, memoryKeptDescription
	case h.NotKept != "":
		resp.Description += "; the memory checkpoint failed: " + h.NotKept
	}
	return resp, nil
}

// callerSeeing validates sandbox_id id and returns the caller of ctx once
// it may see that sandbox. Errors: INVALID_ARGUMENT (sandbox_id),
// UNAUTHENTICATED, NOT_FOUND (with metadata sandbox_id).
func (s *Service) callerSeeing(ctx context.Context, id string) (auth.Principal, error) {
	p, _, err := s.seeing(ctx, id)
	return p, err
}

// seeing is callerSeeing that also returns the sandbox as it was read.
func (s *Service) seeing(ctx context.Context, id string) (auth.Principal, runtime.Sandbox, error) {
	if err := validate.SandboxID("sandbox_id", id); err != nil {
		return auth.Principal{}, runtime.Sandbox{}, err
	}
	p, err := caller(ctx)
	if err != nil {
		return auth.Principal{}, runtime.Sandbox{}, err
	}
	sb, err := s.visibleSandbox(ctx, id)
	if err != nil {
		return auth.Principal{}, runtime.Sandbox{}, apierr.WithMeta(err, map[string]string{"sandbox_id": id})
	}
	return p, sb, nil
}

// freeze pauses or resumes sandbox id for the caller of ctx and describes
// it afterwards (without asking a paused agent anything). A sandbox that
// ran or was paused is described from its record read before, in the
// state the call left it in (a pause or resume changes nothing else of
// it); one that was hibernated (a resume wakes it: a new task) is read
// again.
func (s *Service) freeze(ctx context.Context, id string, pause bool) (*berthv1.Sandbox, error) {
	meta := map[string]string{"sandbox_id": id}
	p, sb, err := s.seeing(ctx, id)
	if err != nil {
		return nil, err
	}
	if pause {
		err = s.life.Pause(ctx, id, p)
	} else {
		err = s.life.Resume(ctx, id, p)
	}
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	if (sb.Running || sb.Paused) && !sb.Hibernated {
		sb.Running, sb.Paused = !pause, pause
	} else if sb, err = s.visibleSandbox(ctx, id); err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	return s.Describe(sb, s.agentInfo(ctx, sb), nil), nil
}
