package integration

import (
	"os"
	"strings"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestGVisorSandbox runs a sandbox under gVisor (runtime "gvisor"): the
// agent starts inside runsc's user-space kernel, berthd reaches it through
// its host socket and verifies it by its secret, and commands run there
// (uname reports gVisor's 4.4.0, not the host's kernel).
func TestGVisorSandbox(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	if sb.GetRuntimeName() != "gvisor" || sb.GetHostUsers() || sb.GetHostIdBase() != 0 {
		t.Errorf("sandbox runtime %q host_users %v host_id_base %d, want gvisor without a host id range", sb.GetRuntimeName(), sb.GetHostUsers(), sb.GetHostIdBase())
	}
	got := run(t, sb.GetId(), "sh", "-c", "uname -r; echo hi")
	if out := string(got.GetStdout()); out != "4.4.0\nhi\n" || got.GetResult().GetExitCode() != 0 {
		t.Errorf("uname -r; echo hi under gVisor: %q (stderr %q, exit %d), want 4.4.0 and hi", out, got.GetStderr(), got.GetResult().GetExitCode())
	}
	// The agent read and removed berthd's secret before anything ran: a
	// workload finds it neither in the run directory nor in PID 1's
	// environment (which gVisor lets a process of the same uid read).
	got = run(t, sb.GetId(), "sh", "-c", "ls -a /.berth-run; tr '\\0' '\\n' </proc/1/environ")
	if out := string(got.GetStdout()); !strings.HasPrefix(out, ".\n..\nagent.sock\n") || strings.Contains(out, "SECRET") {
		log, _ := os.ReadFile(env.rt.LogPath(sb.GetId()))
		t.Errorf("run directory and PID 1's environment under gVisor: %q, want only agent.sock and no secret\nagent log:\n%s", out, log)
	}
}
