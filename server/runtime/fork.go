package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

// A fork (ForkSandbox) copies the parent's root once, as a read-only
// btrfs snapshot taken under a freeze (snapshotFrozen), into a directory
// of berthd's own beside containerd's snapshotter state:
// <snapshotter root>/berth-forks/<namespace>/fork-<20 hex digits>/root,
// with a file "holder" naming the berthd process that made it. No
// containerd record holds it: each child prepares its snapshot from its
// image as any sandbox does, and its subvolume is then replaced by a
// writable snapshot of the copy (fillRoot). A btrfs snapshot shares its
// extents but does not depend on its source, so the children need the copy
// only while they are made: the copy is deleted when the fork's call ends,
// whatever its outcome, and one whose holder no longer runs (berthd died
// during a fork) is deleted at berthd's start and at the next fork.
//
// Forks made by berthd before this layout rest on a committed, hidden
// snapshot of containerd's, key snapshotKeyPrefix+"fork-"+20 hex digits:
// the deletion of the last sandbox or snapshot resting on one removes it
// (reclaimForks).

// forksDir is the directory under the btrfs snapshotter's root that holds
// forks' copies, one directory per containerd namespace: a snapshot must
// be on its source's file system.
const forksDir = "berth-forks"

// forkCopyHolder is the file in a fork copy's directory naming the berthd
// process that made it (procfs.ProcessID).
const forkCopyHolder = "holder"

// forkIDPattern is the id of a fork's copy.
var forkIDPattern = regexp.MustCompile(`^fork-[0-9a-f]{20}$`)

// isForkKey reports whether snapshotter key is a fork's copy made by an
// earlier berthd (a containerd snapshot).
func isForkKey(key string) bool {
	id, ok := strings.CutPrefix(key, snapshotKeyPrefix)
	return ok && forkIDPattern.MatchString(id)
}

// Labels of a sandbox made by ForkSandbox.
const (
	labelForkOf      = LabelPrefix + "fork.of"      // parent sandbox id
	labelForkRequest = LabelPrefix + "fork.request" // the caller's request_id
	labelForkCount   = LabelPrefix + "fork.count"   // children of the call
	labelForkMemory  = LabelPrefix + "fork.memory"  // "true": restored from the parent's memory
)

// shimGroupAnnotation is the OCI annotation by which containerd's runc v2
// shim (containerd 1.6: runtime/v2/runc/manager, Start) groups containers
// into one shim process: its `start` command listens on, or connects to,
// the socket derived from the annotation's value instead of the
// container's id, so a container whose group's shim runs starts no shim.
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// withShimGroup puts a fork's child into the shim process of the sandbox
// spec.Fork.ShimGroup names, its parent's when empty: a sandbox's shim
// listens on the socket derived from its own id (no annotation), so the
// group named by a sandbox's id is that sandbox's shim while it runs —
// the `start` of each child connects to it and returns instead of
// starting another (a shim that is gone, e.g. the parent's deleted while
// none of its children ran, is started anew by the first child under that
// name; a child named by its own id starts its own). That shim then
// serves, and outlives, every sandbox of the group until the last one's
// task is deleted (its Shutdown waits for none left): one shim crash ends
// the tasks of every sandbox of its group alive (docs/state.md#fork).
// Each sandbox keeps its own cgroup, OOM events and runc state. A child's
// own forks group under the child's id. The children of a gVisor sandbox
// are not grouped (Create adds this only under runc): runsc's shim keeps
// one sandbox per process.
func withShimGroup(spec SandboxSpec) oci.SpecOpts {
	return oci.WithAnnotations(map[string]string{shimGroupAnnotation: shimGroup(spec)})
}

// shimGroup is the shim group of a fork's child under runc
// (withShimGroup), "" for a sandbox that is not grouped: one that is no
// fork's child, or runs under gVisor.
func shimGroup(spec SandboxSpec) string {
	switch {
	case spec.Fork.Parent == "" || spec.runtime() == RuntimeGVisor:
		return ""
	case spec.Fork.ShimGroup != "":
		return spec.Fork.ShimGroup
	}
	return spec.Fork.Parent
}

// enterShim waits until no other task create of shim group (shimGroup)
// runs, or ctx ends, and returns the function that lets the next one in;
// it returns at once for group "". containerd 1.6's runc shim runs the
// `runc create`s of its group one at a time under its service lock, so a
// create sent while another of its group runs waits there, and its wait
// counts against containerd's call budget (Config.CallBudget): a fork's
// children whose creates all begin at once would queue in two shims, and
// the last ones would outlast the budget on a loaded host. Here they
// wait under the create's own deadline, and NewTask's budget counts the
// shim's work.
func (r *Runtime) enterShim(ctx context.Context, group string) (leave func(), err error) {
	if group == "" {
		return func() {}, nil
	}
	leave, err = r.shimQueues.Lock(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("wait for the task creates of shim group %s: %w", group, err)
	}
	return leave, nil
}

// ForkSnapshot takes the crash-consistent copy of sandbox id's root file
// system that ForkSandbox's children start from (a read-only btrfs
// snapshot under freeze, see snapshotFrozen), and returns its id — a
// SandboxSpec.FromSnapshot for each child — and release, to be called once
// the children exist or have failed: it deletes the copy, which the
// children do not need once made (an error of it leaves the copy until
// berthd's next start). started, when not nil, is called with the id
// before the copy is taken: creates of the children may begin then, and
// each waits for the copy where it needs its files (fillRoot), failing
// with the copy's error when it is not taken. The copy's steps are
// recorded in ph (nil for none). Errors as for CreateSnapshot.
func (r *Runtime) ForkSnapshot(ctx context.Context, id string, freeze func(context.Context) (func(), error), started func(forkID string), ph *Phases) (_ string, release func() error, err error) {
	c := r.begin(ctx, "fork sandbox "+id)
	defer c.end(&err)
	_, root, src, err := r.copySource(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if err := r.checkHeadroom(c.op); err != nil {
		return "", nil, err
	}
	r.dropOrphanForkCopies(root)
	c.changes()
	forkID := newStoredID("fork-")
	dir := r.forkCopyDir(root, forkID)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", nil, fmt.Errorf("directory of fork copies: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("directory of fork copy %s: %w", forkID, err)
	}
	release = func() error { return removeForkCopy(dir) }
	if err := os.WriteFile(filepath.Join(dir, forkCopyHolder), []byte(procfs.ProcessID(os.Getpid())), 0o600); err != nil {
		_ = release()
		return "", nil, fmt.Errorf("fork copy %s: %w", forkID, err)
	}
	ph.Done("prepare")
	sub := filepath.Join(dir, "root")
	taken := r.forkTaking.begin(sub)
	if started != nil {
		started(forkID)
	}
	_, err = r.snapshotFrozen(ctx, src, sub, true, freeze, ph)
	taken(err)
	if err != nil {
		_ = release()
		return "", nil, err
	}
	return forkID, release, nil
}

// copiesTaking are the fork copies being taken (ForkSnapshot), by the
// path of their subvolume: a child's create that begins before its copy
// is taken waits for it (copyTaking.wait). The zero value is ready to use.
type copiesTaking struct {
	mu     sync.Mutex
	taking map[string]*copyTaking
}

// copyTaking is one fork copy being taken: done is closed once it is,
// or failed with err.
type copyTaking struct {
	done chan struct{}
	err  error
}

// begin records that the copy at subvolume path sub is being taken and
// returns the function that says it was (a nil error) or failed.
func (t *copiesTaking) begin(sub string) (taken func(error)) {
	c := &copyTaking{done: make(chan struct{})}
	t.mu.Lock()
	if t.taking == nil {
		t.taking = map[string]*copyTaking{}
	}
	t.taking[sub] = c
	t.mu.Unlock()
	return func(err error) {
		c.err = err
		t.mu.Lock()
		delete(t.taking, sub)
		t.mu.Unlock()
		close(c.done)
	}
}

// of returns the copy at subvolume path sub being taken, nil when none
// is (taken before, or failed: its subvolume is then missing).
func (t *copiesTaking) of(sub string) *copyTaking {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.taking[sub]
}

// wait returns once copy c is taken (at once for a nil c), with the
// copy's error when it failed, or ctx's.
func (c *copyTaking) wait(ctx context.Context) error {
	if c == nil {
		return nil
	}
	select {
	case <-c.done:
		if c.err != nil {
			return fmt.Errorf("the fork's copy was not taken: %w", c.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the fork's copy: %w", ctx.Err())
	}
}

// forkCopyDir returns the directory of fork copy forkID under the btrfs
// snapshotter's root.
func (r *Runtime) forkCopyDir(root, forkID string) string {
	return filepath.Join(root, forksDir, r.cfg.Namespace, forkID)
}

// forkCopy returns the path of fork copy forkID's subvolume, or
// ErrSnapshotNotFound when it is gone (its fork's call ended).
func (r *Runtime) forkCopy(ctx context.Context, forkID string) (string, error) {
	root, err := r.btrfsRoot(ctx)
	if err != nil {
		return "", err
	}
	p := filepath.Join(r.forkCopyDir(root, forkID), "root")
	if r.forkTaking.of(p) != nil {
		return p, nil
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: fork copy %s is gone (a fork's copy lives only as long as its ForkSandbox call): %v", ErrSnapshotNotFound, forkID, err)
	}
	return p, nil
}

// fillRoot replaces the writable subvolume of snapshot key, just prepared
// from its image, by a writable snapshot of subvolume from, once that is
// taken (a fork's copy, ForkSnapshot).
func (r *Runtime) fillRoot(ctx context.Context, key, from string) error {
	if err := r.forkTaking.of(from).wait(ctx); err != nil {
		return err
	}
	root, err := r.btrfsRoot(ctx)
	if err != nil {
		return err
	}
	dst, err := r.activeSubvolume(ctx, root, key)
	if err != nil {
		return err
	}
	next := dst + ".berth-next"
	if err := qgroup.Snapshot(from, next, false); err != nil {
		return err
	}
	return replaceSubvolume(next, dst)
}

// removeForkCopy deletes fork copy directory dir and its subvolume.
func removeForkCopy(dir string) error {
	sub := filepath.Join(dir, "root")
	if _, err := os.Lstat(sub); err == nil {
		if err := qgroup.Delete(sub); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove fork copy %s: %w", dir, err)
	}
	return nil
}

// dropOrphanForkCopies deletes the fork copies of this namespace under
// root whose holder no longer runs (a berthd that died during a fork),
// and returns how many. A copy whose holder file is missing or unreadable
// is being made or removed by a running berthd, or is a holder's
// half-made one; it is left alone unless its directory is an hour old.
func (r *Runtime) dropOrphanForkCopies(root string) int {
	dir := filepath.Join(root, forksDir, r.cfg.Namespace)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		holder, err := os.ReadFile(filepath.Join(p, forkCopyHolder))
		if err == nil && procfs.Running(string(holder)) {
			continue
		}
		if err != nil {
			if fi, serr := e.Info(); serr != nil || time.Since(fi.ModTime()) < time.Hour {
				continue
			}
		}
		if removeForkCopy(p) == nil {
			n++
		}
	}
	return n
}

// reclaimForks removes fork copy key when no snapshot rests on it any
// more, then its parent when that is a fork's copy too (a fork of a
// forked sandbox), and so on. A copy still in use (containerd refuses its
// removal: FAILED_PRECONDITION) or already gone ends it without error; a
// key that is no fork's copy is left alone.
func (r *Runtime) reclaimForks(ctx context.Context, key string) error {
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	for isForkKey(key) {
		info, err := sn.Stat(ctx, key)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stat fork copy %s: %w", key, err)
		}
		err = sn.Remove(ctx, key)
		switch {
		case errdefs.IsFailedPrecondition(err), errdefs.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("remove fork copy %s: %w", key, err)
		}
		key = info.Parent
	}
	return nil
}

// snapshotParentOf returns the parent key of the snapshot of key, "" when
// it has none or cannot be read.
func (r *Runtime) snapshotParentOf(ctx context.Context, key string) string {
	info, err := r.client.SnapshotService(r.cfg.Snapshotter).Stat(ctx, key)
	if err != nil {
		return ""
	}
	return info.Parent
}

// SandboxEnv returns the values of sandbox id's env (SandboxSpec.Env),
// read from its container's OCI spec: labels keep only the keys. Errors:
// ErrSandboxNotFound, containerd's.
func (r *Runtime) SandboxEnv(ctx context.Context, id string) (_ map[string]string, err error) {
	c := r.begin(ctx, "read the env of sandbox "+id)
	defer c.end(&err)
	sb, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(sb.EnvKeys) == 0 {
		return nil, nil
	}
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, r.containerError(id, err)
	}
	spec, err := container.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the spec of sandbox %s: %w", id, err)
	}
	have := map[string]string{}
	if spec.Process != nil {
		for _, kv := range spec.Process.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				have[k] = v
			}
		}
	}
	env := make(map[string]string, len(sb.EnvKeys))
	for _, k := range sb.EnvKeys {
		v, ok := have[k]
		if !ok {
			return nil, fmt.Errorf("sandbox %s's spec lacks its env key %q", id, k)
		}
		env[k] = v
	}
	if EnvDigest(env) != sb.EnvHash {
		return nil, fmt.Errorf("sandbox %s's env in its spec does not match the hash recorded at its creation", id)
	}
	return env, nil
}
