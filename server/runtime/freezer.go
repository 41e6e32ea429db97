package runtime

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
)

// berthd pauses and resumes a runc sandbox through its task's cgroup
// freezer itself, not through containerd: containerd's task.Pause and
// task.Resume go containerd → shim → a `runc pause`/`runc resume` process,
// tens of milliseconds on a small host, where the freezer is one write to
// one cgroup file and, for a thaw, done when written (the kernel's
// Documentation/admin-guide/cgroup-v1/freezer-subsystem.rst: freezer.state
// THAWED, FREEZING, FROZEN; cgroup-v2.rst: cgroup.freeze, and "frozen" in
// cgroup.events). The runc shim is never told: it keeps holding the task
// running, so that it kills and deletes it as any running task, and berthd
// reads whether the task is paused from the freezer (Sandbox.Paused). A
// task that an earlier berthd paused through containerd (which the shim
// holds paused) is resumed through containerd as before. gVisor sandboxes
// are not frozen by a cgroup: `runsc pause` stops the sandbox's sentry,
// through containerd.

// taskFreezer is the freezer of one task's cgroup.
type taskFreezer struct {
	// dir is the cgroup's directory: under the freezer hierarchy (cgroup
	// v1) or the unified one (v2).
	dir string
	v2  bool
}

// freezerOf finds host process pid's freezer from /proc/<pid>/cgroup
// (procfs.CgroupDirsOf). It fails for a process that is gone and for one
// whose cgroups have no freezer.
func freezerOf(pid uint32) (taskFreezer, error) {
	d, err := procfs.CgroupDirsOf(pid)
	if err != nil {
		return taskFreezer{}, fmt.Errorf("cgroup of task %d: %w", pid, err)
	}
	if dir, ok := d.V1["freezer"]; ok {
		return taskFreezer{dir: dir}, nil
	}
	if d.Unified == "" {
		return taskFreezer{}, fmt.Errorf("/proc/%d/cgroup names neither a freezer nor a cgroup v2 hierarchy", pid)
	}
	return taskFreezer{dir: d.Unified, v2: true}, nil
}

// frozen reports whether the cgroup is frozen: FROZEN, or FREEZING (a
// freeze under way, which a thaw ends too), under cgroup v1; "frozen 1" in
// cgroup.events, or cgroup.freeze set, under v2.
func (f taskFreezer) frozen() (bool, error) {
	if !f.v2 {
		st, err := f.v1State()
		return st != "THAWED", err
	}
	b, err := os.ReadFile(f.dir + "/cgroup.freeze")
	if err != nil {
		return false, err
	}
	return bytes.Equal(bytes.TrimSpace(b), []byte("1")), nil
}

func (f taskFreezer) v1State() (string, error) {
	b, err := os.ReadFile(f.dir + "/freezer.state")
	return string(bytes.TrimSpace(b)), err
}

// v2Frozen reads "frozen" of cgroup.events.
func (f taskFreezer) v2Frozen() (bool, error) {
	b, err := os.ReadFile(f.dir + "/cgroup.events")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "frozen "); ok {
			return strings.TrimSpace(v) == "1", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no frozen key", f.dir)
}

// freeze freezes the cgroup and returns once every process in it is frozen.
// Under cgroup v1 the state can stay FREEZING while a process cannot be
// stopped yet (one in an uninterruptible sleep; runc's freezer, libcontainer/
// cgroups/fs/freezer.go, writes FROZEN again and thaws between tries for
// the same reason): it writes FROZEN again every try. When ctx ends first
// the cgroup is thawed and the error says so.
func (f taskFreezer) freeze(ctx context.Context) error {
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		var done bool
		var err error
		if f.v2 {
			if err = os.WriteFile(f.dir+"/cgroup.freeze", []byte("1"), 0); err == nil {
				done, err = f.v2Frozen()
			}
		} else {
			var st string
			if err = os.WriteFile(f.dir+"/freezer.state", []byte("FROZEN"), 0); err == nil {
				st, err = f.v1State()
				done = st == "FROZEN"
			}
		}
		if err != nil {
			f.thaw()
			return fmt.Errorf("freeze cgroup %s: %w", f.dir, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			f.thaw()
			return fmt.Errorf("freeze cgroup %s: its processes were not all frozen: %w", f.dir, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// thaw thaws the cgroup: the kernel thaws its processes as it takes the
// write.
func (f taskFreezer) thaw() error {
	var err error
	if f.v2 {
		err = os.WriteFile(f.dir+"/cgroup.freeze", []byte("0"), 0)
	} else {
		err = os.WriteFile(f.dir+"/freezer.state", []byte("THAWED"), 0)
	}
	if err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", f.dir, err)
	}
	return nil
}

// freezers keeps the freezer of each runc task berthd froze or thawed, by
// sandbox id, so that a resume reads nothing but the sandbox id.
type freezers struct {
	mu sync.Mutex
	m  map[string]knownFreezer
}

type knownFreezer struct {
	pid uint32
	f   taskFreezer
	// ours is set while the cgroup is frozen by berthd's freeze (and not
	// thawed since): a resume then thaws it without asking containerd,
	// which may otherwise hold the task paused itself.
	ours bool
}

// maxFreezers bounds freezers: past it, it starts again empty.
const maxFreezers = 4096

func (k *freezers) get(id string) (knownFreezer, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f, ok := k.m[id]
	return f, ok
}

func (k *freezers) put(id string, pid uint32, f taskFreezer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil || len(k.m) >= maxFreezers {
		k.m = make(map[string]knownFreezer)
	}
	k.m[id] = knownFreezer{pid: pid, f: f}
}

// setOurs records whether berthd froze sandbox id's cgroup (ours).
func (k *freezers) setOurs(id string, ours bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if f, ok := k.m[id]; ok {
		f.ours = ours
		k.m[id] = f
	}
}

func (k *freezers) forget(id string) {
	k.mu.Lock()
	delete(k.m, id)
	k.mu.Unlock()
}
