// Package agentbin builds the real berth-agent binary for tests, so that
// the agent's own tests, its files tests and the integration tests run the
// binary that ships rather than a fake. Tests only.
package agentbin

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/berth-sandbox/berth/agent/launcher"
)

// Build compiles cmd/berth-agent into dir/berth-agent and returns its path.
// The binary is static (CGO_ENABLED=0) as shipped, except under the race
// detector: the agent runs in its own process, out of reach of the test
// binary's race detector, so it then gets its own (which needs cgo).
// ldflags, when not empty, is passed as -ldflags.
func Build(dir, ldflags string) (string, error) {
	return build(dir, ldflags, RaceEnabled)
}

// BuildTagged is Build with the build tags tags (comma-separated), for a
// test build of the agent (berth_older_agent: an agent older than berthd).
func BuildTagged(dir, ldflags, tags string) (string, error) {
	return build(dir, ldflags, RaceEnabled, "-tags", tags)
}

// BuildStatic is Build without the race detector even under it: the
// static binary that ships, for what a cgo build cannot do (change every
// thread's capabilities with syscall.AllThreadsSyscall).
func BuildStatic(dir, ldflags string) (string, error) {
	return build(dir, ldflags, false)
}

func build(dir, ldflags string, race bool, extra ...string) (string, error) {
	bin := filepath.Join(dir, "berth-agent")
	args := append([]string{"build", "-o", bin}, extra...)
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	cgo := "CGO_ENABLED=0"
	if race {
		args = append(args, "-race")
		cgo = "CGO_ENABLED=1"
	}
	cmd := exec.Command("go", append(args, "github.com/berth-sandbox/berth/cmd/berth-agent")...)
	cmd.Env = append(os.Environ(), cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build berth-agent: %v\n%s", err, out)
	}
	return bin, nil
}

// Buffer is a bytes.Buffer safe for concurrent writers and readers, for
// collecting a child process's log.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// LauncherPID returns the host pid of the launcher of the agent with host
// pid agent: the agent's child whose argv[0] is launcher.Arg0 (the agent
// starts it with its first exec), or 0 when there is none.
func LauncherPID(agent int) int {
	return ChildPID(agent, launcher.Arg0+"\x00")
}

// ChildPID returns the host pid of a child of host process parent whose
// command line (/proc/<pid>/cmdline: NUL-terminated arguments) begins with
// prefix, or 0 when there is none.
func ChildPID(parent int, prefix string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		i := bytes.LastIndexByte(stat, ')')
		if !bytes.HasPrefix(cmdline, []byte(prefix)) || i < 0 || i+2 > len(stat) {
			continue
		}
		var state string
		var ppid int
		if _, err := fmt.Sscanf(string(stat[i+2:]), "%s %d", &state, &ppid); err == nil && ppid == parent {
			return pid
		}
	}
	return 0
}
