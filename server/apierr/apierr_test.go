package apierr

import (
	"fmt"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func boot(n int) string { return fmt.Sprintf("%032x", n) }

func TestConditionMessages(t *testing.T) {
	rt := Runtime{BootID: boot(1), TaskPID: 42}
	tests := []struct {
		err  error
		want []string
	}{
		{&FleetBusy{SandboxID: "sb", Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_MEMORY, Limit: 300, InUse: 250, Requested: 100, RetryDelay: time.Second},
			[]string{"sandbox sb", "250", "100", "300", "nothing was started", "1s"}},
		{&Unreachable{SandboxID: "sb", What: "the agent did not answer", Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED},
			[]string{"sandbox sb", "did not answer", "nothing ran"}},
		{&Unreachable{SandboxID: "sb", What: "the stream broke", Admitted: berthv1.Admitted_ADMITTED_STARTED},
			[]string{"had started"}},
		{&Unreachable{SandboxID: "sb", ExecID: "ex", What: "the stream broke", Admitted: berthv1.Admitted_ADMITTED_UNKNOWN},
			[]string{"the start reached the agent"}},
		{&RuntimeReplaced{SandboxID: "sb", ExecID: "ex", Cause: berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED, Before: rt, ExitStatus: 137, OOMKilled: true, After: Runtime{BootID: boot(2), TaskPID: 43}},
			[]string{"sandbox sb", "task exited with status 137", "OOM", "exec ex", "processes are gone", "task pid 43"}},
		{&RuntimeReplaced{SandboxID: "sb", ExecID: "ex", Cause: berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED, Before: rt, Restarting: true},
			[]string{"starting a new task"}},
		{&StaleHandle{SandboxID: "sb", ExecID: "ex", Handle: rt, Current: Runtime{BootID: boot(2)}},
			[]string{"exec ex", "earlier runtime", "sandbox sb", "start a new exec"}},
	}
	for _, tt := range tests {
		msg := tt.err.Error()
		for _, w := range tt.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%T message %q lacks %q", tt.err, msg, w)
			}
		}
	}
}
