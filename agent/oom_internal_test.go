package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFindOOMCounter(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1Own := write("memory/ns/sb/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
	v1Top := write("memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
	write("memory/old/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n") // kernel < 4.13: no counter
	v2 := write("unified/x/memory.events", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n")

	tests := []struct {
		name      string
		cgroup    string
		root      string
		wantPath  string
		wantCount uint64
	}{
		{"v1 own path (host)", "12:pids:/ns/sb\n11:memory:/ns/sb\n", root, v1Own, 3},
		{"v1 container: own path not mounted, top is the container's", "11:memory:/elsewhere/sb\n", root, v1Top, 7},
		{"v1 joined controllers", "4:memory,hugetlb:/ns/sb\n", root, v1Own, 3},
		{"v1 counter missing", "11:memory:/old\n", filepath.Join(root, "none"), "", 0},
		{"v2", "0::/x\n", filepath.Join(root, "unified"), v2, 1},
		{"no cgroup", "", root, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := findOOMCounter(tt.root, []byte(tt.cgroup))
			if c.path != tt.wantPath {
				t.Fatalf("findOOMCounter path = %q, want %q", c.path, tt.wantPath)
			}
			n, ok := c.count()
			if n != tt.wantCount || ok != (tt.wantPath != "") {
				t.Errorf("count() = %d, %v; want %d, %v", n, ok, tt.wantCount, tt.wantPath != "")
			}
		})
	}
}

func TestOOMVerdict(t *testing.T) {
	killed := unix.WaitStatus(unix.SIGKILL) // terminated by SIGKILL
	exit137 := unix.WaitStatus(137 << 8)    // exited with status 137
	exit1 := unix.WaitStatus(1 << 8)        // exited with status 1
	termed := unix.WaitStatus(unix.SIGTERM) // terminated by SIGTERM
	tests := []struct {
		name          string
		ws            unix.WaitStatus
		before, after uint64
		known, agent  bool
		want          bool
	}{
		{"SIGKILL and the counter rose", killed, 2, 3, true, false, true},
		{"a shell's exit 137 and the counter rose", exit137, 0, 1, true, false, true},
		{"SIGKILL, counter unchanged: someone's kill -9", killed, 2, 2, true, false, false},
		{"SIGKILL sent by the agent", killed, 2, 3, true, true, false},
		{"exit 1 after a child's OOM kill", exit1, 0, 1, true, false, false},
		{"SIGTERM", termed, 0, 1, true, false, false},
		{"no counter", killed, 0, 1, false, false, false},
	}
	for _, tt := range tests {
		if got := oomVerdict(tt.ws, tt.before, tt.after, tt.known, tt.agent, &oomLedger{}); got != tt.want {
			t.Errorf("%s: oomVerdict = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestOOMLedger: one OOM kill counted by the cgroup is one exec's. Execs
// A and B run at once; B is OOM-killed (count 0 -> 1) and settled first;
// A, killed -9 afterwards with the count still 1, gets none. Two kills
// while both ran go to both.
func TestOOMLedger(t *testing.T) {
	var l oomLedger
	if !l.claim(0, 1) {
		t.Error("B, the victim: no kill to take")
	}
	if l.claim(0, 1) {
		t.Error("A, killed -9 after B's OOM kill: took B's kill")
	}
	// Count 1 -> 3 while C and D ran: one each, then none.
	if !l.claim(1, 3) || !l.claim(1, 3) || l.claim(1, 3) {
		t.Error("two kills while C, D and E ran: want one each for the first two, none for the third")
	}
	// A kill before an exec started is not its.
	if l.claim(3, 3) || l.claim(4, 4) {
		t.Error("an exec that started after every kill took one")
	}
	// Settled out of order: F started after kill 4 and died of kill 5, G
	// died of kill 4; F's supervisor finishes first. Each takes its own.
	if !l.claim(4, 5) {
		t.Error("F, settled first: no kill to take")
	}
	if !l.claim(3, 5) {
		t.Error("G, settled after F: kill 4 was left to nobody")
	}
	if l.claim(3, 5) {
		t.Error("a third exec took a kill with both taken")
	}
}

// TestOOMLedgerForgets: the ledger keeps at most maxOOMLedger kills; the
// oldest count as taken once forgotten, and the newest stay free.
func TestOOMLedgerForgets(t *testing.T) {
	var l oomLedger
	for n := uint64(0); n < maxOOMLedger+10; n++ {
		if !l.claim(n, n+1) {
			t.Fatalf("claim(%d, %d) = false, want kill %d", n, n+1, n+1)
		}
	}
	if len(l.taken) != maxOOMLedger || l.floor != 10 {
		t.Errorf("ledger keeps %d kills above floor %d, want %d above 10", len(l.taken), l.floor, maxOOMLedger)
	}
	if l.claim(0, 10) {
		t.Error("a forgotten kill was taken again")
	}
	if !l.claim(0, maxOOMLedger+11) {
		t.Error("kill maxOOMLedger+11, never taken, was refused")
	}
}

func TestSummarizeArgv(t *testing.T) {
	long := strings.Repeat("a", 255) + "€" // the euro sign straddles byte 256
	got, cut := summarizeArgv([]string{"sh", long})
	if len(got) != 2 || got[1] != strings.Repeat("a", 255) || !cut {
		t.Errorf("summarizeArgv(long) = %q, %v; want the last element cut before the euro sign", got, cut)
	}
	got, cut = summarizeArgv([]string{"echo", "hi"})
	if strings.Join(got, " ") != "echo hi" || cut {
		t.Errorf("summarizeArgv(short) = %q, %v; want it unchanged", got, cut)
	}
}

// TestOOMCounterFollows: the counter file, kept open after the first
// count, is read afresh at every count (a cgroup file is made anew by a
// read at offset 0; a regular file here is rewritten in place).
func TestOOMCounterFollows(t *testing.T) {
	p := filepath.Join(t.TempDir(), "memory.events")
	c := &oomCounter{path: p}
	t.Cleanup(c.close)
	for _, want := range []uint64{0, 1, 12, 3} {
		if err := os.WriteFile(p, []byte(fmt.Sprintf("low 0\nhigh 0\nmax 2\noom %d\noom_kill %d\n", want, want)), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, ok := c.count(); n != want || !ok {
			t.Errorf("count() = %d, %v; want %d, true", n, ok, want)
		}
	}
	if !c.ok {
		t.Error("the counter file was not kept open")
	}
}
