package integration

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestExecWaitsForTaskRestart kills a sandbox's agent (its task's PID 1,
// so the task exits and berthd starts a new one) and, as soon as the
// process is gone, sends a Run and an Exec start straight over gRPC (no
// client retries): each waits for the new task's agent and runs there,
// rather than failing ABORTED RUNTIME_REPLACED while the restart is under
// way (docs/exec-contract.md).
func TestExecWaitsForTaskRestart(t *testing.T) {
	need(t)
	for _, how := range []string{"run", "exec"} {
		t.Run(how, func(t *testing.T) {
			sb := newSandbox(t, nil)
			id, before := sb.GetId(), sb.GetRuntime()
			pid := before.GetTaskPid()
			signalAgent(t, pid, syscall.SIGKILL)
			if !poll(30*time.Second, func() bool { return processGone(pid) }) {
				t.Fatalf("agent pid %d still there 30 s after SIGKILL", pid)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			spec := &berthv1.ProcessSpec{ShellCommand: "echo after the restart"}
			var stdout string
			switch how {
			case "run":
				res, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: spec})
				if err != nil {
					t.Fatalf("Run sent while the task was being restarted: %v; want it to wait for the new agent and run", err)
				}
				stdout = string(res.GetStdout())
			case "exec":
				c := openExec(t, env.sandboxes, startReq(id, "", spec), 0)
				ev := c.wait()
				stdout = string(ev.stdout)
			}
			if stdout != "after the restart\n" {
				t.Errorf("stdout %q, want %q", stdout, "after the restart\n")
			}
			now, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
			if err != nil {
				t.Fatal(err)
			}
			if boot := now.GetSandbox().GetRuntime().GetAgentBootId(); boot == "" || boot == before.GetAgentBootId() {
				t.Errorf("agent boot id %q after the restart, want a new one (before: %q)", boot, before.GetAgentBootId())
			}
		})
	}
}

// processGone reports whether host process pid has exited: no
// /proc/<pid>, or a zombie.
func processGone(pid uint32) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	var state byte
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			state = b[i+2]
			break
		}
	}
	return state == 'Z' || state == 'X'
}
