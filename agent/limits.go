package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Bounds of the default retained-output budget (Config.RetainedBytes): an
// eighth of the sandbox's memory, within these.
const (
	minRetainedBytes = 4 << 20
	maxRetainedBytes = 256 << 20
)

// defaultRetainedBytes returns the retained-output budget for a sandbox whose
// memory limit is limit bytes (0: none): an eighth of it, so that retained
// output never takes the memory the workload was promised, within
// minRetainedBytes..maxRetainedBytes.
func defaultRetainedBytes(limit uint64) uint64 {
	if limit == 0 {
		return maxRetainedBytes
	}
	return min(max(limit/8, minRetainedBytes), maxRetainedBytes)
}

// memoryLimit returns the memory limit in bytes of the cgroup whose OOM
// counter is at counterPath (see findOOMCounter), 0 when there is none or
// it cannot be read: memory.max next to memory.events on cgroup v2,
// memory.limit_in_bytes next to memory.oom_control on v1. A v1 "no limit"
// is a huge number; anything from 2^62 up counts as none.
func memoryLimit(counterPath string) uint64 {
	var name string
	switch filepath.Base(counterPath) {
	case "memory.events":
		name = "memory.max"
	case "memory.oom_control":
		name = "memory.limit_in_bytes"
	default:
		return 0
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(counterPath), name))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n >= 1<<62 {
		return 0 // "max", or v1's "unlimited"
	}
	return n
}

// RaiseNofile raises the agent's own soft RLIMIT_NOFILE to its hard limit
// (setrlimit(2); the hard limit is the container's, set by the OCI spec) and
// returns the limit it has: each running exec holds two or three
// descriptors in the agent. The processes it starts get Config.WorkloadNofile
// as their soft limit instead. Go's runtime raises the soft limit at start
// too; doing it here makes the value the agent runs with explicit.
func RaiseNofile() (unix.Rlimit, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return lim, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return lim, fmt.Errorf("setrlimit RLIMIT_NOFILE to %d: %w", lim.Max, err)
		}
	}
	return lim, nil
}
