package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// readOOMScore returns /proc/PID/oom_score_adj.
func readOOMScore(t testing.TB, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// memoryCgroup makes a cgroup v1 memory cgroup limited to limit bytes,
// without swap, and removes it at cleanup (once its processes are gone). It
// skips the test where that is impossible.
func memoryCgroup(t *testing.T, limit int) string {
	t.Helper()
	const mem = "/sys/fs/cgroup/memory"
	if os.Geteuid() != 0 {
		t.Skip("needs root for a memory cgroup")
	}
	if _, err := os.Stat(filepath.Join(mem, "memory.oom_control")); err != nil {
		t.Skip("needs the cgroup v1 memory controller at " + mem)
	}
	b := make([]byte, 4)
	rand.Read(b)
	dir := filepath.Join(mem, "berth-agent-test-"+hex.EncodeToString(b))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create memory cgroup: %v", err)
	}
	t.Cleanup(func() {
		// The agent and its children exit at their own cleanup, which
		// runs first; their memory may take a moment to be uncharged.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("remove memory cgroup %s: %v", dir, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		err := os.WriteFile(filepath.Join(dir, f), []byte(strconv.Itoa(limit)), 0)
		if err != nil && !(f == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist)) {
			t.Fatalf("set %s: %v", f, err)
		}
	}
	return dir
}

// oomKills reads the oom_kill counter of a cgroup v1 memory cgroup.
func oomKills(t testing.TB, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("%s/memory.oom_control has no oom_kill line", dir)
	return 0
}

// TestOOMKill runs the agent in a 96 MiB memory cgroup, as in a sandbox
// with a memory limit: a memory hog is OOM-killed and reported as such, a
// plain SIGKILL is not, and the agent lives on and runs the next exec.
func TestOOMKill(t *testing.T) {
	dir := memoryCgroup(t, 96<<20)
	sockDir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	// The agent starts inside the cgroup: it finds its counter at start.
	a := startAgentCmd(t, sockDir, []string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir})
	hog := `a=x; while :; do a=$a$a; done`
	tests := []struct {
		name       string
		spec       *berthv1.ProcessSpec
		wantOOM    bool
		wantExit   int32
		wantSignal string
		wantKill   bool // the cgroup counts a kill
	}{
		{"memory hog", &berthv1.ProcessSpec{Argv: []string{"bash", "-c", hog}}, true, 137, "SIGKILL", true},
		{"a shell's child is the victim", &berthv1.ProcessSpec{Argv: []string{"bash", "-c", `bash -c '` + hog + `'; exit $?`}}, true, 137, "", true},
		{"kill -9 is not an OOM kill", shell(`kill -KILL $$`), false, 137, "SIGKILL", false},
		{"the next exec works", shell(`echo ok`), false, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kills := oomKills(t, dir)
			r := a.run(t, execID(t), tt.spec)
			res := r.result
			if res.GetOomKilled() != tt.wantOOM || res.GetExitCode() != tt.wantExit || res.GetSignal() != tt.wantSignal || res.GetTimedOut() {
				t.Errorf("result = %v, want oom_killed %v, exit %d, signal %q, not timed out", res, tt.wantOOM, tt.wantExit, tt.wantSignal)
			}
			if got := oomKills(t, dir) > kills; got != tt.wantKill {
				t.Errorf("cgroup counted an OOM kill: %v, want %v", got, tt.wantKill)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.client.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Fatalf("agent after the OOM kills: %v", err)
	}
	if err := syscall.Kill(a.pid, 0); err != nil {
		t.Fatalf("agent process after the OOM kills: %v", err)
	}
}
