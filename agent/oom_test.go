package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/e2e"
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

// memoryCgroup makes a memory cgroup limited to limit bytes, without swap —
// cgroup v1 (memory.limit_in_bytes) or v2 (memory.max) — and removes it at
// cleanup (once its processes are gone). Without root or a memory
// controller the test cannot run (e2e.Missing).
func memoryCgroup(t *testing.T, limit int) string {
	t.Helper()
	e2e.NeedRoot(t, "a memory cgroup")
	b := make([]byte, 4)
	rand.Read(b)
	name := "berth-agent-test-" + hex.EncodeToString(b)
	var dir string
	var limits []string
	switch {
	case fileExists("/sys/fs/cgroup/memory/memory.oom_control"):
		dir = filepath.Join("/sys/fs/cgroup/memory", name)
		limits = []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		// cgroup v2: the root must hand the memory controller down.
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0); err != nil {
			e2e.Missing(t, "enable the cgroup v2 memory controller: "+err.Error())
		}
		dir = filepath.Join("/sys/fs/cgroup", name)
		limits = []string{"memory.max", "memory.swap.max"}
	default:
		e2e.Missing(t, "no cgroup v1 memory controller or cgroup v2 at /sys/fs/cgroup")
	}
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
	for i, f := range limits {
		v := strconv.Itoa(limit)
		if f == "memory.swap.max" {
			v = "0"
		}
		err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0)
		// The second limit, of swap, exists only where swap is accounted.
		if err != nil && !(i == 1 && errors.Is(err, os.ErrNotExist)) {
			t.Fatalf("set %s: %v", f, err)
		}
	}
	return dir
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// oomKills reads the oom_kill counter of a memory cgroup: in
// memory.oom_control (v1) or memory.events (v2).
func oomKills(t testing.TB, dir string) int {
	t.Helper()
	file := filepath.Join(dir, "memory.oom_control")
	if !fileExists(file) {
		file = filepath.Join(dir, "memory.events")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("%s has no oom_kill line", file)
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

// TestOOMKillAttributedToItsExec runs a bystander beside a memory hog in
// one memory cgroup: the hog is OOM-killed and reported so; the bystander,
// killed with kill -9 afterwards, is not — the cgroup's counter rose while
// it ran, but that kill was the hog's.
func TestOOMKillAttributedToItsExec(t *testing.T) {
	dir := memoryCgroup(t, 96<<20)
	sockDir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	a := startAgentCmd(t, sockDir, []string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bystander := a.startExec(t, ctx, "bystander", shell(`exec sleep 100`))
	resp, err := bystander.Recv()
	if err != nil || resp.GetStarted() == nil {
		t.Fatalf("bystander: %v, %v; want started", resp, err)
	}
	pid := resp.GetStarted().GetPid()

	hog := a.run(t, "hog", &berthv1.ProcessSpec{Argv: []string{"bash", "-c", `a=x; while :; do a=$a$a; done`}})
	if !hog.result.GetOomKilled() {
		t.Fatalf("hog result = %v, want oom_killed", hog.result)
	}
	a.run(t, "killer", shell(fmt.Sprintf("kill -KILL %d", pid)))
	r := collect(t, bystander, &execRun{started: resp.GetStarted()})
	if r.result.GetOomKilled() || r.result.GetSignal() != "SIGKILL" {
		t.Errorf("bystander result = %v, want killed by SIGKILL and not oom_killed: the OOM kill was the hog's", r.result)
	}
}
