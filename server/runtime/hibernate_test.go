package runtime

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckpointError: runsc's refusal of a host socket names the socket
// in a line; any other failure is cut to maxCheckpointError bytes.
func TestCheckpointError(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"host socket", `runsc-berth did not terminate successfully: exit status 128: checkpoint failed: encoding error at object transport.connectionedEndpoint{baseEndpoint:transport.baseEndpoint{path:"/workspace/held.sock", ops:{}}}: Cannot save endpoint with bound host socket: path= /x/criu-dump.log: unknown`,
			`runsc checkpoint: a process (its socket /workspace/held.sock) holds a unix socket bound on the host, which gVisor cannot save ("Cannot save endpoint with bound host socket")`},
		{"short", "exit status 1: no such container", "runsc checkpoint: exit status 1: no such container"},
		{"long", strings.Repeat("x", 2000), "runsc checkpoint: " + strings.Repeat("x", maxCheckpointError) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkpointError(errors.New(tt.in)).Error(); got != tt.want {
				t.Errorf("checkpointError(%.40q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
