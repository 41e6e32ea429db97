package sandboxsvc

import (
	"fmt"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// identity is one runtime of a sandbox (apierr.Runtime).
type identity = apierr.Runtime

// runtimeIdentity returns the RuntimeIdentity reported for a sandbox by
// GetSandbox and ListSandboxes: the running task's pid and start time and
// the agent's boot id when it answered; nil when the task does not run.
func runtimeIdentity(sb runtime.Sandbox, info *agentv1.InfoResponse) *berthv1.RuntimeIdentity {
	if !sb.Running && !sb.Paused {
		return nil
	}
	id := identity{TaskPID: sb.TaskPID, BootID: info.GetBootId()}
	id.StartedAt, _ = procfs.StartTime(sb.TaskPID)
	out := id.Proto()
	if out == nil {
		out = &berthv1.RuntimeIdentity{}
	}
	return out
}

// networkProto describes sb's network.
func (s *Service) networkProto(sb runtime.Sandbox, out *berthv1.Sandbox) {
	if !sb.Network.Egress {
		out.Network = &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_NONE}
		return
	}
	out.Network = &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: sb.Network.Allow, MaxConnections: sb.Network.MaxConnections,
		EgressBytesPerSecond: sb.Network.EgressBytesPerSecond, IngressBytesPerSecond: sb.Network.IngressBytesPerSecond}
	if net, _ := s.life.Network(); net != nil {
		if addr, ok := net.Addr(sb.ID); ok {
			out.NetworkAddress = addr.String()
		}
	}
}

// Describe describes sb: its record, the reaper's view, and when given,
// its agent's answer and its usage.
func (s *Service) Describe(sb runtime.Sandbox, info *agentv1.InfoResponse, usage *runtime.Usage) *berthv1.Sandbox {
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
		ServerVersion: s.cfg.ServerVersion,
		Owner:         sb.Owner,
		NodeId:        s.cfg.NodeID,
		RootIdMapping: rootIDMapping(sb.RootFS),
		Cpuset:        sb.CPUSet,
		IdleAction:    berthv1.IdleAction_IDLE_ACTION_DELETE,
		ForkedFrom:    sb.Fork.Parent,
		Volumes:       volumeMountsProto(sb.Volumes),
	}
	switch sb.IdleAction {
	case runtime.IdlePause:
		out.IdleAction = berthv1.IdleAction_IDLE_ACTION_PAUSE
	case runtime.IdleHibernate:
		out.IdleAction = berthv1.IdleAction_IDLE_ACTION_HIBERNATE
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
			out.VersionSkew = info.GetVersion() != s.cfg.ServerVersion
		}
	}
	if sb.Paused {
		// Its agent is frozen: nothing was asked of it.
		out.State = berthv1.SandboxState_SANDBOX_STATE_PAUSED
		out.Runtime = runtimeIdentity(sb, nil)
	}
	if sb.Hibernated {
		// No task: its processes ended, its files are kept.
		out.State = berthv1.SandboxState_SANDBOX_STATE_HIBERNATED
	}
	if st, ok := s.life.Status(sb.ID); ok {
		out.LastActivityAt = timestamppb.New(st.LastActivity)
		if !st.IdleDeadline.IsZero() {
			out.IdleExpiresAt = timestamppb.New(st.IdleDeadline)
		}
		if st.Stopping != lifecycle.ReasonNone {
			out.State = berthv1.SandboxState_SANDBOX_STATE_STOPPING
			out.StopReason = stopReasonProto(st.Stopping)
		}
	}
	if r := lifecycle.ParseReason(sb.Expired); r != lifecycle.ReasonNone {
		out.State = berthv1.SandboxState_SANDBOX_STATE_STOPPING
		out.StopReason = stopReasonProto(r)
	}
	starting := s.life.Starting(sb.ID)
	if starting && info == nil && out.State == berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		out.State = berthv1.SandboxState_SANDBOX_STATE_STARTING
	}
	if usage != nil {
		out.Usage = &berthv1.SandboxUsage{CpuTime: durationpb.New(usage.CPU), MemoryBytes: usage.MemoryBytes, MemoryPeakBytes: usage.MemoryPeakBytes, Pids: usage.Pids, DiskBytes: usage.DiskBytes}
	}
	return out
}

func stopReasonProto(r lifecycle.Reason) berthv1.StopReason {
	switch r {
	case lifecycle.ReasonIdle:
		return berthv1.StopReason_STOP_REASON_IDLE_TIMEOUT
	case lifecycle.ReasonLifetime:
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

// volumeMountsProto is the API's view of a sandbox's volume mounts.
func volumeMountsProto(in []runtime.VolumeMount) []*berthv1.VolumeMount {
	var out []*berthv1.VolumeMount
	for _, m := range in {
		out = append(out, &berthv1.VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}
