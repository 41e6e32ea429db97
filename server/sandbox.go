package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/fleet"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

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
	infoCtx, cancelInfo := context.WithCancel(ctx)
	defer cancelInfo()
	go func() {
		info, err := agentconn.WaitReady(infoCtx, agent)
		answered <- answer{info, err}
	}()
	// WaitReady waits through failed connection attempts; one that failed
	// for want of berthd's own descriptors will not heal while it waits.
	began := time.Now()
	dialCheck := time.NewTicker(100 * time.Millisecond)
	defer dialCheck.Stop()
	for {
		select {
		case <-dialCheck.C:
			if err := s.dialFailure(id, time.Since(began)); err != nil {
				cancelInfo()
				<-answered
				return nil, err
			}
			continue
		case a := <-answered:
			if a.err != nil {
				return nil, fmt.Errorf("%w: agent of sandbox %s did not answer within %v: %v%s", errAgentUnreachable, id, s.cfg.AgentReadyTimeout, a.err, s.logTail(id))
			}
			s.checkSkew(id, a.info)
			return a.info, nil
		case st := <-exited:
			cancel()
			<-answered
			return nil, fmt.Errorf("%w: the task of sandbox %s exited with status %d before the agent answered%s", errAgentUnreachable, id, st.ExitCode(), s.logTail(id))
		}
	}
}

// logTail returns the last lines of the agent's log as "; agent log: ...",
// or "" when there is none. The agent logs no env values or file contents.
func (s *Service) logTail(id string) string {
	b := s.rt.LogTail(id, 1024)
	if len(b) == 0 {
		return ""
	}
	return "; agent log: " + strings.TrimSpace(string(b))
}

// trimAgentLogs bounds every sandbox's agent log to Config.MaxAgentLogBytes
// (runtime.TrimLog), every Config.AgentLogCheck, until ctx ends.
func (s *Service) trimAgentLogs(ctx context.Context) {
	t := time.NewTicker(s.cfg.AgentLogCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids, err := s.rt.HostDirs()
		if err != nil {
			s.log.Warn("list sandbox directories to bound agent logs", slog.Any("error", err))
			continue
		}
		for _, id := range ids {
			if _, err := s.rt.TrimLog(id, s.cfg.MaxAgentLogBytes); err != nil {
				s.log.Warn("bound agent log", slog.String("sandbox_id", id), slog.Any("error", err))
			}
		}
	}
}

// sandboxNotFound is the error of a sandbox that does not exist, and of one
// the caller may not see: the same words and details (toStatus), so that no
// answer tells the two apart.
func sandboxNotFound(id string) error {
	return fmt.Errorf("%w: %s", runtime.ErrSandboxNotFound, id)
}

// visibleSandbox returns the record of sandbox id when the caller of ctx
// may see it (auth.Sees). A warm-pool member no caller claimed, or another
// principal's sandbox, is sandboxNotFound.
func (s *Service) visibleSandbox(ctx context.Context, id string) (runtime.Sandbox, error) {
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	if sb.Pooled || !auth.Sees(ctx, sb.Owner) {
		return runtime.Sandbox{}, sandboxNotFound(id)
	}
	return sb, nil
}

// caller returns the principal of ctx; a context the auth interceptors did
// not make has none and is refused as UNAUTHENTICATED.
func caller(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, rpcstatus.Error(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "the request carries no authenticated principal", nil)
	}
	return p, nil
}

// GetSandbox returns the sandbox's record from containerd with its state
// (starting, running, stopping with the reason, stopped), its agent's
// identity and exec count, its deadlines and its live usage (containerd
// task metrics). Warm-pool members that no caller claimed, and sandboxes of
// other principals, are NOT_FOUND.
func (s *Service) GetSandbox(ctx context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	id := req.GetSandboxId()
	meta := map[string]string{"sandbox_id": id}
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	sb, err := s.visibleSandbox(ctx, id)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	var usage *runtime.Usage
	if sb.Running {
		if u, err := s.rt.Usage(ctx, id); err == nil {
			usage = &u
		} else {
			s.log.DebugContext(ctx, "sandbox usage unavailable", slog.String("sandbox_id", id), slog.Any("error", err))
		}
	}
	return &berthv1.GetSandboxResponse{Sandbox: s.sandboxProto(sb, s.agentInfo(ctx, sb), usage)}, nil
}

// agentInfo asks a running sandbox's agent for its identity, briefly; it
// returns nil when the agent does not answer.
func (s *Service) agentInfo(ctx context.Context, sb runtime.Sandbox) *agentv1.InfoResponse {
	if !sb.Running {
		return nil
	}
	info, err := s.agentInfoErr(ctx, sb)
	if err != nil {
		return nil
	}
	return info
}

// agentInfoErr asks the sandbox's agent for Info within agentInfoTimeout
// and checks its version against berthd's.
func (s *Service) agentInfoErr(ctx context.Context, sb runtime.Sandbox) (*agentv1.InfoResponse, error) {
	agent, err := s.agents.Get(sb.SocketPath)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentInfoTimeout)
	defer cancel()
	info, err := agent.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return nil, agentError(sb.ID, err)
	}
	s.checkSkew(sb.ID, info)
	return info, nil
}

// checkSkew logs a warning, once per agent boot, when the agent's version
// differs from berthd's.
func (s *Service) checkSkew(id string, info *agentv1.InfoResponse) {
	if info == nil || info.GetVersion() == Version {
		return
	}
	s.mu.Lock()
	warned := s.warned[info.GetBootId()]
	s.warned[info.GetBootId()] = true
	s.mu.Unlock()
	if !warned {
		s.log.Warn("agent version differs from berthd's", slog.String("sandbox_id", id), slog.String("agent_version", info.GetVersion()),
			slog.String("agent_build", info.GetBuild()), slog.String("server_version", Version), slog.String("agent_boot_id", info.GetBootId()))
	}
}

// minMemoryBytes is the smallest memory cap accepted: below a few MiB the
// agent itself cannot run.
const minMemoryBytes = 4 << 20

// maxShmBytes bounds resources.shm_bytes whatever --max-memory-bytes says:
// far from the wrap of its rounding to whole KiB and from the int64 of the
// OCI spec.
const maxShmBytes = 1 << 62

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// ListSandboxes lists the caller's sandboxes (an admin's: all) ordered by
// id. The page token is the last id of the previous page, base64-encoded.
func (s *Service) ListSandboxes(ctx context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
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
	if err := validateLabels("label_selector", req.GetLabelSelector()); err != nil {
		return nil, err
	}
	selector := req.GetLabelSelector()
	if !p.Admin {
		// containerd filters by owner: a principal's listing costs what
		// its own sandboxes cost, not what the host holds.
		selector = maps.Clone(selector)
		if selector == nil {
			selector = make(map[string]string, 1)
		}
		selector[runtime.LabelOwner] = p.Name
	}
	all, err := s.rt.List(ctx, selector)
	if err != nil {
		return nil, s.toStatus(ctx, err, nil)
	}
	resp := &berthv1.ListSandboxesResponse{}
	for _, sb := range all {
		if sb.ID <= after || sb.Pooled || !p.Sees(sb.Owner) {
			continue
		}
		if len(resp.Sandboxes) == size {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(resp.Sandboxes[size-1].Id))
			break
		}
		resp.Sandboxes = append(resp.Sandboxes, s.sandboxProto(sb, s.agentInfo(ctx, sb), nil))
	}
	return resp, nil
}

// DeleteSandbox removes the sandbox; a missing one is not an error, and
// neither is one the caller may not see, which stays untouched: the answer
// is the same as for a missing one. A CreateSandbox of the id in progress
// that fails because of it fails NOT_FOUND SANDBOX_NOT_FOUND ("deleted
// while it was being created").
func (s *Service) DeleteSandbox(ctx context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	id := req.GetSandboxId()
	if err := validateSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"sandbox_id": id}
	s.mu.Lock()
	c := s.creating[id]
	if c != nil && p.Sees(c.spec.Owner) {
		// The creation holds the sandbox's lifecycle lock: cancel it, so
		// that the delete runs now instead of after it.
		c.deleted.Store(true)
		c.cancel()
	}
	s.mu.Unlock()
	if c != nil && !p.Sees(c.spec.Owner) {
		return &berthv1.DeleteSandboxResponse{}, nil
	}
	if c == nil {
		// A restart holds the lifecycle lock while its agent starts:
		// cancel it too, if the sandbox is the caller's.
		sb, err := s.rt.Get(ctx, id)
		switch {
		case errors.Is(err, runtime.ErrSandboxNotFound):
			return &berthv1.DeleteSandboxResponse{}, nil
		case err != nil:
			return nil, s.toStatus(ctx, err, meta)
		case !p.Sees(sb.Owner):
			return &berthv1.DeleteSandboxResponse{}, nil
		}
		s.restarts.abort(id)
	}
	unlock, err := s.lifecycle.Lock(ctx, id)
	if err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	defer unlock()
	// Whose the sandbox is, under the lock: no other principal's sandbox
	// of the id can appear between this check and the removal. A missing
	// sandbox (or one a canceled creation removed) leaves nothing to do.
	sb, err := s.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrSandboxNotFound):
		return &berthv1.DeleteSandboxResponse{}, nil
	case err != nil:
		return nil, s.toStatus(ctx, err, meta)
	case !p.Sees(sb.Owner):
		return &berthv1.DeleteSandboxResponse{}, nil
	}
	if err := s.deleteLocked(ctx, id); err != nil {
		return nil, s.toStatus(ctx, err, meta)
	}
	s.log.InfoContext(ctx, "sandbox deleted", slog.String("sandbox_id", id), slog.String("principal", p.String()))
	return &berthv1.DeleteSandboxResponse{}, nil
}

// deleteSandbox removes the sandbox under its lifecycle lock.
func (s *Service) deleteSandbox(ctx context.Context, id string) error {
	unlock, err := s.lifecycle.Lock(ctx, id)
	if err != nil {
		return fmt.Errorf("wait for other lifecycle operations on sandbox %s: %w", id, err)
	}
	defer unlock()
	return s.deleteLocked(ctx, id)
}

// deleteLocked removes the sandbox; the caller holds its lifecycle lock.
func (s *Service) deleteLocked(ctx context.Context, id string) error {
	var pid uint32
	if sb, err := s.rt.Get(ctx, id); err == nil {
		pid = sb.TaskPID
	}
	done := s.deletingSandbox(id, pid)
	defer done()
	s.agents.Forget(s.rt.SocketPath(id))
	if err := s.rt.Delete(ctx, id); err != nil && !errors.Is(err, runtime.ErrSandboxNotFound) {
		return err
	}
	s.detachNetwork(ctx, id)
	s.reaper.Forget(id)
	s.release(ctx, id)
	return nil
}

// detachNetwork removes sandbox id's network, if it has one. A failure is
// logged: what is left is removed as an orphan at berthd's next start.
func (s *Service) detachNetwork(ctx context.Context, id string) {
	if s.cfg.Network == nil {
		return
	}
	if err := s.cfg.Network.Detach(ctx, id); err != nil {
		s.log.Error("remove the sandbox's network", slog.String("sandbox_id", id), slog.Any("error", err))
	}
}

// networkProto describes sb's network.
func (s *Service) networkProto(sb runtime.Sandbox, out *berthv1.Sandbox) {
	if !sb.Network.Egress {
		out.Network = &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_NONE}
		return
	}
	out.Network = &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: sb.Network.Allow, MaxConnections: sb.Network.MaxConnections,
		EgressBytesPerSecond: sb.Network.EgressBytesPerSecond, IngressBytesPerSecond: sb.Network.IngressBytesPerSecond}
	if s.cfg.Network != nil {
		if addr, ok := s.cfg.Network.Addr(sb.ID); ok {
			out.NetworkAddress = addr.String()
		}
	}
}

// sandboxProto describes sb: its record, the reaper's view, and when given,
// its agent's answer and its usage.
func (s *Service) sandboxProto(sb runtime.Sandbox, info *agentv1.InfoResponse, usage *runtime.Usage) *berthv1.Sandbox {
	out := &berthv1.Sandbox{
		Id:            sb.ID,
		Image:         sb.Image,
		State:         berthv1.SandboxState_SANDBOX_STATE_STOPPED,
		Labels:        sb.Labels,
		Resources:     &berthv1.Resources{PidsLimit: sb.PidsLimit, CpuMillis: sb.CPUMillis, MemoryBytes: sb.MemoryBytes, OpenFilesLimit: sb.OpenFiles, DiskBytes: sb.DiskBytes, ShmBytes: sb.ShmBytes},
		HostUsers:     sb.HostUsers,
		HostIdBase:    sb.IDBase,
		RuntimeName:   sb.Runtime,
		EnvKeys:       sb.EnvKeys,
		User:          fmt.Sprintf("%d:%d", sb.UID, sb.GID),
		Workdir:       sb.WorkDir,
		ServerVersion: Version,
		Owner:         sb.Owner,
		NodeId:        s.cfg.NodeID,
		RootIdMapping: rootIDMapping(sb.RootFS),
	}
	s.networkProto(sb, out)
	if sb.IdleTimeout > 0 {
		out.IdleTimeout = durationpb.New(sb.IdleTimeout)
	}
	if sb.MaxLifetime > 0 {
		out.MaxLifetime = durationpb.New(sb.MaxLifetime)
	}
	if !sb.CreatedAt.IsZero() {
		out.CreatedAt = timestamppb.New(sb.CreatedAt)
		if sb.MaxLifetime > 0 {
			out.ExpiresAt = timestamppb.New(sb.CreatedAt.Add(sb.MaxLifetime))
		}
	}
	if sb.Running {
		out.State = berthv1.SandboxState_SANDBOX_STATE_RUNNING
		out.Runtime = runtimeIdentity(sb, info)
		if info != nil {
			out.AgentVersion = info.GetVersion()
			out.AgentBuild = info.GetBuild()
			out.RunningExecs = info.GetRunningExecs()
			out.VersionSkew = info.GetVersion() != Version
		}
	}
	if st, ok := s.reaper.Status(sb.ID); ok {
		out.LastActivityAt = timestamppb.New(st.LastActivity)
		if !st.IdleDeadline.IsZero() {
			out.IdleExpiresAt = timestamppb.New(st.IdleDeadline)
		}
		if st.Stopping != fleet.ReasonNone {
			out.State = berthv1.SandboxState_SANDBOX_STATE_STOPPING
			out.StopReason = stopReasonProto(st.Stopping)
		}
	}
	if r := fleet.ParseReason(sb.Expired); r != fleet.ReasonNone {
		out.State = berthv1.SandboxState_SANDBOX_STATE_STOPPING
		out.StopReason = stopReasonProto(r)
	}
	s.mu.Lock()
	_, starting := s.creating[sb.ID]
	s.mu.Unlock()
	if starting && info == nil && out.State == berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		out.State = berthv1.SandboxState_SANDBOX_STATE_STARTING
	}
	if usage != nil {
		out.Usage = &berthv1.SandboxUsage{CpuTime: durationpb.New(usage.CPU), MemoryBytes: usage.MemoryBytes, MemoryPeakBytes: usage.MemoryPeakBytes, Pids: usage.Pids, DiskBytes: usage.DiskBytes}
	}
	return out
}

func stopReasonProto(r fleet.Reason) berthv1.StopReason {
	switch r {
	case fleet.ReasonIdle:
		return berthv1.StopReason_STOP_REASON_IDLE_TIMEOUT
	case fleet.ReasonLifetime:
		return berthv1.StopReason_STOP_REASON_MAX_LIFETIME
	}
	return berthv1.StopReason_STOP_REASON_UNSPECIFIED
}

// rootIDMapping is the API's name for a sandbox's runtime.Sandbox.RootFS.
func rootIDMapping(rootFS string) berthv1.RootIDMapping {
	switch rootFS {
	case runtime.RootFSIDMapped:
		return berthv1.RootIDMapping_ROOT_ID_MAPPING_IDMAPPED
	case runtime.RootFSChowned:
		return berthv1.RootIDMapping_ROOT_ID_MAPPING_CHOWNED_COPY
	}
	return berthv1.RootIDMapping_ROOT_ID_MAPPING_HOST
}
