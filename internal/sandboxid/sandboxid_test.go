package sandboxid

import (
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestFromRequest(t *testing.T) {
	a, b := FromRequest("alice", "job-1"), FromRequest("alice", "job-2")
	if a != FromRequest("alice", "job-1") || a == b || !Valid(a) {
		t.Errorf("FromRequest: job-1 %q, job-2 %q; want stable, distinct, valid ids", a, b)
	}
	// Another principal's key names another sandbox.
	if c := FromRequest("bob", "job-1"); c == a {
		t.Errorf("FromRequest(bob, job-1) = %q, the same as alice's", c)
	}
}

func TestSandboxIDOf(t *testing.T) {
	exec := &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: "sb-1"}}}
	if got := Of(exec.ProtoReflect(), 1); got != "sb-1" {
		t.Errorf("Of(exec start) = %q, want sb-1", got)
	}
	if got := Of((&berthv1.GetSandboxRequest{SandboxId: "sb-2"}).ProtoReflect(), 1); got != "sb-2" {
		t.Errorf("Of(get) = %q, want sb-2", got)
	}
	if got := Of((&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Stdin{Stdin: &berthv1.ExecStdin{}}}).ProtoReflect(), 1); got != "" {
		t.Errorf("Of(stdin) = %q, want none", got)
	}
	if got := Of((&berthv1.ListImagesRequest{}).ProtoReflect(), 1); got != "" {
		t.Errorf("Of(list images) = %q, want none", got)
	}
}
