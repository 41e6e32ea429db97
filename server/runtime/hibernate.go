package runtime

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"

	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/quiesce"
)

// What a hibernation kept (the label labelHibernated holds one while the
// sandbox is hibernated).
const (
	// HibernatedProcessesEnded: every process of the sandbox ended (its
	// task removed), its container, writable layer, host directory and
	// network namespace kept. runc sandboxes always hibernate so: memory
	// checkpoints need CRIU there, which does not work on the kernels
	// berth is tested on (docs/state.md).
	HibernatedProcessesEnded = "processes-ended"
	// HibernatedMemoryKept: a gVisor sandbox's memory and processes were
	// checkpointed (runsc checkpoint) into the image directory under its
	// host directory (checkpointDir) and its task removed; the wake
	// restores them (runsc restore).
	HibernatedMemoryKept = "memory-kept"
)

// Hibernation is what Hibernate did.
type Hibernation struct {
	// TaskPID is the host pid of the task it removed; 0 when there was
	// none (the sandbox was hibernated already).
	TaskPID uint32
	// Kept is HibernatedMemoryKept or HibernatedProcessesEnded.
	Kept string
	// NotKept, under gVisor when Kept is HibernatedProcessesEnded, says
	// why the memory could not be checkpointed (e.g. "runsc checkpoint:
	// Cannot save endpoint with bound host socket" when a workload process
	// holds a unix socket bound on the host).
	NotKept string
	// Took is how long the hibernation took; Saved is how long of it the
	// checkpoint took (0 when none was made).
	Took, Saved time.Duration
	// ImageBytes is the size of the checkpoint image in bytes (0 when
	// none was made): it counts against the owner's disk and the disk
	// budget until the wake (Promised).
	ImageBytes uint64
}

// dirBytes returns the bytes of the regular files under dir (a
// checkpoint image: a few files); what cannot be read counts zero.
func dirBytes(dir string) uint64 {
	var n uint64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += uint64(fi.Size())
			}
		}
		return nil
	})
	return n
}

// Quiescer asks a sandbox's agent, over berthd's connection to it, to
// close its host sockets (the agent's Quiesce RPC, package
// internal/quiesce) with wake token token and berthd's proof of it
// (agentproof.ProveQuiesce). It returns nil once the agent took the ask
// (the agent then closes that connection too: a call cut off once sent is
// taken); the agent's quiesce.Mark says when it is done.
type Quiescer func(ctx context.Context, token, proof []byte) error

// KeepMemory is how Hibernate keeps a gVisor sandbox's memory.
type KeepMemory struct {
	// Ask asks the sandbox's agent to quiesce; nil keeps no memory.
	Ask Quiescer
	// Refused, when not nil, says why the memory is not to be kept (its
	// checkpoint image does not fit the disk: *apierr.FleetBusy): the
	// processes end instead, Hibernation.NotKept saying why.
	Refused error
	// Must makes the memory a condition (a fork with memory): where it
	// cannot be kept — not gVisor, Refused, a checkpoint that fails —
	// Hibernate fails with ErrSnapshotUnsupported (wrapped) and the
	// sandbox runs on as it was (a quiet agent woken again: wakeInPlace).
	Must bool
}

// Hibernate removes sandbox id's task, keeping its container: the sandbox
// then holds no memory and no CPU, and RestartTask starts it again with its
// files (Woken clears the mark).
//
// Under gVisor it first saves the sandbox's memory (unless keep.Refused):
// keep.Ask makes the agent close its host sockets (package
// internal/quiesce: at most quiesceTimeout), the
// task is checkpointed into checkpointDir (runsc checkpoint through
// containerd's task.Checkpoint, at most checkpointTimeout) and exits, and
// RestartTask restores it. When any of that fails (an agent that does not
// quiesce; a workload holding a host-backed socket, which runsc cannot
// save) the task is killed as under runc and Hibernation.NotKept says why:
// files are never lost. A paused gVisor sandbox is resumed for its agent
// to quiesce. Under runc every process is killed (a paused task thawed
// for its SIGKILL: thawForDelete).
//
// The mark (labelHibernated) is recorded on the container before the task
// is touched, so that a berthd stopped at any point afterwards finds a
// hibernated sandbox, not an orphan (a checkpoint cut off leaves an image
// that RestartTask cannot restore: it then starts a fresh task). A
// hibernated sandbox stays so (no error). Errors: ErrSandboxNotFound;
// ErrTaskNotRunning when the sandbox is not hibernated and its task
// neither runs nor is paused.
func (r *Runtime) Hibernate(ctx context.Context, id string, keep KeepMemory) (_ Hibernation, err error) {
	began := time.Now()
	c := r.begin(ctx, "hibernate sandbox "+id)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return Hibernation{}, r.containerError(id, err)
	}
	labels, err := container.Labels(ctx)
	if err != nil {
		return Hibernation{}, r.containerError(id, err)
	}
	if labels[labelSandbox] != "true" {
		return Hibernation{}, fmt.Errorf("%w: %s", ErrSandboxNotFound, id)
	}
	marked := labels[labelHibernated]
	h := Hibernation{Kept: marked}
	if h.Kept == "" {
		h.Kept = HibernatedProcessesEnded
	}
	task, err := container.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
		if marked != "" {
			return h, nil
		}
		return Hibernation{}, fmt.Errorf("%w: sandbox %s has no task", ErrTaskNotRunning, id)
	case err != nil:
		return Hibernation{}, fmt.Errorf("load task %s: %w", id, err)
	}
	h.TaskPID = task.Pid()
	st, err := task.Status(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		return Hibernation{}, fmt.Errorf("task status %s: %w", id, err)
	}
	live := err == nil && (st.Status == containerd.Running || st.Status == containerd.Paused || st.Status == containerd.Pausing)
	if marked == "" && !live {
		// A task that exited (and is being restarted, or left stopped)
		// is not hibernated: what ran in it is gone already.
		return Hibernation{}, fmt.Errorf("%w: sandbox %s's task is %s", ErrTaskNotRunning, id, st.Status)
	}
	if keep.Must && (marked != "" || labels[labelRuntime] != RuntimeGVisor || keep.Refused != nil || keep.Ask == nil) {
		why := "it is hibernated"
		switch {
		case marked != "":
		case labels[labelRuntime] != RuntimeGVisor:
			why = "its runtime is " + labels[labelRuntime] + ", and memory checkpoints need gVisor (runc would need CRIU, which does not work on the kernels berth is tested on: docs/state.md)"
		case keep.Refused != nil:
			why = "its checkpoint image would not fit: " + keep.Refused.Error()
		default:
			why = "berthd cannot reach its agent to ask it to quiesce"
		}
		return Hibernation{}, fmt.Errorf("%w: the memory of sandbox %s cannot be checkpointed: %s", ErrSnapshotUnsupported, id, why)
	}
	if marked == "" && labels[labelRuntime] == RuntimeGVisor {
		if keep.Refused != nil {
			h.NotKept = "not made, the image would not fit: " + keep.Refused.Error()
		} else {
			h.Kept = HibernatedMemoryKept
		}
	}
	c.changes()
	if marked != h.Kept {
		if _, err := container.SetLabels(ctx, map[string]string{labelHibernated: h.Kept}); err != nil {
			return Hibernation{}, r.containerError(id, err)
		}
	}
	if h.Kept == HibernatedMemoryKept && live {
		saved := time.Now()
		paused := st.Status != containerd.Running
		if err := r.checkpoint(c.parent, task, id, paused, keep.Ask); err != nil {
			if keep.Must {
				return Hibernation{}, r.wakeInPlace(ctx, container, task, id, paused, err)
			}
			h.Kept, h.NotKept = HibernatedProcessesEnded, err.Error()
			if _, err := container.SetLabels(ctx, map[string]string{labelHibernated: h.Kept}); err != nil {
				return Hibernation{}, r.containerError(id, err)
			}
		} else {
			h.Saved = time.Since(saved)
			h.ImageBytes = dirBytes(r.checkpointDir(id))
			if _, err := container.SetLabels(ctx, map[string]string{labelCheckpointBytes: strconv.FormatUint(h.ImageBytes, 10)}); err != nil {
				return Hibernation{}, r.containerError(id, err)
			}
		}
	}
	if err := r.deleteTask(ctx, container); err != nil {
		return Hibernation{}, err
	}
	h.Took = time.Since(began)
	return h, nil
}

// Bounds of a gVisor checkpoint under load (RUNTIME-NOTES: runsc
// checkpoint took 37 s at a load average of 13).
const (
	// quiesceTimeout bounds the wait for the agent's quiesce.Mark.
	quiesceTimeout = 30 * time.Second
	// checkpointTimeout bounds runsc checkpoint.
	checkpointTimeout = 5 * time.Minute
)

// checkpointDir is the directory of sandbox id's gVisor checkpoint image,
// in its host directory (root's alone, never mounted into the sandbox).
func (r *Runtime) checkpointDir(id string) string {
	return filepath.Join(r.hostDir(id), "checkpoint")
}

// wakeTokenPath is the file of the wake token of sandbox id's last
// quiesce (hex), beside its checkpoint image: the restore proves it to the
// agent (writeWake), whichever berthd runs it.
func (r *Runtime) wakeTokenPath(id string) string {
	return filepath.Join(r.hostDir(id), "wake-token")
}

// checkpoint saves gVisor task's memory and processes into
// checkpointDir(id) and leaves the task exited: it resumes a paused task
// (paused), asks its agent to close its host sockets and waits for it
// (quiesce, through ask), then runs runsc checkpoint through the runc shim
// (task.Checkpoint with an image path; containerd pauses the task around
// it). It is not cut off by ctx's cancel (a checkpoint half made is
// nothing), only bounded. On failure the image is removed and the task is
// left running, its agent quiet: the caller kills it — except that
// this runsc ends the sandbox when its checkpoint fails, so one that would
// fail for a host socket (hostSockets) is not tried.
func (r *Runtime) checkpoint(ctx context.Context, task containerd.Task, id string, paused bool, ask Quiescer) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), quiesceTimeout+checkpointTimeout)
	defer cancel()
	dir := r.checkpointDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove an old checkpoint image: %w", err)
	}
	if paused {
		if err := task.Resume(ctx); err != nil {
			return fmt.Errorf("resume the paused task for its agent to quiesce: %w", err)
		}
	}
	if err := r.quiesce(ctx, ask, id); err != nil {
		return err
	}
	// This runsc ends the sandbox when a checkpoint fails: one that
	// would fail for a host socket is not tried (when the gofer cannot
	// be read, it is, and fails as it would).
	if paths, err := hostSockets(id, task.Pid()); err == nil && len(paths) > 0 {
		return fmt.Errorf("runsc checkpoint not tried: a process (its socket %s) holds a unix socket bound on the host, which gVisor cannot save (%q)", strings.Join(paths, ", "), boundHostSocket)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	_, err := task.Checkpoint(ctx, containerd.WithCheckpointImagePath(dir), withCheckpointExit)
	if err != nil {
		os.RemoveAll(dir)
		return checkpointError(err)
	}
	return nil
}

// wakeInPlace undoes a hibernation whose checkpoint failed (err) and
// whose memory was a condition (KeepMemory.Must): the task still runs
// (checkpoint leaves it so), its agent is asked to listen again
// (writeWake: a quiet agent serves again, one that never quiesced
// ignores it), a task that was paused (checkpoint resumed it for its
// agent to quiesce) is paused again, and the hibernation mark is cleared.
// The undo is not cut off by ctx's cancel, only bounded. It returns err
// wrapped in ErrSnapshotUnsupported, with what could not be undone.
func (r *Runtime) wakeInPlace(ctx context.Context, container containerd.Container, task containerd.Task, id string, paused bool, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), quiesceTimeout)
	defer cancel()
	err = fmt.Errorf("%w: the memory of sandbox %s cannot be checkpointed: %v", ErrSnapshotUnsupported, id, err)
	if werr := r.writeWake(ctx, id, 0); werr != nil {
		err = fmt.Errorf("%w (and its agent, quiet, was not asked to listen again: %v)", err, werr)
	}
	if paused {
		if st, serr := task.Status(ctx); serr == nil && st.Status == containerd.Running {
			if perr := task.Pause(ctx); perr != nil {
				err = fmt.Errorf("%w (and it was paused, and runs now: %v)", err, perr)
			}
		}
	}
	if _, lerr := container.SetLabels(ctx, map[string]string{labelHibernated: ""}); lerr != nil {
		err = fmt.Errorf("%w (and its hibernation mark stays: %v)", err, r.containerError(id, lerr))
	}
	return err
}

// boundHostSocket is runsc's refusal of a socket bound on the host, and
// hostSocketPath finds the socket's path in the object it prints.
var (
	boundHostSocket = "Cannot save endpoint with bound host socket"
	hostSocketPath  = regexp.MustCompile(`path:"([^"]*)"`)
)

// checkpointError says why runsc checkpoint failed, in a line: runsc
// prints the whole object it could not save (kilobytes), so the error is
// named and cut to maxCheckpointError bytes.
func checkpointError(err error) error {
	msg := err.Error()
	if strings.Contains(msg, boundHostSocket) {
		where := "a process"
		if m := hostSocketPath.FindStringSubmatch(msg); m != nil {
			where += " (its socket " + m[1] + ")"
		}
		return fmt.Errorf("runsc checkpoint: %s holds a unix socket bound on the host, which gVisor cannot save (%q)", where, boundHostSocket)
	}
	if len(msg) > maxCheckpointError {
		msg = msg[:maxCheckpointError] + "..."
	}
	return fmt.Errorf("runsc checkpoint: %s", msg)
}

// maxCheckpointError bounds the error of a failed checkpoint, in bytes.
const maxCheckpointError = 512

// withCheckpointExit makes the runc shim run the checkpoint without
// --leave-running: the task exits once saved.
func withCheckpointExit(info *containerd.CheckpointTaskInfo) error {
	opts, ok := info.Options.(*options.CheckpointOptions)
	if !ok {
		return fmt.Errorf("checkpoint options are %T, not the runc shim's", info.Options)
	}
	opts.Exit = true
	return nil
}

// quiesce asks sandbox id's agent through ask to close its listener and
// connections, with a new wake token (kept in wakeTokenPath for the
// restore) and berthd's proof of the sandbox's secret, and waits, at most
// quiesceTimeout, for its quiesce.Mark in the run directory.
func (r *Runtime) quiesce(ctx context.Context, ask Quiescer, id string) error {
	if ask == nil {
		return errors.New("berthd cannot reach the agent to ask it to quiesce")
	}
	secret, err := r.agentSecret(ctx, id)
	if err != nil {
		return err
	}
	if secret == nil {
		return errors.New("the sandbox's agent has no secret (a sandbox of a berth before agent secrets): nothing would prove berthd's ask to quiesce")
	}
	token := agentproof.NewWakeToken()
	if err := os.WriteFile(r.wakeTokenPath(id), []byte(hex.EncodeToString(token)), 0o600); err != nil {
		return fmt.Errorf("keep the wake token: %w", err)
	}
	mark := filepath.Join(filepath.Dir(r.SocketPath(id)), quiesce.Mark)
	os.Remove(mark)
	askCtx, cancel := context.WithTimeout(ctx, quiesceTimeout)
	err = ask(askCtx, token, agentproof.ProveQuiesce(secret, token))
	cancel()
	if err != nil {
		return fmt.Errorf("ask the agent to quiesce: %w", err)
	}
	return waitQuiet(ctx, mark, agentproof.ProveQuiet(secret, token), quiesceTimeout)
}

// waitQuiet waits, at most timeout, for the quiesce.Mark at path to hold
// want (agentproof.ProveQuiet of the sandbox's secret and the quiesce's
// token): the agent's word that it is quiet. A mark holding anything else
// — the workload can write the run directory, but knows neither the
// secret nor the token — is not believed: the wait goes on, and fails at
// timeout saying so.
func waitQuiet(ctx context.Context, path string, want []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	forged := false
	for {
		proof, err := quiesce.ReadProof(path)
		if err == nil && agentproof.VerifyAsk(want, proof) == nil {
			return nil
		}
		forged = forged || !errors.Is(err, fs.ErrNotExist)
		if time.Now().After(deadline) {
			if forged {
				return fmt.Errorf("the agent did not prove within %s that it closed its sockets (%s held no proof of the sandbox's secret: not the agent's)", timeout, path)
			}
			return fmt.Errorf("the agent did not close its sockets within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the agent to quiesce: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeWake proves to sandbox id's restored agent, quiet since the
// checkpoint, that berthd restored it: agentproof.ProveWake of the wake
// token of its quiesce, written aside and renamed into quiesce.Wake in its
// run directory (the agent never reads half of it), owned by the sandbox's
// root as the secret is (writeSecret).
func (r *Runtime) writeWake(ctx context.Context, id string, base uint32) error {
	b, err := os.ReadFile(r.wakeTokenPath(id))
	if err != nil {
		return fmt.Errorf("read the wake token: %w", err)
	}
	token, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("wake token %s: %w", r.wakeTokenPath(id), err)
	}
	secret, err := r.agentSecret(ctx, id)
	if err != nil {
		return err
	}
	proof := agentproof.ProveWake(secret, token)
	if proof == nil {
		return fmt.Errorf("no wake proof: the sandbox has no secret or the token in %s is not %d bytes", r.wakeTokenPath(id), agentproof.TokenBytes)
	}
	return r.putWake(id, proof, base)
}

// putWake writes content (a wake proof, or a fork wake) into
// quiesce.Wake in sandbox id's run directory: aside, then renamed (the
// agent never reads half of it), owned by the sandbox's root (host id
// base) as the secret is (writeSecret).
func (r *Runtime) putWake(id string, content []byte, base uint32) error {
	dir := filepath.Dir(r.SocketPath(id))
	tmp := filepath.Join(dir, quiesce.Wake+".berthd")
	err := writeRunFile(tmp, content, base)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, quiesce.Wake))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write the wake proof: %w", err)
	}
	return nil
}

// Woken clears sandbox id's hibernation mark once RestartTask started its
// new task, and removes its checkpoint image. Errors: ErrSandboxNotFound,
// containerd's.
func (r *Runtime) Woken(ctx context.Context, id string) error {
	if err := r.setLabels(ctx, id, map[string]string{labelHibernated: "", labelCheckpointBytes: ""}); err != nil {
		return err
	}
	if err := os.RemoveAll(r.checkpointDir(id)); err != nil {
		return fmt.Errorf("remove the checkpoint image of sandbox %s: %w", id, err)
	}
	if err := os.Remove(r.wakeTokenPath(id)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove the wake token of sandbox %s: %w", id, err)
	}
	return nil
}

// RestoreTimeout bounds the restore of a gVisor sandbox's memory
// (runsc restore; RUNTIME-NOTES: 4.9 s at a load average of 13). A wake
// allows it on top of the agent's answer.
const RestoreTimeout = 2 * time.Minute

// restore starts a task for gVisor sandbox id, whose root is host id
// base, from its checkpoint image (runsc restore through the runc shim:
// NewTask with the image path, then Start) and proves the restore to the
// agent for it to listen again (writeWake). It returns the new task's host
// pid. On failure no task is left.
func (r *Runtime) restore(ctx context.Context, container containerd.Container, id string, base uint32) (uint32, error) {
	dir := r.checkpointDir(id)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return 0, fmt.Errorf("no checkpoint image in %s (a checkpoint cut off?): %v", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RestoreTimeout)
	defer cancel()
	task, err := container.NewTask(ctx, cio.LogFile(r.LogPath(id)), containerd.WithRestoreImagePath(dir))
	if err != nil {
		return 0, fmt.Errorf("create the task to restore: %w", err)
	}
	fail := func(err error) (uint32, error) {
		if _, derr := task.Delete(ctx, withInitKill); derr != nil && !errdefs.IsNotFound(derr) {
			if ferr := r.forceDeleteGVisor(ctx, container); ferr != nil {
				err = fmt.Errorf("%w (delete failed: %v; %v)", err, derr, ferr)
			}
		}
		return 0, err
	}
	if err := task.Start(ctx); err != nil {
		return fail(fmt.Errorf("runsc restore: %w", err))
	}
	if err := r.writeWake(ctx, id, base); err != nil {
		return fail(fmt.Errorf("ask the restored agent to listen again: %w", err))
	}
	return task.Pid(), nil
}

// noteInLog appends line to sandbox id's agent log, where callers and
// operators read what happened to its task; a log that cannot be written
// loses the line only.
func (r *Runtime) noteInLog(id, line string) {
	f, err := os.OpenFile(r.LogPath(id), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}
