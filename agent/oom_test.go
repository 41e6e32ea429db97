package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
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

// startAgentInCgroup starts the agent inside the memory cgroup dir, as in a
// sandbox with a memory limit: it finds its OOM counter there at start.
func startAgentInCgroup(t *testing.T, dir string) *testAgent {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	return startAgentCmd(t, sockDir, []string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir})
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
	a := startAgentInCgroup(t, dir)
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
	a := startAgentInCgroup(t, dir)
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

// TestStartWhoseLauncherIsOOMKilled has the kernel's OOM killer kill the
// launcher while it holds a start: the start fails with RESOURCE_EXHAUSTED
// MEMORY_LIMIT_REACHED saying the sandbox is out of memory, not INTERNAL
// "launcher: EOF" (issue 21, seen in a 64 MiB sandbox), and the next start
// runs from a new launcher.
//
// The kill is real and certain to strike the launcher mid-request: the
// launcher is stopped (SIGSTOP) before the start reaches it; once the
// request waits in its socket its oom_score_adj is set to 1000 (as while it
// forks) and a memory hog at 0 fills the agent's cgroup of 24,000 pages
// (about 94 MiB). The OOM killer picks the launcher first (its badness is
// its pages plus 1000 x (the limit in pages / 1000, rounded down): the
// whole limit, more than the hog can hold beside the agent), then the hog
// (at the agent's score, with many times its memory); the agent reads both
// kills in its cgroup. At 96 MiB (24,576 pages) the rounding left out 576
// pages, which the Go launcher's RSS made up and the native launcher's
// 140 pages do not: the hog was killed alone.
func TestStartWhoseLauncherIsOOMKilled(t *testing.T) {
	dir := memoryCgroup(t, 24000*4096)
	a := startAgentInCgroup(t, dir)
	if r := a.run(t, execID(t)+"-first", shell(`echo first`)); string(r.stdout) != "first\n" {
		t.Fatalf("first exec: stdout %q, result %v; want %q", r.stdout, r.result, "first\n")
	}
	lp := agentbin.LauncherPID(a.pid)
	if lp == 0 {
		t.Fatal("no launcher among the agent's children")
	}
	if err := syscall.Kill(lp, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := a.startExec(t, ctx, execID(t), shell(`echo started`))
	waitForRequest(t, lp)

	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", lp), []byte("1000"), 0); err != nil {
		t.Fatal(err)
	}
	kills := oomKills(t, dir)
	hog := exec.Command("sh", "-c", `echo 0 > /proc/self/oom_score_adj && echo $$ > "$0/cgroup.procs" && exec bash -c 'a=x; while :; do a=$a$a; done'`, dir)
	err := hog.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("memory hog: %v, want killed by SIGKILL (the OOM killer)", err)
	}
	resp, err := stream.Recv()
	if err == nil {
		t.Fatalf("start whose launcher was OOM-killed: got %v, want RESOURCE_EXHAUSTED %s", resp, rpcstatus.ReasonMemoryLimit)
	}
	if status.Code(err) != codes.ResourceExhausted || rpcstatus.Reason(err) != rpcstatus.ReasonMemoryLimit ||
		!strings.Contains(status.Convert(err).Message(), "sandbox is out of memory") {
		t.Errorf("start whose launcher was OOM-killed: %v, want RESOURCE_EXHAUSTED %s saying the sandbox is out of memory", err, rpcstatus.ReasonMemoryLimit)
	}
	if got := oomKills(t, dir); got != kills+2 {
		t.Errorf("OOM kills in the agent's cgroup = %d, want %d: the launcher and the hog", got, kills+2)
	}
	if r := a.run(t, execID(t)+"-after", shell(`echo after`)); string(r.stdout) != "after\n" {
		t.Errorf("exec after the launcher's OOM kill: stdout %q, result %v; want %q", r.stdout, r.result, "after\n")
	}
	if next := agentbin.LauncherPID(a.pid); next == 0 || next == lp {
		t.Errorf("launcher pid after the OOM kill = %d, want a new one (was %d)", next, lp)
	}
}

// waitForRequest waits until a request waits unread in the socket of the
// (stopped) launcher lp: it takes a copy of the launcher's descriptor 3
// (pidfd_getfd(2)) and asks how many bytes are queued (SIOCINQ). The copy
// is closed at once: held, it would keep the socket open after the
// launcher died.
func waitForRequest(t *testing.T, lp int) {
	t.Helper()
	pidfd, err := unix.PidfdOpen(lp, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", lp, err)
	}
	defer unix.Close(pidfd)
	for deadline := time.Now().Add(10 * time.Second); ; {
		fd, err := unix.PidfdGetfd(pidfd, 3, 0)
		if err != nil {
			t.Fatalf("pidfd_getfd(launcher %d, 3): %v", lp, err)
		}
		n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		unix.Close(fd)
		switch {
		case err != nil:
			t.Fatalf("SIOCINQ on the launcher's socket: %v", err)
		case n > 0:
			return
		case time.Now().After(deadline):
			t.Fatal("the start's request did not reach the launcher's socket within 10s")
		}
		time.Sleep(time.Millisecond) // polls a condition, bounded by deadline
	}
}
