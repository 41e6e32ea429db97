package client

import (
	"testing"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// TestFileReasonsMatchAgent keeps the file reason tokens equal to the ones
// the agent sends.
func TestFileReasonsMatchAgent(t *testing.T) {
	tests := []struct{ got, want string }{
		{ReasonFileNotFound, rpcstatus.ReasonFileNotFound},
		{ReasonFileExists, rpcstatus.ReasonFileExists},
		{ReasonNotADirectory, rpcstatus.ReasonNotADirectory},
		{ReasonIsADirectory, rpcstatus.ReasonIsADirectory},
		{ReasonDirectoryNotEmpty, rpcstatus.ReasonDirectoryNotEmpty},
		{ReasonFileTooLarge, rpcstatus.ReasonFileTooLarge},
		{ReasonPermissionDenied, rpcstatus.ReasonPermissionDenied},
		{ReasonFileChanged, rpcstatus.ReasonFileChanged},
		{ReasonTarEntryUnsafe, rpcstatus.ReasonTarEntryUnsafe},
		{ReasonTarEntryInvalid, rpcstatus.ReasonTarEntryInvalid},
		{ReasonArchiveInvalid, rpcstatus.ReasonArchiveInvalid},
		{ReasonNotRegularFile, rpcstatus.ReasonNotRegularFile},
		{ReasonListTooLarge, rpcstatus.ReasonListTooLarge},
		{ReasonSymlinkLoop, rpcstatus.ReasonSymlinkLoop},
		{ReasonCrossDevice, rpcstatus.ReasonCrossDevice},
		{ReasonReadOnlyFS, rpcstatus.ReasonReadOnlyFS},
		{ReasonFileBusy, rpcstatus.ReasonFileBusy},
		{ReasonNoSpace, rpcstatus.ReasonNoSpace},
		{ReasonWorkloadUserUnavailable, rpcstatus.ReasonAgentCannotActAsUser},
		{ReasonFileRefused, rpcstatus.ReasonFileRefused},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("client token %q, the agent sends %q", tt.got, tt.want)
		}
	}
}
