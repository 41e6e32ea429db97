package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// The state calls of Sandbox (docs/state.md), the Go column of the Python
// SDK's sb.pause(), resume(), hibernate(), snapshot() and fork() and the
// TypeScript SDK's: each is one of Client's calls on sb.ID, with its
// retries (Client's RetryPolicy) and its errors.

// Pause freezes every process of the sandbox (runc: its cgroup freezer;
// gVisor: runsc pause): it uses no CPU and keeps its memory, files, open
// connections and attached commands; Info.State becomes
// SANDBOX_STATE_PAUSED. Any later call that needs the sandbox (Commands,
// Files, Ports) resumes it first, unless its context comes from NoResume
// (then it fails with ReasonSandboxPaused). Pausing a paused sandbox
// changes nothing. Errors: *Error with ReasonSandboxNotFound, or
// ReasonSandboxNotRunning when its task does not run. See
// Client.PauseSandbox.
func (sb *Sandbox) Pause(ctx context.Context) error {
	info, err := sb.Client.PauseSandbox(ctx, sb.ID)
	if err != nil {
		return err
	}
	sb.Info = info
	return nil
}

// Resume thaws a paused sandbox or wakes a hibernated one; its processes
// go on where they stopped (after a hibernation that ended them, a fresh
// agent starts on the same files). Resuming a running sandbox changes
// nothing. Errors as for Pause. See Client.ResumeSandbox.
func (sb *Sandbox) Resume(ctx context.Context) error {
	info, err := sb.Client.ResumeSandbox(ctx, sb.ID)
	if err != nil {
		return err
	}
	sb.Info = info
	return nil
}

// Hibernate releases the sandbox's memory and CPU and keeps its files;
// the next call that needs it wakes it (unless its context comes from
// NoResume: ReasonSandboxHibernated). It returns what was kept:
// berthv1.Hibernation_HIBERNATION_MEMORY_KEPT (gVisor: memory and
// processes checkpointed to disk and restored at the wake, command ids
// stay valid) or berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED (runc:
// every process ended; the wake starts a fresh agent, so commands of
// before are *StaleHandleError). Info.State becomes
// SANDBOX_STATE_HIBERNATED. Errors as for Pause. See
// Client.HibernateSandbox.
func (sb *Sandbox) Hibernate(ctx context.Context) (berthv1.Hibernation, error) {
	resp, err := sb.Client.hibernateSandbox(ctx, sb.ID)
	if err != nil {
		return berthv1.Hibernation_HIBERNATION_UNSPECIFIED, err
	}
	sb.Info = resp.GetSandbox()
	return resp.GetHibernation(), nil
}

// Snapshot stores a point-in-time, crash-consistent copy of the sandbox's
// root file system, with labels (nil: none): the sandbox is paused, synced,
// snapshotted (btrfs) and resumed, and every write its processes saw
// complete before the call is in it; memory is not kept. The snapshot
// (Id, SizeBytes, ...) belongs to the caller and outlives the sandbox
// until Client.DeleteSnapshot; SandboxOptions.FromSnapshot starts a
// sandbox from it. It is sent once, never retried: a lost reply is found by Client.ListSnapshots.
// Errors: *Error with ReasonSandboxNotFound, ReasonSnapshotUnsupported
// (berthd's snapshotter is not btrfs), ReasonSnapshotLimit. See
// Client.CreateSnapshot.
func (sb *Sandbox) Snapshot(ctx context.Context, labels map[string]string) (*berthv1.Snapshot, error) {
	return sb.Client.CreateSnapshot(ctx, sb.ID, labels)
}

// ForkOptions configure Sandbox.Fork. Zero fields take the defaults.
type ForkOptions struct {
	// Count is how many children to make, 1 to 16; 0 means 1.
	Count uint32
	// Memory copies the sandbox's memory and processes too (gVisor only):
	// every process goes on in each child from the checkpoint that stopped
	// it. A runc sandbox fails with ReasonSnapshotUnsupported.
	Memory bool
	// RequestID makes the fork idempotent (at most 128 bytes): a repeated
	// Fork with the same RequestID, Count and Labels returns the same
	// children and makes none, and only then is the call retried under
	// the Client's RetryPolicy. Empty: every call makes new children and
	// is sent once.
	RequestID string
	// Labels are added to the sandbox's labels on every child (a key here
	// wins).
	Labels map[string]string
}

// Fork makes opts.Count new sandboxes from this one's files as of one
// point in time, each with its own id, network address and disk quota and
// this one's create spec, and returns them in index order, sharing this
// Sandbox's Client (their Kill deletes them and leaves the Client open;
// their Close does nothing). This sandbox runs on; a paused one stays
// paused. All or nothing. Errors: *Error with ReasonInvalidArgument
// (count, request_id, labels), ReasonSandboxNotFound,
// ReasonSnapshotUnsupported (not the btrfs snapshotter; Memory of a runc
// sandbox), ReasonSandboxExists (RequestID of another fork), and
// CreateSandbox's errors for a child (*FleetBusyError, ...). See
// Client.ForkSandbox.
func (sb *Sandbox) Fork(ctx context.Context, opts ForkOptions) ([]*Sandbox, error) {
	infos, err := sb.Client.ForkSandbox(ctx, &berthv1.ForkSandboxRequest{
		SandboxId: sb.ID, Count: max(opts.Count, 1), RequestId: opts.RequestID,
		Labels: opts.Labels, Memory: opts.Memory,
	})
	if err != nil {
		return nil, err
	}
	children := make([]*Sandbox, len(infos))
	for i, info := range infos {
		children[i], _ = newSandbox(sb.Client, false, info, nil)
	}
	return children, nil
}
