package runtime

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
)

// setLabels updates the given labels of sandbox id's container; an empty
// value deletes the label (containerd drops empty labels on update).
func (r *Runtime) setLabels(ctx context.Context, id string, labels map[string]string) (err error) {
	c := r.begin(ctx, "update the record of sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	c.changes()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return r.containerError(id, err)
	}
	if _, err := container.SetLabels(ctx, labels); err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
		}
		return fmt.Errorf("update labels of %s: %w", id, err)
	}
	return nil
}

// MarkExpired records on the sandbox that it expired for reason, before it
// is removed, so that a berthd restarted in between removes it too.
func (r *Runtime) MarkExpired(ctx context.Context, id, reason string) error {
	return r.setLabels(ctx, id, map[string]string{labelExpired: reason})
}

// SetHoldUntil records the end of a KeepAlive hold on the sandbox.
func (r *Runtime) SetHoldUntil(ctx context.Context, id string, until time.Time) error {
	return r.setLabels(ctx, id, map[string]string{labelHoldUntil: until.UTC().Format(time.RFC3339Nano)})
}

// Claim turns the unclaimed warm-pool member id into a sandbox of spec,
// whose image, env, user, working directory and limits must be those the
// member was created with (the caller checks): it records spec's labels,
// idle timeout, maximum lifetime and digest, drops the pool mark and
// restarts the creation time (the maximum lifetime counts from the claim).
func (r *Runtime) Claim(ctx context.Context, id string, spec SandboxSpec) error {
	spec.ID, spec.Pooled = id, false
	labels := spec.labels(time.Now())
	labels[labelPool] = ""
	return r.setLabels(ctx, id, labels)
}

// HostDirs returns the ids of the sandbox host directories under the state
// directory, with or without a container.
func (r *Runtime) HostDirs() ([]string, error) {
	entries, err := os.ReadDir(r.hostDir(""))
	if err != nil {
		return nil, fmt.Errorf("list sandbox directories: %w", err)
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// RemoveHostDir removes the host directory of sandbox id, which must have
// no container.
func (r *Runtime) RemoveHostDir(id string) error { return r.removeHostDir(id) }
