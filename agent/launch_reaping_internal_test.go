package agent

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSupervisorLost: of the pids a dead reaping launcher left unreported,
// lost ends with exit code 255 the owned one that is not the agent's child
// (its launcher reaped it and died), and leaves the agent's own child (re-parented to it) to
// reap.
func TestSupervisorLost(t *testing.T) {
	child := exec.Command("sleep", "100")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	notOurs := os.Getppid() // alive, and not this process's child
	s := newSupervisor()
	ours, theirs := make(chan exitStatus, 1), make(chan exitStatus, 1)
	s.own(child.Process.Pid, ours)
	s.own(notOurs, theirs)
	if got := s.lost([]int{child.Process.Pid, notOurs, 999999}); !slices.Equal(got, []int{notOurs}) {
		t.Errorf("lost = %v, want only %d (not a child)", got, notOurs)
	}
	select {
	case st := <-theirs:
		if !st.ws.Exited() || st.ws.ExitStatus() != exitLost {
			t.Errorf("lost status = %v, want exit %d", st.ws, exitLost)
		}
	default:
		t.Error("the lost pid's owner got no status")
	}
	select {
	case st := <-ours:
		t.Errorf("the agent's own running child got status %v, want none (reap settles it)", st.ws)
	default:
	}
	if _, ok := s.owners[child.Process.Pid]; !ok {
		t.Error("the agent's own child was dropped from owners")
	}
}

// TestIsReaped: neither a running process nor a zombie is reaped; a
// process waited for is.
func TestIsReaped(t *testing.T) {
	if isReaped(os.Getpid()) {
		t.Error("isReaped(self) = true")
	}
	c := exec.Command("true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("`true` did not exit in 30 s")
		}
	}
	if isReaped(pid) {
		t.Error("isReaped = true for a zombie")
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if !isReaped(pid) {
		t.Error("isReaped = false for a process waited for")
	}
}
