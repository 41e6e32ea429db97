package server

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// The RPCs of berth.v1.SandboxService, each served by the package that
// owns it: sandboxsvc (sandboxes), execsvc (execs, port forwarding) and
// sessionsvc (shell sessions), contextsvc (code contexts), watchsvc (file
// watches), volumesvc (volumes).

func (s *Service) CreateSandbox(ctx context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	return s.sandboxes.CreateSandbox(ctx, req)
}

func (s *Service) GetSandbox(ctx context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	return s.sandboxes.GetSandbox(ctx, req)
}

func (s *Service) ListSandboxes(ctx context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	return s.sandboxes.ListSandboxes(ctx, req)
}

func (s *Service) DeleteSandbox(ctx context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	return s.sandboxes.DeleteSandbox(ctx, req)
}

func (s *Service) KeepAlive(ctx context.Context, req *berthv1.KeepAliveRequest) (*berthv1.KeepAliveResponse, error) {
	return s.sandboxes.KeepAlive(ctx, req)
}

func (s *Service) PauseSandbox(ctx context.Context, req *berthv1.PauseSandboxRequest) (*berthv1.PauseSandboxResponse, error) {
	return s.sandboxes.PauseSandbox(ctx, req)
}

func (s *Service) ResumeSandbox(ctx context.Context, req *berthv1.ResumeSandboxRequest) (*berthv1.ResumeSandboxResponse, error) {
	return s.sandboxes.ResumeSandbox(ctx, req)
}

func (s *Service) HibernateSandbox(ctx context.Context, req *berthv1.HibernateSandboxRequest) (*berthv1.HibernateSandboxResponse, error) {
	return s.sandboxes.HibernateSandbox(ctx, req)
}

func (s *Service) CreateSnapshot(ctx context.Context, req *berthv1.CreateSnapshotRequest) (*berthv1.CreateSnapshotResponse, error) {
	return s.sandboxes.CreateSnapshot(ctx, req)
}

func (s *Service) ListSnapshots(ctx context.Context, req *berthv1.ListSnapshotsRequest) (*berthv1.ListSnapshotsResponse, error) {
	return s.sandboxes.ListSnapshots(ctx, req)
}

func (s *Service) DeleteSnapshot(ctx context.Context, req *berthv1.DeleteSnapshotRequest) (*berthv1.DeleteSnapshotResponse, error) {
	return s.sandboxes.DeleteSnapshot(ctx, req)
}

func (s *Service) ForkSandbox(ctx context.Context, req *berthv1.ForkSandboxRequest) (*berthv1.ForkSandboxResponse, error) {
	return s.sandboxes.ForkSandbox(ctx, req)
}

func (s *Service) CommitSnapshot(ctx context.Context, req *berthv1.CommitSnapshotRequest) (*berthv1.CommitSnapshotResponse, error) {
	return s.sandboxes.CommitSnapshot(ctx, req)
}

func (s *Service) Exec(stream berthv1.SandboxService_ExecServer) error { return s.execs.Exec(stream) }

func (s *Service) Run(ctx context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	return s.execs.Run(ctx, req)
}

func (s *Service) ListExecs(ctx context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	return s.execs.ListExecs(ctx, req)
}

func (s *Service) SignalExec(ctx context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	return s.execs.SignalExec(ctx, req)
}

func (s *Service) StartExec(req *berthv1.StartExecRequest, stream berthv1.SandboxService_StartExecServer) error {
	return s.execs.StartExec(req, stream)
}

func (s *Service) AttachExec(req *berthv1.AttachExecRequest, stream berthv1.SandboxService_AttachExecServer) error {
	return s.execs.AttachExec(req, stream)
}

func (s *Service) WriteExecStdin(ctx context.Context, req *berthv1.WriteExecStdinRequest) (*berthv1.WriteExecStdinResponse, error) {
	return s.execs.WriteExecStdin(ctx, req)
}

func (s *Service) ResizeExec(ctx context.Context, req *berthv1.ResizeExecRequest) (*berthv1.ResizeExecResponse, error) {
	return s.execs.ResizeExec(ctx, req)
}

func (s *Service) PortForward(stream berthv1.SandboxService_PortForwardServer) error {
	return s.execs.PortForward(stream)
}

func (s *Service) CreateSession(ctx context.Context, req *berthv1.CreateSessionRequest) (*berthv1.CreateSessionResponse, error) {
	return s.sessions.CreateSession(ctx, req)
}

func (s *Service) ListSessions(ctx context.Context, req *berthv1.ListSessionsRequest) (*berthv1.ListSessionsResponse, error) {
	return s.sessions.ListSessions(ctx, req)
}

func (s *Service) CreateCodeContext(ctx context.Context, req *berthv1.CreateCodeContextRequest) (*berthv1.CreateCodeContextResponse, error) {
	return s.contexts.CreateCodeContext(ctx, req)
}

func (s *Service) ListCodeContexts(ctx context.Context, req *berthv1.ListCodeContextsRequest) (*berthv1.ListCodeContextsResponse, error) {
	return s.contexts.ListCodeContexts(ctx, req)
}

func (s *Service) DeleteCodeContext(ctx context.Context, req *berthv1.DeleteCodeContextRequest) (*berthv1.DeleteCodeContextResponse, error) {
	return s.contexts.DeleteCodeContext(ctx, req)
}

func (s *Service) InterruptCodeContext(ctx context.Context, req *berthv1.InterruptCodeContextRequest) (*berthv1.InterruptCodeContextResponse, error) {
	return s.contexts.InterruptCodeContext(ctx, req)
}

func (s *Service) RestartCodeContext(ctx context.Context, req *berthv1.RestartCodeContextRequest) (*berthv1.RestartCodeContextResponse, error) {
	return s.contexts.RestartCodeContext(ctx, req)
}

func (s *Service) ExecuteCode(req *berthv1.ExecuteCodeRequest, out berthv1.SandboxService_ExecuteCodeServer) error {
	return s.contexts.ExecuteCode(req, out)
}

func (s *Service) DeleteSession(ctx context.Context, req *berthv1.DeleteSessionRequest) (*berthv1.DeleteSessionResponse, error) {
	return s.sessions.DeleteSession(ctx, req)
}

func (s *Service) WatchFiles(req *berthv1.WatchFilesRequest, stream berthv1.SandboxService_WatchFilesServer) error {
	return s.watches.WatchFiles(req, stream)
}

func (s *Service) CreateVolume(ctx context.Context, req *berthv1.CreateVolumeRequest) (*berthv1.CreateVolumeResponse, error) {
	return s.volumes.CreateVolume(ctx, req)
}

func (s *Service) GetVolume(ctx context.Context, req *berthv1.GetVolumeRequest) (*berthv1.GetVolumeResponse, error) {
	return s.volumes.GetVolume(ctx, req)
}

func (s *Service) ListVolumes(ctx context.Context, req *berthv1.ListVolumesRequest) (*berthv1.ListVolumesResponse, error) {
	return s.volumes.ListVolumes(ctx, req)
}

func (s *Service) DeleteVolume(ctx context.Context, req *berthv1.DeleteVolumeRequest) (*berthv1.DeleteVolumeResponse, error) {
	return s.volumes.DeleteVolume(ctx, req)
}
