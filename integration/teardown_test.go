package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// teardown is the environment's undo list, run once, the last added
// first: when setup returns, or when the test binary gets SIGINT or
// SIGTERM (a run stopped by hand: Ctrl-C, kill, a CI job cancelled).
// Deferred calls run only on a normal return, so a signal used to leave
// the private containerd, its shims and their runc and runsc processes,
// and the btrfs loop mount under the temporary directory behind.
type teardown struct {
	// mu is held by setup while it brings the environment up (adding to
	// fns) and by run, so that a signal during setup tears down what
	// setup has brought up once setup ends.
	mu   sync.Mutex
	fns  []func()
	done bool
}

// add adds f to the undo list; the caller holds td.mu.
func (td *teardown) add(f func()) { td.fns = append(td.fns, f) }

// run calls before, when not nil, and then the undo list, last added
// first; only its first call does anything.
func (td *teardown) run(before func()) {
	td.mu.Lock()
	defer td.mu.Unlock()
	if td.done {
		return
	}
	td.done = true
	if before != nil {
		before()
	}
	for i := len(td.fns) - 1; i >= 0; i-- {
		td.fns[i]()
	}
}

// onSignal has the first SIGINT or SIGTERM kill the test binary's child
// processes (berthd and the like, which tests stop in cleanups that will
// not run now), run the teardown and exit with 128 + the signal's number,
// as a shell reports a death by that signal. A second signal ends the
// binary at once (the default action again). It returns the function
// that stops listening.
func (td *teardown) onSignal() (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case sig := <-sigs:
			signal.Reset(syscall.SIGINT, syscall.SIGTERM)
			fmt.Fprintf(os.Stderr, "integration: %v: tearing down the environment (again to stop at once)\n", sig)
			td.run(killChildren)
			// The tests ran on meanwhile: one may have started a process
			// since.
			killChildren()
			os.Exit(128 + int(sig.(syscall.Signal)))
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// killChildren sends SIGKILL to every process whose parent is this one
// (proc_pid_stat(5): the parent's pid is the second field after the
// command's closing parenthesis).
func killChildren() {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	self := os.Getpid()
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		stat := string(b)
		fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:]) // state, ppid, ...
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder unmounts every mount under dir, deepest first, detaching
// (MNT_DETACH) one that is busy. After a signal, sandboxes of a berthd
// process or of a test's own runtime were never deleted: their roots
// (subvolumes of the btrfs pool) and run directories stay mounted in
// their state directories under dir, which keeps the pool and its loop
// device busy, and os.RemoveAll would go down into them. On a normal
// run there is nothing left to unmount.
func unmountUnder(dir string) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: read mounts under %s: %v\n", dir, err)
		return
	}
	// Deepest first. A path mounted twice (an idmapped root over its
	// source) appears once per mount: each unmount takes the top one.
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return cmp.Compare(len(b.Mountpoint), len(a.Mountpoint)) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, 0); err != nil {
			if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
				fmt.Fprintf(os.Stderr, "integration: unmount %s: %v\n", m.Mountpoint, err)
				continue
			}
		}
		fmt.Fprintf(os.Stderr, "integration: unmounted %s left behind\n", m.Mountpoint)
	}
}

// teardownChildEnv makes TestTeardownOnSignal, in a test binary it runs,
// bring sandboxes up and wait to be signalled.
const teardownChildEnv = "BERTH_TEST_TEARDOWN_CHILD"

// TestTeardownOnSignal runs this test binary with its own environment
// (containerd, a btrfs mount, a sandbox of the in-process berthd, one of
// a berthd process, and one under gVisor), stops it with SIGTERM or
// SIGINT once all are up, and checks that it exited 128 + the signal and
// left nothing behind: no process naming its temporary directory
// (containerd, shims, runsc, berthd), no mount under it, no runc state
// naming it, and the directory gone. Before the teardown ran on signals,
// the containerd and the mounts stayed.
func TestTeardownOnSignal(t *testing.T) {
	if os.Getenv(teardownChildEnv) != "" {
		teardownChild(t)
		return
	}
	need(t)
	if env.containerdDir == "" {
		t.Skip("with BERTH_CONTAINERD_ADDRESS the harness starts no containerd of its own")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(self, "-test.run=^TestTeardownOnSignal$", "-test.v")
			cmd.Env = append(os.Environ(), teardownChildEnv+"=1", "BERTH_E2E=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdin, err := cmd.StdinPipe() // closing it ends the child normally
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			ready := make(chan string, 1)
			var out bytes.Buffer
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					out.WriteString(sc.Text() + "\n")
					if dir, ok := strings.CutPrefix(sc.Text(), "teardown child ready: "); ok {
						ready <- dir
					}
				}
				exited <- cmd.Wait()
			}()
			var dir string
			select {
			case dir = <-ready:
			case err := <-exited:
				t.Fatalf("the child exited before it was ready: %v\n%s%s", err, &out, &stderr)
			case <-time.After(5 * time.Minute):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("the child was not ready within 5 minutes\n%s%s", &out, &stderr)
			}
			before := leftovers(t, dir)
			if len(before.procs) == 0 || len(before.mounts) < 3 || len(before.runc) == 0 {
				t.Fatalf("before %v: processes %q, mounts %q, runc state %q; want containerd and its shims, the btrfs and the sandboxes' roots and runc state", sig, before.procs, before.mounts, before.runc)
			}

			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-exited:
			case <-time.After(3 * time.Minute):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("the child did not exit within 3 minutes of %v\n%s", sig, &stderr)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
				t.Errorf("the child ended with %v after %v; want exit status %d", err, sig, 128+int(sig))
			}
			after := leftovers(t, dir)
			if len(after.procs)+len(after.mounts)+len(after.runc) != 0 {
				t.Errorf("after %v: processes %q, mounts %q, runc state %q left; want none\n%s", sig, after.procs, after.mounts, after.runc, &stderr)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after %v: %s is still there (%v)", sig, dir, err)
			}
			t.Logf("%v: %d processes, %d mounts, %d runc state files torn down", sig, len(before.procs), len(before.mounts), len(before.runc))
		})
	}
}

// teardownChild is TestTeardownOnSignal in the test binary it runs: it
// makes the sandboxes, says so on stdout and waits until stdin closes or
// a signal ends it.
func teardownChild(t *testing.T) {
	need(t)
	newSandbox(t, nil)
	e := startClientBerthd(t, "sig")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage}); err != nil {
		t.Fatalf("create a sandbox through berthd: %v", err)
	}
	if _, err := os.Stat(runscBinary); err == nil {
		newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: "gvisor"})
	}
	fmt.Printf("teardown child ready: %s\n", env.dir)
	io.Copy(io.Discard, os.Stdin)
}

// leftoverSet is what an environment under a directory holds: processes
// whose command line names it, mounts under it, runc and runsc state
// naming it.
type leftoverSet struct{ procs, mounts, runc []string }

// leftovers returns the leftoverSet of dir.
func leftovers(t *testing.T, dir string) leftoverSet {
	t.Helper()
	var l leftoverSet
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir+"/")) {
			l.procs = append(l.procs, filepath.Base(filepath.Dir(p))+" "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
		}
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		l.mounts = append(l.mounts, m.Mountpoint)
	}
	// The child's namespaces are berth-test-<hex>(-sig): their runc state
	// under /run/containerd/runc names the bundles under dir.
	states, _ := filepath.Glob("/run/containerd/runc/berth-test-*/*")
	for _, p := range states {
		filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(dir+"/")) {
					l.runc = append(l.runc, path)
				}
			}
			return nil
		})
	}
	return l
}
