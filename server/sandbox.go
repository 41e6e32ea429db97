package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// CreateSandbox creates the container, starts the agent as its PID 1 and
// returns once the agent answers. A sandbox whose agent does not answer
// within Config.AgentReadyTimeout, or whose task exits first, is removed and
// reported as UNAVAILABLE with the tail of the agent's log.
func (s *Service) CreateSandbox(ctx context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	id := req.GetSandboxId()
	if id == "" {
		id = newID("sb-", 10)
	}
	meta := map[string]string{"sandbox_id": id}
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if req.GetImage() == "" {
		return nil, rpcstatus.InvalidArgument("image", "is empty")
	}
	if err := validateLabels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	pids := req.GetResources().GetPidsLimit()
	if pids == 0 {
		pids = s.cfg.DefaultPidsLimit
	}
	if pids > s.cfg.MaxPidsLimit {
		return nil, rpcstatus.InvalidArgument("resources.pids_limit", fmt.Sprintf("%d exceeds the server's maximum of %d", pids, s.cfg.MaxPidsLimit))
	}
	res := req.GetResources()
	if res.GetCpuMillis() > s.cfg.MaxCPUMillis {
		return nil, rpcstatus.InvalidArgument("resources.cpu_millis", fmt.Sprintf("%d exceeds the server's maximum of %d", res.GetCpuMillis(), s.cfg.MaxCPUMillis))
	}
	if max := s.cfg.MaxMemoryBytes; max > 0 && res.GetMemoryBytes() > max {
		return nil, rpcstatus.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d exceeds the server's maximum of %d", res.GetMemoryBytes(), max))
	}
	if m := res.GetMemoryBytes(); m > 0 && m < minMemoryBytes {
		return nil, rpcstatus.InvalidArgument("resources.memory_bytes", fmt.Sprintf("%d is below the minimum of %d (4 MiB)", m, minMemoryBytes))
	}
	spec := runtime.SandboxSpec{ID: id, Image: req.GetImage(), Labels: req.GetLabels(), PidsLimit: pids, CPUMillis: res.GetCpuMillis(), MemoryBytes: res.GetMemoryBytes()}
	admitted, err := s.capacity.admitSandbox(ctx, id, spec.MemoryBytes)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	defer admitted()
	if err := s.rt.Create(ctx, spec); err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	info, err := s.waitAgent(ctx, id)
	if err != nil {
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AgentReadyTimeout)
		defer cancel()
		if derr := s.deleteSandbox(cleanup, id); derr != nil {
			s.log.ErrorContext(ctx, "remove sandbox after failed start", slog.String("sandbox_id", id), slog.Any("error", derr))
		}
		return nil, s.toStatus(ctx, err, meta)
	}
	s.sandboxCreated(id, info.GetBootId(), info.GetVersion())
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	s.log.InfoContext(ctx, "sandbox created", slog.String("sandbox_id", id), slog.String("image", spec.Image), slog.String("agent_boot_id", info.GetBootId()))
	return &berthv1.CreateSandboxResponse{Sandbox: toProto(sb, info)}, nil
}

// waitAgent waits until the agent of sandbox id answers Info, the task
// exits, or Config.AgentReadyTimeout passes.
func (s *Service) waitAgent(ctx context.Context, id string) (*agentv1.InfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AgentReadyTimeout)
	defer cancel()
	exited, err := s.rt.WaitExit(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("watch task of %s: %w", id, err)
	}
	agent, err := s.agents.Get(s.rt.SocketPath(id))
	if err != nil {
		return nil, err
	}
	type answer struct {
		info *agentv1.InfoResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		info, err := agentconn.WaitReady(ctx, agent)
		answered <- answer{info, err}
	}()
	select {
	case a := <-answered:
		if a.err != nil {
			return nil, fmt.Errorf("%w: agent of sandbox %s did not answer within %v: %v%s", errAgentUnreachable, id, s.cfg.AgentReadyTimeout, a.err, s.logTail(id))
		}
		return a.info, nil
	case st := <-exited:
		cancel()
		<-answered
		return nil, fmt.Errorf("%w: the task of sandbox %s exited with status %d before the agent answered%s", errAgentUnreachable, id, st.ExitCode(), s.logTail(id))
	}
}

// logTail returns the last lines of the agent's log as "; agent log: ...",
// or "" when there is none. The agent logs no env values or file contents.
func (s *Service) logTail(id string) string {
	b, err := os.ReadFile(s.rt.LogPath(id))
	if err != nil || len(b) == 0 {
		return ""
	}
	const max = 1024
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "; agent log: " + strings.TrimSpace(string(b))
}

// GetSandbox returns the sandbox's record from containerd and, when it runs,
// its agent's identity.
func (s *Service) GetSandbox(ctx context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	id := req.GetSandboxId()
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		return nil, s.toStatus(ctx, err, map[string]string{"sandbox_id": id})
	}
	return &berthv1.GetSandboxResponse{Sandbox: toProto(sb, s.agentInfo(ctx, sb))}, nil
}

// agentInfo asks a running sandbox's agent for its identity, briefly; it
// returns nil when the agent does not answer.
func (s *Service) agentInfo(ctx context.Context, sb runtime.Sandbox) *agentv1.InfoResponse {
	if !sb.Running {
		return nil
	}
	agent, err := s.agents.Get(sb.SocketPath)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, agentInfoTimeout)
	defer cancel()
	info, err := agent.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return nil
	}
	return info
}

// minMemoryBytes is the smallest memory cap accepted: below a few MiB the
// agent itself cannot run.
const minMemoryBytes = 4 << 20

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// ListSandboxes lists sandboxes ordered by id. The page token is the last id
// of the previous page, base64-encoded.
func (s *Service) ListSandboxes(ctx context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > maxPageSize:
		return nil, rpcstatus.InvalidArgument("page_size", fmt.Sprintf("%d is outside 0 to %d", size, maxPageSize))
	case size == 0:
		size = defaultPageSize
	}
	var after string
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			return nil, rpcstatus.InvalidArgument("page_token", "is not a token from next_page_token")
		}
		after = string(b)
	}
	all, err := s.rt.List(ctx, req.GetLabelSelector())
	if err != nil {
		return nil, s.toStatus(ctx, err, nil)
	}
	resp := &berthv1.ListSandboxesResponse{}
	for _, sb := range all {
		if sb.ID <= after {
			continue
		}
		if len(resp.Sandboxes) == size {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(resp.Sandboxes[size-1].Id))
			break
		}
		resp.Sandboxes = append(resp.Sandboxes, toProto(sb, s.agentInfo(ctx, sb)))
	}
	return resp, nil
}

// DeleteSandbox removes the sandbox; a missing one is not an error.
func (s *Service) DeleteSandbox(ctx context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	id := req.GetSandboxId()
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if err := s.deleteSandbox(ctx, id); err != nil {
		return nil, s.toStatus(ctx, err, map[string]string{"sandbox_id": id})
	}
	s.log.InfoContext(ctx, "sandbox deleted", slog.String("sandbox_id", id))
	return &berthv1.DeleteSandboxResponse{}, nil
}

func (s *Service) deleteSandbox(ctx context.Context, id string) error {
	done := s.deletingSandbox(id)
	defer done()
	s.agents.Forget(s.rt.SocketPath(id))
	if err := s.rt.Delete(ctx, id); err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
		return err
	}
	return nil
}

func toProto(sb runtime.Sandbox, info *agentv1.InfoResponse) *berthv1.Sandbox {
	out := &berthv1.Sandbox{
		Id:        sb.ID,
		Image:     sb.Image,
		State:     berthv1.SandboxState_SANDBOX_STATE_STOPPED,
		Labels:    sb.Labels,
		Resources: &berthv1.Resources{PidsLimit: sb.PidsLimit, CpuMillis: sb.CPUMillis, MemoryBytes: sb.MemoryBytes},
	}
	if !sb.CreatedAt.IsZero() {
		out.CreatedAt = timestamppb.New(sb.CreatedAt)
	}
	if sb.Running {
		out.State = berthv1.SandboxState_SANDBOX_STATE_RUNNING
		out.Runtime = runtimeIdentity(sb, info)
		out.AgentVersion = info.GetVersion()
	}
	return out
}
