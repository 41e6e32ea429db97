package client

import (
	"testing"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// TestReasonsMatchServer keeps the public reason tokens equal to the ones
// berthd sends.
func TestReasonsMatchServer(t *testing.T) {
	tests := []struct{ got, want string }{
		{ErrorDomain, rpcstatus.Domain},
		{ReasonInvalidArgument, rpcstatus.ReasonInvalidArgument},
		{ReasonSandboxNotFound, rpcstatus.ReasonSandboxNotFound},
		{ReasonSandboxExists, rpcstatus.ReasonSandboxExists},
		{ReasonImageNotFound, rpcstatus.ReasonImageNotFound},
		{ReasonImageArchive, rpcstatus.ReasonImageArchive},
		{ReasonExecNotFound, rpcstatus.ReasonExecNotFound},
		{ReasonExecExists, rpcstatus.ReasonExecExists},
		{ReasonCwdInvalid, rpcstatus.ReasonCwdInvalid},
		{ReasonSessionNotFound, rpcstatus.ReasonSessionNotFound},
		{ReasonSessionExists, rpcstatus.ReasonSessionExists},
		{ReasonSessionBusy, rpcstatus.ReasonSessionBusy},
		{ReasonSessionEnded, rpcstatus.ReasonSessionEnded},
		{ReasonWatchNotFound, rpcstatus.ReasonWatchNotFound},
		{ReasonSandboxNotRunning, rpcstatus.ReasonSandboxNotRunning},
		{ReasonSandboxPaused, rpcstatus.ReasonSandboxPaused},
		{ReasonSnapshotNotFound, rpcstatus.ReasonSnapshotNotFound},
		{ReasonSnapshotUnsupported, rpcstatus.ReasonSnapshotUnsupported},
		{ReasonSnapshotInUse, rpcstatus.ReasonSnapshotInUse},
		{ReasonVolumeNotFound, rpcstatus.ReasonVolumeNotFound},
		{ReasonVolumeExists, rpcstatus.ReasonVolumeExists},
		{ReasonVolumeInUse, rpcstatus.ReasonVolumeInUse},
		{ReasonVolumeUnsupported, rpcstatus.ReasonVolumeUnsupported},
		{ReasonSnapshotLimit, rpcstatus.ReasonSnapshotLimit},
		{ReasonUnreachable, rpcstatus.ReasonUnreachable},
		{ReasonInternal, rpcstatus.ReasonInternal},
		{ReasonFleetBusy, rpcstatus.ReasonFleetBusy},
		{ReasonRuntimeReplaced, rpcstatus.ReasonRuntimeReplaced},
		{ReasonStaleHandle, rpcstatus.ReasonStaleHandle},
		{ReasonCanceled, rpcstatus.ReasonCanceled},
		{ReasonDeadlineExceeded, rpcstatus.ReasonDeadlineExceeded},
		{ReasonRegistry, rpcstatus.ReasonRegistry},
		{ReasonRegistryNotAllowed, rpcstatus.ReasonRegistryNotAllowed},
		{ReasonDiskQuotaUnsupported, rpcstatus.ReasonDiskQuotaUnsupported},
		{ReasonOutputLost, rpcstatus.ReasonOutputLost},
		{ReasonPidsLimit, rpcstatus.ReasonPidsLimit},
		{ReasonMemoryLimit, rpcstatus.ReasonMemoryLimit},
		{ReasonDescriptorLimit, rpcstatus.ReasonDescriptorLimit},
		{ReasonContainerdUnavailable, rpcstatus.ReasonContainerdUnavailable},
		{ReasonServerDiskFull, rpcstatus.ReasonServerDiskFull},
		{ReasonServerDescriptors, rpcstatus.ReasonServerDescriptors},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("client token %q, berthd sends %q", tt.got, tt.want)
		}
	}
}
