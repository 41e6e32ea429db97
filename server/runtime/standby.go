package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/switchroot"
)

// A fork standby member (SandboxSpec.Standby) is a sandbox made ahead of a
// fork of its parent with the spec that fork's child gets, whose container
// and agent already run when the fork is asked for: `runc create`, `runc
// start` and the agent's start are most of a cold child's cost
// (docs/performance.md "Steps of a fork"). Its container's root is a
// placeholder, standbyRoot: an empty directory that is a shared mount on
// the host, so that what berthd mounts under it later appears inside
// (runc's default root propagation is rslave). Its agent waits on the
// FIFO standbyFIFO in its run directory before it touches its root
// (switchroot.Wait). The member's own snapshot of the image exists and is
// mounted only while its spec is made (the image's /etc/passwd is read
// as for any sandbox).
//
// Once the agent waits, berthd starts the switcher: `berth-agent
// switch-root` run by nsenter(1) as host root in the member's mount
// namespace only, which starts (the Go runtime's and the agent binary's
// start, tens of milliseconds) and waits for a byte on its stdin.
//
// TakeStandby turns the member into the fork's child: the snapshot's
// files are replaced by a writable snapshot of the fork's copy (fillRoot),
// mounted idmapped at rootDir as any child's, bound at
// standbyRoot/.berth-next (it propagates), and the switcher is told to
// switch (switchroot.Switch: the mounts runc made move into the new root,
// pivot_root, the old root is detached and the tree made private, cutting
// the propagation). The agent is told to go on, and the container's
// record then names rootDir as its root and loses the wait, as a cold
// child's, while the agent starts.

// standbyFIFO is the FIFO in a standby member's run directory its agent
// waits on (--standby-wait).
const standbyFIFO = "standby"

// standbyRoot is the placeholder root of standby member id on the host.
func (r *Runtime) standbyRoot(id string) string { return filepath.Join(r.hostDir(id), "standby") }

// ErrStandbyUnsupported means a sandbox of the spec cannot be a standby
// member; the error wrapping it says why.
var ErrStandbyUnsupported = errors.New("no standby member for this spec")

// standbys are the release ends of the standby FIFOs of this berthd's
// standby members, by sandbox id: the agent goes on when Go is written,
// and stops when the FIFO closes without it (this berthd is gone).
type standbys struct {
	mu sync.Mutex
	m  map[string]standbyWait
}

// standbyWait is one standby member waiting: its FIFO's write end, its
// task's host pid, the first host id of its range and its switcher.
type standbyWait struct {
	release *os.File
	pid     uint32
	base    uint32
	sw      *switcher
}

// switcher is a started `berth-agent switch-root` in a standby member's
// mount namespace, waiting for the byte on go that makes it switch; it
// exits without switching when go closes.
type switcher struct {
	cmd   *exec.Cmd
	goEnd *os.File
	out   bytes.Buffer
}

// startSwitcher starts the switcher of the standby member whose agent has
// host pid pid. It holds the member's mount table (an open
// /proc/<pid>/mountinfo, read when it switches) on
// switchroot.MountInfoFD.
func startSwitcher(pid uint32) (*switcher, error) {
	proc := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	table, err := os.Open(proc + "/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("mount table of the standby member: %w", err)
	}
	defer table.Close()
	in, goEnd, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("switcher pipe: %w", err)
	}
	defer in.Close()
	s := &switcher{goEnd: goEnd}
	s.cmd = exec.Command("nsenter", "--mount="+proc+"/ns/mnt", "--", AgentPath, "switch-root")
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = in, &s.out, &s.out
	s.cmd.ExtraFiles = []*os.File{table} // switchroot.MountInfoFD
	if err := s.cmd.Start(); err != nil {
		goEnd.Close()
		return nil, fmt.Errorf("start the switcher: %w", err)
	}
	return s, nil
}

// run makes the switcher switch and waits for it, within ctx.
func (s *switcher) run(ctx context.Context) error {
	if _, err := s.goEnd.Write([]byte{switchroot.Go}); err != nil {
		s.stop()
		return fmt.Errorf("tell the switcher to switch: %w", err)
	}
	s.goEnd.Close()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(s.out.String()))
		}
		return nil
	case <-ctx.Done():
		s.cmd.Process.Kill()
		<-done
		return fmt.Errorf("switch: %w", ctx.Err())
	}
}

// stop ends a switcher that has not switched: it exits when its stdin
// closes, and is killed in case it does not.
func (s *switcher) stop() {
	s.goEnd.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

func (s *standbys) put(id string, w standbyWait) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]standbyWait{}
	}
	s.m[id] = w
}

// take removes and returns member id's wait.
func (s *standbys) take(id string) (standbyWait, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.m[id]
	delete(s.m, id)
	return w, ok
}

// drop closes member id's FIFO end and stops its switcher, if this
// berthd holds them.
func (s *standbys) drop(id string) {
	if w, ok := s.take(id); ok {
		w.release.Close()
		w.sw.stop()
	}
}

// Standby reports whether sandbox id is a standby member this berthd
// holds waiting (one made by an earlier berthd is not: its agent stopped
// when that berthd's FIFO end closed).
func (r *Runtime) Standby(id string) bool {
	r.standbys.mu.Lock()
	defer r.standbys.mu.Unlock()
	_, ok := r.standbys.m[id]
	return ok
}

// CanStandby returns why a standby member of spec (the child of a fork:
// its FromSnapshot is ignored) cannot be made here, nil when it can: it
// wraps ErrStandbyUnsupported.
func (r *Runtime) CanStandby(spec SandboxSpec) error {
	spec.FromSnapshot = ""
	return r.checkStandby(spec)
}

// checkStandby returns why spec cannot be a standby member: it needs an
// idmapped root under runc, and is never restored from memory nor made
// from a stored snapshot.
func (r *Runtime) checkStandby(spec SandboxSpec) error {
	switch {
	case spec.runtime() != RuntimeRunc:
		return fmt.Errorf("%w: it runs under %s (standby members need runc)", ErrStandbyUnsupported, spec.runtime())
	case !spec.userns():
		return fmt.Errorf("%w: host_users", ErrStandbyUnsupported)
	case r.idmapErr != nil:
		return fmt.Errorf("%w: no idmapped roots: %v", ErrStandbyUnsupported, r.idmapErr)
	case spec.FromSnapshot != "" || spec.Fork.MemoryImage != "":
		return fmt.Errorf("%w: a standby member is made from its image", ErrStandbyUnsupported)
	}
	return nil
}

// withStandbyRoot names standby member id's placeholder as its root; it
// comes after every option that reads the root.
func (r *Runtime) withStandbyRoot(id string) oci.SpecOpts {
	return oci.WithRootFSPath(r.standbyRoot(id))
}

// prepareStandby unmounts standby member id's root from rootDir (its
// spec is made) and makes its placeholder root: a directory of the
// sandbox's root (host id base) holding NextDir, bound on itself and
// shared, and the FIFO its agent waits on.
func (r *Runtime) prepareStandby(id string, base uint32) error {
	if err := unmountRoot(r.rootDir(id)); err != nil {
		return err
	}
	root := r.standbyRoot(id)
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("standby root %s: %w", root, err)
	}
	if err := os.Chown(root, int(base), int(base)); err != nil {
		return fmt.Errorf("standby root %s: %w", root, err)
	}
	if err := os.Mkdir(filepath.Join(root, switchroot.NextDir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("standby root %s: %w", root, err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind standby root %s: %w", root, err)
	}
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("share standby root %s: %w", root, err)
	}
	fifo := filepath.Join(r.hostDir(id), "run", standbyFIFO)
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fmt.Errorf("standby fifo: %w", err)
	}
	if err := os.Chown(fifo, int(base), int(base)); err != nil {
		return fmt.Errorf("standby fifo: %w", err)
	}
	return nil
}

// awaitStandby opens standby member id's FIFO for writing, which returns
// once its agent (task pid) opened it for reading, within ctx, and keeps
// that end for TakeStandby.
func (r *Runtime) awaitStandby(ctx context.Context, id string, pid, base uint32) error {
	fifo := filepath.Join(r.hostDir(id), "run", standbyFIFO)
	type opened struct {
		f   *os.File
		err error
	}
	done := make(chan opened, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		done <- opened{f, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return fmt.Errorf("standby fifo of %s: %w", id, o.err)
		}
		sw, err := startSwitcher(pid)
		if err != nil {
			o.f.Close()
			return fmt.Errorf("standby member %s: %w", id, err)
		}
		r.standbys.put(id, standbyWait{release: o.f, pid: pid, base: base, sw: sw})
		return nil
	case <-ctx.Done():
		// A reader of our own ends the blocked open.
		if f, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			if o := <-done; o.f != nil {
				o.f.Close()
			}
			f.Close()
		}
		return fmt.Errorf("wait for the agent of standby member %s: %w", id, ctx.Err())
	}
}

// TakeStandby turns standby member id, which this berthd holds waiting
// (Standby), into the child spec describes (spec.ID is id; spec.FromSnapshot
// the fork's copy, being taken or taken): its root becomes a writable
// snapshot of the copy, mounted idmapped into its own id range, with its
// disk quota, switched under its running agent (switchroot.Switch); its
// agent goes on. It does not wait for the agent: it returns recorded,
// which waits until the member's record has become spec's (owner, labels,
// fork origin, with its root and agent arguments a cold child's), made
// while the agent starts. Steps are recorded in the Phases of ctx
// ("record" by recorded). On an error, of either, the member is unusable:
// the caller deletes it.
func (r *Runtime) TakeStandby(ctx context.Context, spec SandboxSpec) (recorded func() error, err error) {
	id := spec.ID
	c := r.begin(ctx, "take standby member "+id)
	defer c.end(&err)
	ph := phasesOf(ctx)
	w, ok := r.standbys.take(id)
	if !ok {
		return nil, fmt.Errorf("%w: %s is no standby member of this berthd", ErrSandboxNotFound, id)
	}
	defer w.release.Close()
	switched := false
	defer func() {
		if !switched {
			w.sw.stop()
		}
	}()
	c.changes()
	from, err := r.forkCopy(ctx, spec.FromSnapshot)
	if err != nil {
		return nil, err
	}
	if err := r.fillRoot(ctx, id, from); err != nil {
		return nil, fmt.Errorf("snapshot %s from fork copy %s: %w", id, spec.FromSnapshot, err)
	}
	ph.Done("fill")
	if spec.DiskBytes > 0 {
		// The quota was the replaced subvolume's.
		if err := r.limitDisk(ctx, id, spec.DiskBytes); err != nil {
			return nil, fmt.Errorf("disk quota of sandbox %s: %w", id, err)
		}
	}
	if err := r.mountRoot(ctx, id, w.base); err != nil {
		return nil, err
	}
	ph.Done("root")
	placeholder := r.standbyRoot(id)
	if err := bindBeneath(r.rootDir(id), placeholder, strings.TrimLeft(switchroot.NextDir, "/")); err != nil {
		return nil, fmt.Errorf("bind the root of %s into its standby root: %w", id, err)
	}
	step, cancel := c.step()
	defer cancel()
	switched = true
	err = w.sw.run(step)
	// The member's tree is private now (or the member is dropped): the
	// host's mounts of the placeholder go.
	if uerr := unmountRoot(placeholder); uerr != nil && err == nil {
		err = uerr
	}
	if err != nil {
		return nil, fmt.Errorf("switch the root of standby member %s: %w", id, err)
	}
	ph.Done("switch")
	if _, err := w.release.Write([]byte{switchroot.Go}); err != nil {
		return nil, fmt.Errorf("let the agent of %s go on: %w", id, err)
	}
	// While the agent starts.
	done := make(chan error, 1)
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CallBudget)
		defer cancel()
		done <- r.recordTaken(ctx, spec)
	}()
	return func() error {
		err := <-done
		ph.Done("record")
		return err
	}, nil
}

// bindBeneath bind-mounts src on directory name of directory dir, never
// elsewhere: name is resolved beneath dir without following a symbolic
// link (openat2(2) RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, O_PATH) and the
// mount targets that descriptor (its /proc/self/fd link, as runc mounts),
// so that whoever can write dir — a standby member's placeholder root is
// its container root's — cannot swap name for a link to a host path
// between a check and the mount. Errors: openat2's (ENOTDIR, ELOOP or
// EXDEV for a link), mount(2)'s.
func bindBeneath(src, dir, name string) error {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return fmt.Errorf("open %s beneath %s without links: %w", name, dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Mount(src, fmt.Sprintf("/proc/self/fd/%d", fd), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s/%s: %w", src, dir, name, err)
	}
	return nil
}

// recordTaken makes the record of taken standby member spec.ID a cold
// child's: its spec's root is rootDir and its agent waits no more (a
// restart of its task starts as any sandbox's), its labels spec's (the
// labels berthd set at its create — id range, CPUs, secret — stay).
func (r *Runtime) recordTaken(ctx context.Context, spec SandboxSpec) error {
	container, err := r.client.LoadContainer(ctx, spec.ID)
	if err != nil {
		return r.containerError(spec.ID, err)
	}
	s, err := container.Spec(ctx)
	if err != nil {
		return fmt.Errorf("read the spec of %s: %w", spec.ID, err)
	}
	s.Root.Path = r.rootDir(spec.ID)
	if s.Process != nil {
		if i := slices.Index(s.Process.Args, "--standby-wait"); i >= 0 && i+1 < len(s.Process.Args) {
			s.Process.Args = slices.Delete(slices.Clone(s.Process.Args), i, i+2)
		}
	}
	spec.Pooled = false
	labels := spec.labels(time.Now())
	labels[labelPool] = ""
	err = container.Update(ctx, func(_ context.Context, _ *containerd.Client, c *containers.Container) error {
		any, err := typeurl.MarshalAny(s)
		if err != nil {
			return err
		}
		c.Spec = any
		for k, v := range labels {
			if v == "" {
				delete(c.Labels, k)
				continue
			}
			c.Labels[k] = v
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("update the record of %s: %w", spec.ID, err)
	}
	return nil
}
