package agent_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/agent"
	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/e2e"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// procCaps returns the Cap* lines of /proc/self/status as the process
// running spec sees them.
func procCaps(t *testing.T, a *testAgent, id string) map[string]string {
	t.Helper()
	spec := shell("cat /proc/self/status")
	spec.Cwd = "/"
	r := a.run(t, id, spec)
	caps := map[string]string{}
	for _, line := range strings.Split(string(r.stdout), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(k, "Cap") {
			caps[k] = strings.TrimSpace(v)
		}
	}
	return caps
}

// TestChildrenHoldNoCapabilities runs the agent as root with every
// capability and checks that a uid 0 child, and a child of another user,
// hold none: the agent locked SECBIT_NOROOT and emptied its bounding set.
func TestChildrenHoldNoCapabilities(t *testing.T) {
	e2e.NeedRoot(t, "an agent with capabilities to withhold")
	bin := agentBin
	if agentbin.RaceEnabled {
		// The race-enabled agent is a cgo build, which cannot change every
		// thread's capabilities (syscall.AllThreadsSyscall): test the
		// static one that ships.
		dir := t.TempDir()
		var err error
		if bin, err = agentbin.BuildStatic(dir, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		prefix []string
		flags  []string
	}{
		{"root", nil, nil},
		{"user 65534", nil, []string{"--user", "65534:65534"}},
		// A sandbox's agent starts with a few capabilities in its bounding
		// set (runtime.AgentCapabilities); LockCapabilities drops only
		// those, and the child must hold none either.
		{"few in the bounding set", []string{"setpriv", "--bounding-set", "-all,+chown,+dac_override,+dac_read_search,+fowner,+setuid,+setgid,+setpcap,+kill"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "ag")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if len(tc.prefix) > 0 {
				if _, err := exec.LookPath(tc.prefix[0]); err != nil {
					t.Skipf("%s (util-linux) is not installed", tc.prefix[0])
				}
			}
			a := startAgentBinary(t, bin, dir, tc.prefix, tc.flags...)
			caps := procCaps(t, a, "caps")
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if caps[k] != "0000000000000000" {
					t.Errorf("child %s = %q, want 0000000000000000 (all: %v)", k, caps[k], caps)
				}
			}
		})
	}
}

// TestInfoActivity checks the idle-timeout inputs Info reports: a running
// exec is counted while it runs, and its end moves last_activity.
func TestInfoActivity(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetRunningExecs() != 0 || info.GetLastActivity() != nil || info.GetBuild() == "" || info.GetVersion() != testVersion {
		t.Fatalf("fresh Info = %v, want 0 running, no last activity, a build and version %s", info, testVersion)
	}
	before := time.Now()
	stream, err := a.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: "sleeper", Process: shell("sleep 0.5")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // started
		t.Fatal(err)
	}
	info, err = a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetRunningExecs() != 1 {
		t.Errorf("Info during sleep: running_execs = %d, want 1", info.GetRunningExecs())
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetExited() != nil {
			break
		}
	}
	info, err = a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if last := info.GetLastActivity().AsTime(); info.GetRunningExecs() != 0 || last.Before(before.Add(400*time.Millisecond)) {
		t.Errorf("Info after the exec: running_execs %d, last_activity %v; want 0 and at least 0.4s after %v (the exec's end)", info.GetRunningExecs(), last, before)
	}
}

// TestReserveThreads checks that the threads ReserveThreads makes stay.
func TestReserveThreads(t *testing.T) {
	agent.ReserveThreads(24)
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			if n, _ := strconv.Atoi(strings.TrimSpace(v)); n < 24 {
				t.Errorf("threads after ReserveThreads(24) = %d, want at least 24", n)
			}
			return
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
}
