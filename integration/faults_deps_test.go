package integration

import (
	"context"
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

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

// privateContainerd is a containerd this test started for itself in its
// own directory (scripts/containerd.sh), so that stopping or pausing it
// touches no other test's or engineer's instance. Cleanup stops it with
// every task it ran.
type privateContainerd struct {
	dir, sock string
}

func startPrivateContainerd(t *testing.T, name string) *privateContainerd {
	t.Helper()
	c := &privateContainerd{dir: filepath.Join(env.dir, name)}
	c.sock = filepath.Join(c.dir, "containerd.sock")
	c.script(t, "start")
	t.Cleanup(func() { c.script(t, "stop") })
	return c
}

func (c *privateContainerd) script(t *testing.T, cmd string) {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(env.repo, "scripts", "containerd.sh"), cmd, c.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("containerd.sh %s %s: %v\n%s", cmd, c.dir, err, out)
	}
}

// pid returns the daemon's pid, from the pid file containerd.sh wrote.
func (c *privateContainerd) pid(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// kill stops the daemon alone with SIGTERM and waits for it to exit; its
// shims, and so the sandboxes' tasks, keep running.
func (c *privateContainerd) kill(t *testing.T) {
	t.Helper()
	pid := c.pid(t)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !poll(15*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		t.Fatalf("containerd pid %d still runs 15 s after SIGTERM", pid)
	}
}

// wantDependency checks that err is a *client.DependencyError for dep
// failing with fault, with code, whose call changed nothing, returned
// within the budget (plus a second).
func wantDependency(t *testing.T, what string, err error, took time.Duration, code codes.Code, dep berthv1.Dependency, fault berthv1.DependencyFault, budget time.Duration) {
	t.Helper()
	wantDependencyAdmitted(t, what, err, took, code, dep, fault, budget, berthv1.Admitted_ADMITTED_NOT_STARTED)
}

// wantDependencyAdmitted is wantDependency for a call that took effect as
// admitted says.
func wantDependencyAdmitted(t *testing.T, what string, err error, took time.Duration, code codes.Code, dep berthv1.Dependency, fault berthv1.DependencyFault, budget time.Duration, admitted berthv1.Admitted) {
	t.Helper()
	var de *client.DependencyError
	if !errors.As(err, &de) {
		t.Errorf("%s: %v (%T), want a *client.DependencyError", what, err, err)
		return
	}
	d := de.Detail
	if de.Code != code || d.GetDependency() != dep || d.GetFault() != fault || d.GetOperation() == "" || d.GetServerVersion() == "" {
		t.Errorf("%s: %v, detail %v; want %v with %v %v naming the operation", what, err, d, code, dep, fault)
	}
	if d.GetAdmitted() != admitted || de.NothingRan() != (admitted == berthv1.Admitted_ADMITTED_NOT_STARTED) {
		t.Errorf("%s: admitted %v, want %v", what, d.GetAdmitted(), admitted)
	}
	if took > budget+time.Second {
		t.Errorf("%s: failed after %v, want within the budget of %v (+1 s)", what, took, budget)
	}
}

// TestContainerdDown stops, then pauses, a containerd of the test's own
// under a berthd: every call that needs containerd fails UNAVAILABLE
// CONTAINERD_UNAVAILABLE with a DependencyFailure detail (fault
// UNREACHABLE while it is down, SLOW while it is stopped with SIGSTOP,
// after the containerd budget), never INTERNAL; execs and file calls in a
// sandbox berthd reached before keep working; everything works again once
// containerd is back.
func TestContainerdDown(t *testing.T) {
	need(t)
	const budget = time.Second
	cd := startPrivateContainerd(t, "cdd")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rt, err := runtime.New(ctx, runtime.Config{Address: cd.sock, Namespace: env.namespace, StateDir: filepath.Join(env.dir, "cdd-st"),
		AgentBinary: env.agentBinary, CallBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f, err := os.Open(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.ImportImage(ctx, f, "")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := dialClient(t, serveService(t, server.Config{TaskRestartLimit: -1}, rt))
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetId()
	works := func(t *testing.T) {
		t.Helper()
		res, err := c.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}})
		if err != nil || string(res.GetStdout()) != "ok\n" {
			t.Errorf("Run in the sandbox: %q, %v; want it working", res.GetStdout(), err)
		}
		if _, err := c.Stat(ctx, id, "/workspace"); err != nil {
			t.Errorf("Stat in the sandbox: %v", err)
		}
	}
	works(t)

	calls := []struct {
		name string
		call func() error
	}{
		{"GetSandbox", func() error { _, err := c.GetSandbox(ctx, id); return err }},
		{"ListSandboxes", func() error {
			for _, err := range c.ListSandboxes(ctx, nil) {
				if err != nil {
					return err
				}
			}
			return nil
		}},
		{"CreateSandbox", func() error {
			_, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, SandboxId: shortID("cdd")})
			return err
		}},
		{"DeleteSandbox", func() error { return c.DeleteSandbox(ctx, id) }},
		{"ListImages", func() error { _, err := c.ListImages(ctx); return err }},
		{"KeepAlive", func() error { _, err := c.KeepAlive(ctx, id, time.Minute); return err }},
	}
	check := func(t *testing.T, fault berthv1.DependencyFault) {
		for _, tc := range calls {
			began := time.Now()
			err := tc.call()
			wantDependency(t, tc.name, err, time.Since(began), codes.Unavailable, berthv1.Dependency_DEPENDENCY_CONTAINERD, fault, budget)
		}
	}

	t.Run("down", func(t *testing.T) {
		cd.kill(t)
		check(t, berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE)
		works(t)
		// A berthd that has not reached the sandbox yet (one started while
		// containerd is down) needs containerd's record first: its file
		// operations and execs are the same typed failure, not INTERNAL.
		fresh := dialClient(t, serveService(t, server.Config{TaskRestartLimit: -1, JournalDir: t.TempDir()}, rt))
		for _, tc := range []struct {
			name string
			call func() error
		}{
			{"Stat on a fresh berthd", func() error { _, err := fresh.Stat(ctx, id, "/workspace"); return err }},
			{"Run on a fresh berthd", func() error {
				_, err := fresh.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"true"}})
				return err
			}},
		} {
			began := time.Now()
			err := tc.call()
			wantDependency(t, tc.name, err, time.Since(began), codes.Unavailable, berthv1.Dependency_DEPENDENCY_CONTAINERD,
				berthv1.DependencyFault_DEPENDENCY_FAULT_UNREACHABLE, budget)
		}
		cd.script(t, "start")
		if !poll(15*time.Second, func() bool { _, err := c.GetSandbox(ctx, id); return err == nil }) {
			t.Fatal("GetSandbox still fails 15 s after containerd came back")
		}
		works(t)
	})
	t.Run("stopped", func(t *testing.T) {
		pid := cd.pid(t)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if !poll(5*time.Second, func() bool { return processStopped(uint32(pid)) }) {
			t.Fatal("containerd did not stop within 5 s of SIGSTOP")
		}
		continued := false
		defer func() {
			if !continued {
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}()
		check(t, berthv1.DependencyFault_DEPENDENCY_FAULT_SLOW)
		works(t)
		syscall.Kill(pid, syscall.SIGCONT)
		continued = true
		if _, err := c.GetSandbox(ctx, id); err != nil {
			t.Errorf("GetSandbox after SIGCONT: %v", err)
		}
	})
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Errorf("DeleteSandbox once containerd is back: %v", err)
	}
	if _, err := c.GetSandbox(ctx, id); !isNotFound(err) {
		t.Errorf("GetSandbox after the delete: %v, want NOT_FOUND", err)
	}
}

func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == codes.NotFound
}

// TestServerDiskFull puts berthd's state directory on a small tmpfs of the
// test's own and fills it: CreateSandbox fails RESOURCE_EXHAUSTED
// SERVER_DISK_FULL with a DependencyFailure detail (nothing changed), not
// INTERNAL; a sandbox made before keeps running execs; once space is freed,
// creates work again.
func TestServerDiskFull(t *testing.T) {
	need(t)
	stateDir := filepath.Join(env.dir, "dfull")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=128,mode=0700", "berth-test-dfull", stateDir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs at %s: %v: %s", stateDir, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := runtime.New(ctx, runtime.Config{Address: env.containerd, Namespace: env.namespace + "-dfull", StateDir: stateDir, AgentBinary: env.agentBinary})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: sandboxes go, then the runtime, then the
	// mount.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", stateDir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", stateDir, err, out)
		}
	})
	t.Cleanup(func() { rt.Close() })
	t.Cleanup(func() {
		sbs, _ := rt.List(context.Background(), nil)
		for _, sb := range sbs {
			rt.Delete(context.Background(), sb.ID)
		}
	})
	f, err := os.Open(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.ImportImage(ctx, f, "")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := dialClient(t, serveService(t, server.Config{TaskRestartLimit: -1}, rt))
	before, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	// Fill it: inodes and blocks.
	fill := filepath.Join(stateDir, "fill")
	if err := os.Mkdir(fill, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		err := os.WriteFile(filepath.Join(fill, strconv.Itoa(i)), make([]byte, 64<<10), 0o600)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil || i > 10000 {
			t.Fatalf("filling %s: %v after %d files", stateDir, err, i)
		}
	}
	for i := 0; ; i++ {
		err := os.Mkdir(filepath.Join(fill, fmt.Sprintf("d%d", i)), 0o700)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil || i > 10000 {
			t.Fatalf("filling the inodes of %s: %v after %d directories", stateDir, err, i)
		}
	}
	began := time.Now()
	_, err = c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	wantDependency(t, "CreateSandbox on a full disk", err, time.Since(began), codes.ResourceExhausted, berthv1.Dependency_DEPENDENCY_SERVER_DISK, berthv1.DependencyFault_DEPENDENCY_FAULT_FULL, 0)
	if res, err := c.Run(ctx, before.GetId(), &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}}); err != nil || string(res.GetStdout()) != "ok\n" {
		t.Errorf("Run in a sandbox made before the disk filled: %q, %v", res.GetStdout(), err)
	}
	if err := os.RemoveAll(fill); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image}); err != nil {
		t.Errorf("CreateSandbox once space is free: %v", err)
	}
}

// TestServerOutOfDescriptors lowers the open-file limit of a berthd (the
// real binary, a process of the test's own) to 0, so it opens nothing: a
// CreateSandbox, whose new agent connection needs a descriptor, fails
// RESOURCE_EXHAUSTED SERVER_DESCRIPTORS_EXHAUSTED at once, not after the
// agent-ready timeout as an unreachable agent; a sandbox it is connected
// to keeps running execs; with the limit back, creates work.
func TestServerOutOfDescriptors(t *testing.T) {
	need(t)
	rt, ns, stateDir := newNamespaceRuntime(t, "fds")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, "fds.sock")}
	p := startBerthd(t, e)
	e.importBase(t)
	c := dialClient(t, "unix://"+e.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	connected, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.cmd.Process.Pid
	var old syscall.Rlimit
	if err := prlimitNofile(pid, nil, &old); err != nil {
		t.Fatal(err)
	}
	// A limit of 0 leaves every descriptor berthd has open usable and lets
	// it open none (getrlimit(2): an open fails EMFILE when the lowest free
	// number is not below the limit). A limit at the lowest free number
	// would not be deterministic: a descriptor closed below it in the
	// meantime (a finished import's stream) lets one more open succeed,
	// and the create then fails at a later step (CI saw it pass admission
	// and fail at the idmapped mount).
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	if err := prlimitNofile(pid, &syscall.Rlimit{Cur: 0, Max: old.Max}, nil); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := prlimitNofile(pid, &old, nil); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()
	t.Logf("berthd pid %d: %d descriptors open, limit lowered to 0 (was %d)", pid, len(entries), old.Cur)

	began := time.Now()
	_, err = c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	// Admission lists the volumes first (on btrfs): that open fails and
	// nothing is made. Without volumes (overlayfs) the container was made
	// before the connection failed, and removed as far as berthd could
	// without descriptors: in part.
	admitted := berthv1.Admitted_ADMITTED_UNKNOWN
	if env.snapshotter == "btrfs" {
		admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
	}
	wantDependencyAdmitted(t, "CreateSandbox without descriptors", err, time.Since(began), codes.ResourceExhausted,
		berthv1.Dependency_DEPENDENCY_SERVER_DESCRIPTORS, berthv1.DependencyFault_DEPENDENCY_FAULT_EXHAUSTED, 2*time.Second, admitted)
	if res, err := c.Run(ctx, connected.GetId(), &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}}); err != nil || string(res.GetStdout()) != "ok\n" {
		t.Errorf("Run in a sandbox berthd is connected to: %q, %v", res.GetStdout(), err)
	}
	restore()
	if _, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image}); err != nil {
		t.Errorf("CreateSandbox with the limit back: %v", err)
	}
}

// prlimitNofile sets (when set is not nil) and reads (when old is not nil)
// the RLIMIT_NOFILE of process pid (prlimit(2)).
func prlimitNofile(pid int, set, old *syscall.Rlimit) error {
	var n, o *unix.Rlimit
	if set != nil {
		n = &unix.Rlimit{Cur: set.Cur, Max: set.Max}
	}
	if old != nil {
		o = &unix.Rlimit{}
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, n, o); err != nil {
		return fmt.Errorf("prlimit(%d, RLIMIT_NOFILE): %w", pid, err)
	}
	if old != nil {
		old.Cur, old.Max = o.Cur, o.Max
	}
	return nil
}
