package runtime

import (
	"context"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/berth-sandbox/berth/internal/agentproof"
)

// A fork with memory (ForkSandbox of a gVisor sandbox asking for memory)
// hibernates the parent with its memory (Hibernate, KeepMemory.Must),
// gives the fork hard links of the checkpoint image (ForkMemory), copies
// the parent's files while no task runs, and wakes the parent (runsc
// restore of its own image); each child is created on the files' copy
// and restored from the same image (restoreChild): the parent's processes,
// memory and exec records go on in every child from where the checkpoint
// stopped them. A child's agent serves under a secret and boot id of its
// own (the fork wake, package internal/quiesce).

// forkMemoryPrefix names, in a parent's host directory, the directory of
// a fork's memory image: forkMemoryPrefix + the fork's id.
const forkMemoryPrefix = "fork-memory-"

// ForkMemoryDir is the directory ForkMemory makes for fork forkID of
// sandbox parent: the children's SandboxSpec.Fork.MemoryImage.
func (r *Runtime) ForkMemoryDir(parent, forkID string) string {
	return filepath.Join(r.hostDir(parent), forkMemoryPrefix+forkID)
}

// ForkMemory gives fork forkID of sandbox parent, hibernated with its
// memory kept (Hibernate with KeepMemory.Must), its own hard links of the
// parent's checkpoint image and a copy of its wake token in
// ForkMemoryDir(parent, forkID): the parent's wake removes its own
// (Woken) while the children restore from these. release removes them
// (the parent's deletion does too: they are in its host directory;
// and berthd's next start, ReclaimForkMemory).
// Errors: a missing image, the file system's.
func (r *Runtime) ForkMemory(parent, forkID string) (release func() error, err error) {
	src, dst := r.checkpointDir(parent), r.ForkMemoryDir(parent, forkID)
	release = func() error {
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("remove the memory image of fork %s: %w", forkID, err)
		}
		return nil
	}
	token, err := os.ReadFile(r.wakeTokenPath(parent))
	if err != nil {
		return nil, fmt.Errorf("the wake token of sandbox %s's checkpoint: %w", parent, err)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return nil, fmt.Errorf("memory image directory of fork %s: %w", forkID, err)
	}
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		switch {
		case rel == ".":
			return nil
		case d.IsDir():
			return os.Mkdir(filepath.Join(dst, rel), 0o700)
		case d.Type().IsRegular():
			return os.Link(path, filepath.Join(dst, rel))
		}
		return fmt.Errorf("%s is neither a file nor a directory", path)
	})
	if err == nil {
		err = os.WriteFile(filepath.Join(dst, forkWakeToken), token, 0o600)
	}
	if err != nil {
		_ = release()
		return nil, fmt.Errorf("link sandbox %s's checkpoint image for fork %s: %w", parent, forkID, err)
	}
	return release, nil
}

// ReclaimForkMemory removes the memory images of forks of sandbox id
// (ForkMemory) from its host directory and returns how many it removed:
// at berthd's start no fork runs, and one that a berthd stopped during
// a fork with memory left would stay until the sandbox's deletion (a
// copy of its memory each). Errors: the file system's.
func (r *Runtime) ReclaimForkMemory(id string) (int, error) {
	dirs, err := filepath.Glob(filepath.Join(r.hostDir(id), forkMemoryPrefix+"*"))
	if err != nil {
		return 0, fmt.Errorf("memory images of forks of sandbox %s: %w", id, err)
	}
	for i, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			return i, fmt.Errorf("remove the memory image of a fork of sandbox %s: %w", id, err)
		}
	}
	return len(dirs), nil
}

// forkWakeToken is the file of the wake token in a fork's memory image
// directory (ForkMemory); runsc reads only its own files there.
const forkWakeToken = "berth-wake-token"

// childRestore is what the create of a fork's child with memory needs:
// its agent's secret (hex, recorded as the sandbox's) and the content of
// the fork wake that makes the restored agent serve under it.
type childRestore struct {
	image, secret string
	wake          []byte
}

// forkRestore prepares the restore of spec, a fork's child with memory:
// it waits for the fork's copy (taken after the parent's checkpoint,
// ForkSnapshot), reads the image's wake token and the parent's secret,
// and derives the child's (agentproof.ForkSecret of a new nonce).
// Errors: not gVisor (ErrSnapshotUnsupported), the copy's, a missing
// token or parent secret.
func (r *Runtime) forkRestore(ctx context.Context, spec SandboxSpec) (*childRestore, error) {
	if spec.runtime() != RuntimeGVisor {
		return nil, fmt.Errorf("%w: a child with its parent's memory needs gVisor, not %s", ErrSnapshotUnsupported, spec.runtime())
	}
	from, err := r.forkCopy(ctx, spec.FromSnapshot)
	if err != nil {
		return nil, err
	}
	if err := r.forkTaking.of(from).wait(ctx); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(spec.Fork.MemoryImage, forkWakeToken))
	if err != nil {
		return nil, fmt.Errorf("the wake token of the parent's memory image: %w", err)
	}
	token, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("the wake token of the parent's memory image: %w", err)
	}
	parentSecret, err := r.agentSecret(ctx, spec.Fork.Parent)
	if err != nil {
		return nil, err
	}
	nonce := agentproof.NewForkNonce()
	secret, proof := agentproof.ForkSecret(parentSecret, token, nonce), agentproof.ProveForkWake(parentSecret, token, nonce)
	if secret == nil || proof == nil {
		return nil, fmt.Errorf("no fork wake for sandbox %s: its parent %s has no agent secret, or the token is not %d bytes", spec.ID, spec.Fork.Parent, agentproof.TokenBytes)
	}
	return &childRestore{image: spec.Fork.MemoryImage, secret: hex.EncodeToString(secret), wake: append(nonce, proof...)}, nil
}

// restoreChild starts the task of fork child id from the parent's memory
// image (runsc restore through the runc shim: NewTask with the image
// path, then Start, at most RestoreTimeout) and writes the fork wake into
// its run directory, which makes the restored agent serve as the child.
// Errors: containerd's and runsc's (the caller deletes the container).
func (r *Runtime) restoreChild(ctx context.Context, container containerd.Container, id string, cr *childRestore, ph *Phases) error {
	ctx, cancel := context.WithTimeout(ctx, RestoreTimeout)
	defer cancel()
	task, err := container.NewTask(ctx, cio.LogFile(r.LogPath(id)), containerd.WithRestoreImagePath(cr.image))
	if err != nil {
		return fmt.Errorf("create the task of sandbox %s to restore its parent's memory: %w", id, err)
	}
	ph.Done("task")
	if err := task.Start(ctx); err != nil {
		return fmt.Errorf("runsc restore of the parent's memory into sandbox %s: %w", id, err)
	}
	ph.Done("start")
	if err := r.putWake(id, cr.wake, 0); err != nil {
		return fmt.Errorf("ask sandbox %s's restored agent to serve as the fork's child: %w", id, err)
	}
	return nil
}
