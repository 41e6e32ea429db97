package runtime

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// A fork (ForkSandbox) rests on a copy of the parent's root taken as a
// stored snapshot is (copyRoot), key snapshotKeyPrefix+"fork-"+20 hex
// digits, but hidden: it is no caller's snapshot (ListSnapshots and the
// snapshot calls take only "snap-" ids), and it carries no gc.root label.
// Until its children exist a lease holds it; then each child's snapshot,
// which names it as its parent, does. The deletion of the last sandbox or
// snapshot resting on it removes it (reclaimForks); should berthd die
// between the two, containerd's garbage collector takes it, as nothing
// holds it any more.

// forkIDPattern is the id of a fork's copy.
var forkIDPattern = regexp.MustCompile(`^fork-[0-9a-f]{20}$`)

// isForkKey reports whether snapshotter key is a fork's copy.
func isForkKey(key string) bool {
	id, ok := strings.CutPrefix(key, snapshotKeyPrefix)
	return ok && forkIDPattern.MatchString(id)
}

// Labels of a sandbox made by ForkSandbox.
const (
	labelForkOf      = LabelPrefix + "fork.of"      // parent sandbox id
	labelForkRequest = LabelPrefix + "fork.request" // the caller's request_id
	labelForkCount   = LabelPrefix + "fork.count"   // children of the call
)

// ForkSnapshot takes the crash-consistent copy of sandbox id's root file
// system that ForkSandbox's children start from (copyRoot, with owner and
// freeze), and returns its id — a SandboxSpec.FromSnapshot for each child
// — and release, to be called once the children exist or have failed: it
// drops the lease that holds the copy meanwhile and removes the copy when
// no sandbox rests on it. Errors as for CreateSnapshot.
func (r *Runtime) ForkSnapshot(ctx context.Context, id, owner string, freeze func(context.Context) (func(), error)) (_ string, release func(context.Context), err error) {
	c := r.begin(ctx, "fork sandbox "+id)
	defer c.end(&err)
	if err := r.snapshotsSupported(); err != nil {
		return "", nil, err
	}
	lctx, done, err := r.withLease(ctx, time.Hour)
	if err != nil {
		return "", nil, fmt.Errorf("lease for the fork: %w", err)
	}
	forkID := newStoredID("fork-")
	key := snapshotKeyPrefix + forkID
	if err := r.copyRoot(lctx, c, id, key, owner, freeze, nil); err != nil {
		_ = done(context.WithoutCancel(ctx))
		return "", nil, err
	}
	return forkID, func(ctx context.Context) {
		// A lease left behind expires in an hour, or goes at the next
		// start of berthd (dropOrphanLeases): nothing to do about it here.
		_ = done(ctx)
		_ = r.reclaimForks(ctx, key)
	}, nil
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
