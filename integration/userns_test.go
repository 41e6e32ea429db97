package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestUserNamespaces checks that a default sandbox's root is an
// unprivileged host id of a range of its own — the host sees its agent and
// its processes under that uid (/proc/PID/status) — that two sandboxes get
// disjoint ranges, that the workload user and file operations work inside
// the range, and that host_users is refused unless the server allows it.
func TestUserNamespaces(t *testing.T) {
	need(t)
	a := newSandbox(t, nil)
	b := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000"})
	if a.GetHostUsers() || a.GetHostIdBase() == 0 || b.GetHostIdBase() == 0 || a.GetHostIdBase() == b.GetHostIdBase() {
		t.Fatalf("host id bases %d and %d (host_users %v), want two distinct non-zero ones", a.GetHostIdBase(), b.GetHostIdBase(), a.GetHostUsers())
	}
	if d := int64(a.GetHostIdBase()) - int64(b.GetHostIdBase()); d%runtime.IDRangeSize != 0 {
		t.Errorf("host id bases %d and %d are not whole ranges apart", a.GetHostIdBase(), b.GetHostIdBase())
	}
	hostUID := func(pid string) string {
		st, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				return strings.Fields(v)[0]
			}
		}
		t.Fatalf("/proc/%s/status has no Uid line", pid)
		return ""
	}
	if got, want := hostUID(fmt.Sprint(a.GetRuntime().GetTaskPid())), fmt.Sprint(a.GetHostIdBase()); got != want {
		t.Errorf("host uid of sandbox %s's agent = %s, want %s", a.GetId(), got, want)
	}

	// A workload process, seen from the host: its uid is the range's.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tt := range []struct {
		sb     *berthv1.Sandbox
		inside uint32
	}{{a, 0}, {b, 1000}} {
		stream, err := env.sandboxes.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
			SandboxId: tt.sb.GetId(), Background: true, Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "30"}}}}}); err != nil {
			t.Fatal(err)
		}
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		hostPID := hostPIDOf(t, tt.sb.GetRuntime().GetTaskPid(), msg.GetStarted().GetPid())
		if got, want := hostUID(hostPID), fmt.Sprint(tt.sb.GetHostIdBase()+tt.inside); got != want {
			t.Errorf("host uid of sandbox %s's sleep (uid %d inside) = %s, want %s", tt.sb.GetId(), tt.inside, got, want)
		}
	}
	got := run(t, b.GetId(), "sh", "-c", "id -u; echo hi >/workspace/f; ls -ln /workspace/f; cat /proc/self/uid_map")
	want := "1000\n-rw-r--r--    1 1000     1000             3"
	if out := string(got.GetStdout()); !strings.HasPrefix(out, want) || !strings.Contains(strings.Join(strings.Fields(out), " "), fmt.Sprintf("0 %d 65536", b.GetHostIdBase())) {
		t.Errorf("workload user in the namespace: %q (stderr %q), want uid 1000 owning its file and the uid map of the range", out, got.GetStderr())
	}

	_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, HostUsers: true})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "host_users")
	_, err = env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, User: "70000"})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "user")
}

// hostPIDOf returns the host pid of the process whose pid inside the
// sandbox of init (host pid) is inner, from /proc/*/status NSpid lines.
func hostPIDOf(t *testing.T, init uint32, inner int64) string {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) == 2 && f[1] == fmt.Sprint(inner) && isDescendant(e.Name(), init) {
					return f[0]
				}
			}
		}
	}
	t.Fatalf("no host process is pid %d in the sandbox of init %d", inner, init)
	return ""
}

// isDescendant reports whether host pid pid descends from host pid init.
func isDescendant(pid string, init uint32) bool {
	for range 64 {
		st, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			return false
		}
		var ppid string
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid = strings.TrimSpace(v)
			}
		}
		if ppid == fmt.Sprint(init) {
			return true
		}
		if ppid == "" || ppid == "0" || ppid == "1" {
			return false
		}
		pid = ppid
	}
	return false
}
