package runtimes

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/berth-sandbox/berth/server/apierr"
)

// identity is one runtime of a sandbox.
type identity = apierr.Runtime

// Bounds of what berthd remembers per sandbox.
const (
	// maxPastRuntimes is how many earlier runtimes of a sandbox are kept.
	maxPastRuntimes = 32
	// maxExecRecords is how many exec ids per sandbox are kept with the
	// runtime they were started in; the oldest are forgotten first, and an
	// exec id forgotten is NOT_FOUND rather than STALE_HANDLE.
	maxExecRecords = 10000
	// maxJournalBytes bounds how much of a journal is read at load.
	maxJournalBytes = 16 << 20
)

// Registry remembers, per sandbox, its current runtime, its earlier
// runtimes, and which runtime each exec id was started in: the facts that
// tell a stale exec id (STALE_HANDLE) from an unknown one (EXEC_NOT_FOUND)
// and fill RuntimeReplaced's before and after.
//
// With a journal directory it appends every new runtime and exec record to
// a per-sandbox journal file there, and reads it back the first time a
// sandbox is looked at, so that a restarted berthd still recognizes exec
// ids from earlier runtimes. Without one, it remembers only what this
// berthd process saw.
type Registry struct {
	dir string // journal directory; "" keeps everything in memory only
	log *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*sandboxRuntimes
}

type sandboxRuntimes struct {
	current identity
	// gone is true once containerd reported the exit or deletion of the
	// current runtime's task.
	gone bool
	past []identity // oldest first
	// execs maps exec id to the boot id of the runtime it was started in;
	// order lists exec ids oldest record first, for eviction.
	execs map[string]string
	order []string
	// restarting is true while berthd starts a new task for the sandbox.
	restarting bool
	// changed is closed and replaced whenever current or restarting change.
	changed chan struct{}
	// journalLines counts lines in the journal file, to know when to
	// compact it.
	journalLines int
	// damaged is true once a line of the journal failed its checksum or
	// did not parse (a "d" record keeps it so): berthd no longer knows
	// every exec id it started, so an id it does not know is taken for
	// one of an earlier runtime (execRuntime), never started anew.
	damaged bool
	// journal is the journal file, open for appending once written: a
	// start then needs no new descriptor (berthd out of descriptors still
	// runs execs in sandboxes it knows).
	journal *os.File
	// owner is the sandbox's owner (principal) as containerd recorded it
	// while the runtime with boot id ownerBoot ran: reach trusts it for
	// that runtime only, so a sandbox deleted and created anew behind
	// berthd's back (another berthd on the namespace) is looked up again.
	owner, ownerBoot string
}

func NewRegistry(dir string, log *slog.Logger) *Registry {
	return &Registry{dir: dir, log: log, sandboxes: make(map[string]*sandboxRuntimes)}
}

// get returns the record of sandboxID, loading its journal on first use
// and creating it when there is none. The caller holds r.mu.
func (r *Registry) get(sandboxID string) *sandboxRuntimes {
	if sr := r.peek(sandboxID); sr != nil {
		return sr
	}
	sr := &sandboxRuntimes{execs: make(map[string]string), changed: make(chan struct{})}
	r.sandboxes[sandboxID] = sr
	return sr
}

// peek returns the record of sandboxID, loading its journal on first use,
// or nil when nothing is known of it: lookups of ids that name no sandbox
// leave nothing behind. The caller holds r.mu.
func (r *Registry) peek(sandboxID string) *sandboxRuntimes {
	if sr, ok := r.sandboxes[sandboxID]; ok {
		return sr
	}
	if r.dir == "" {
		return nil
	}
	sr := &sandboxRuntimes{execs: make(map[string]string), changed: make(chan struct{})}
	if err := r.load(sandboxID, sr); err != nil {
		r.log.Warn("read runtime journal", slog.String("sandbox_id", sandboxID), slog.Any("error", err))
	}
	if sr.journalLines == 0 {
		return nil
	}
	if sr.damaged {
		// Written anew, sealed, with the mark of the damage: later
		// loads fail closed too, and read no damaged line again.
		err := r.compact(sandboxID, sr)
		r.log.Error("runtime journal damaged: exec ids berthd does not know in this sandbox are refused as STALE_HANDLE from now on",
			slog.String("sandbox_id", sandboxID), slog.String("journal", r.journalPath(sandboxID)), slog.Any("rewrite_error", err))
	}
	// Whether the journal's last runtime still runs is unknown until its
	// agent answers: its task may have died while berthd was down, unseen.
	sr.gone = true
	r.sandboxes[sandboxID] = sr
	return sr
}

// Current returns the sandbox's last observed runtime; the zero identity
// when none was observed.
func (r *Registry) Current(sandboxID string) identity {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sr := r.peek(sandboxID); sr != nil {
		return sr.current
	}
	return identity{}
}

// Observe records id as the sandbox's current runtime. A different boot id
// than before makes the previous runtime an earlier one. It returns the
// previous current runtime.
func (r *Registry) Observe(sandboxID string, id identity) identity {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	prev := sr.current
	sr.gone = false
	if prev == id {
		return prev
	}
	if prev.BootID != "" && prev.BootID != id.BootID {
		sr.past = append(sr.past, prev)
		if len(sr.past) > maxPastRuntimes {
			sr.past = sr.past[len(sr.past)-maxPastRuntimes:]
		}
	}
	sr.current = id
	sr.notify()
	if prev.BootID != id.BootID || prev.TaskPID != id.TaskPID {
		// A runtime line that cannot be written is a lost hint only: exec
		// records name their runtime's boot id themselves.
		if err := r.appendJournal(sandboxID, sr, runtimeLine(id)); err != nil {
			r.log.Warn("append runtime journal", slog.String("sandbox_id", sandboxID), slog.Any("error", err))
		}
	}
	return prev
}

func (sr *sandboxRuntimes) notify() {
	close(sr.changed)
	sr.changed = make(chan struct{})
}

// TaskGone notes that the task with host pid pid (0: whichever) of the
// sandbox exited or was deleted.
func (r *Registry) TaskGone(sandboxID string, pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr, ok := r.sandboxes[sandboxID]
	if ok && (pid == 0 || sr.current.TaskPID == pid) {
		sr.gone = true
	}
}

// Live returns the sandbox's current runtime unless containerd reported
// its task gone; ok is false when there is none.
func (r *Registry) Live(sandboxID string) (id identity, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil {
		return identity{}, false
	}
	return sr.current, sr.current.BootID != "" && !sr.gone
}

// SetRestarting marks whether berthd is starting a new task for the
// sandbox.
func (r *Registry) SetRestarting(sandboxID string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	if sr.restarting != on {
		sr.restarting = on
		sr.notify()
	}
}

// AwaitReplacement waits until the sandbox has a runtime other than the one
// with boot id old, and returns it. It returns the zero identity and
// whether a restart is still under way when ctx ends first, and at once
// when no restart is under way.
func (r *Registry) AwaitReplacement(ctx context.Context, sandboxID, old string) (identity, bool) {
	for {
		r.mu.Lock()
		sr := r.peek(sandboxID)
		if sr == nil {
			r.mu.Unlock()
			return identity{}, false
		}
		cur, restarting, changed := sr.current, sr.restarting, sr.changed
		r.mu.Unlock()
		if cur.BootID != "" && cur.BootID != old {
			return cur, false
		}
		if !restarting {
			return identity{}, false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return identity{}, true
		}
	}
}

// RecordExec records that execID is started in the runtime with bootID,
// and reports whether the record is new. It is called before the start is sent to the agent (a write-ahead
// record): when the journal cannot take the record it returns the
// journal's error and records nothing, and the start must not be sent —
// an exec the journal does not know could run a second time after a
// berthd restart, when its id no longer reads as stale.
func (r *Registry) RecordExec(sandboxID, execID, bootID string) (added bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	if sr.execs[execID] == bootID {
		return false, nil
	}
	prev, had := sr.execs[execID]
	sr.record(execID, bootID)
	if err := r.appendJournal(sandboxID, sr, "e "+bootID+" "+execID+"\n"); err != nil {
		if had {
			sr.execs[execID] = prev
		} else {
			sr.unrecord(execID)
		}
		return false, err
	}
	return true, nil
}

// RetractExec forgets the write-ahead record of execID in the runtime with
// bootID: the agent refused the start, or it was never sent, so nothing
// ran. The retraction is journaled too; when that write fails the journal
// keeps the record, which errs on the safe side (a later start of the id
// in another runtime is STALE_HANDLE although nothing ran).
func (r *Registry) RetractExec(sandboxID, execID, bootID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil || sr.execs[execID] != bootID {
		return
	}
	sr.unrecord(execID)
	if err := r.appendJournal(sandboxID, sr, "x "+bootID+" "+execID+"\n"); err != nil {
		r.log.Warn("journal the retraction of an exec that did not start", slog.String("sandbox_id", sandboxID), slog.String("exec_id", execID), slog.Any("error", err))
	}
}

// unrecord removes execID from sr's records.
func (sr *sandboxRuntimes) unrecord(execID string) {
	if _, ok := sr.execs[execID]; !ok {
		return
	}
	delete(sr.execs, execID)
	if i := slices.Index(sr.order, execID); i >= 0 {
		sr.order = slices.Delete(sr.order, i, i+1)
	}
}

func (sr *sandboxRuntimes) record(execID, bootID string) {
	if _, ok := sr.execs[execID]; !ok {
		sr.order = append(sr.order, execID)
	}
	sr.execs[execID] = bootID
	for len(sr.execs) > maxExecRecords && len(sr.order) > 0 {
		delete(sr.execs, sr.order[0])
		sr.order = sr.order[1:]
	}
}

// ExecRuntime returns the runtime execID was started in, and false when
// no start of it was recorded; the zero identity and true when none was
// recorded but the sandbox's journal was found damaged. A runtime no longer remembered in full is
// returned with its boot id only.
func (r *Registry) ExecRuntime(sandboxID, execID string) (identity, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil {
		return identity{}, false
	}
	boot, ok := sr.execs[execID]
	if !ok {
		// A damaged journal may have lost the id's record: taken for one
		// of an unknown earlier runtime, it is never started again.
		return identity{}, sr.damaged
	}
	if sr.current.BootID == boot {
		return sr.current, true
	}
	for i := len(sr.past) - 1; i >= 0; i-- {
		if sr.past[i].BootID == boot {
			return sr.past[i], true
		}
	}
	return identity{BootID: boot}, true
}

// SetOwner remembers owner as the owner of the sandbox whose runtime has
// boot id bootID; an empty bootID forgets the owner (a warm-pool claim).
func (r *Registry) SetOwner(sandboxID, bootID, owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	sr.owner, sr.ownerBoot = owner, bootID
}

// OwnerOf returns the owner remembered for the sandbox's runtime with boot
// id bootID; false when none is.
func (r *Registry) OwnerOf(sandboxID, bootID string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil || bootID == "" || sr.ownerBoot != bootID {
		return "", false
	}
	return sr.owner, true
}

// Forget drops everything known about the sandbox, journal included.
func (r *Registry) Forget(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sr, ok := r.sandboxes[sandboxID]; ok {
		sr.notify()
		sr.closeJournal()
	}
	delete(r.sandboxes, sandboxID)
	if r.dir != "" {
		if err := os.Remove(r.journalPath(sandboxID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("remove runtime journal", slog.String("sandbox_id", sandboxID), slog.Any("error", err))
		}
	}
}

// PruneJournals removes the journals of sandboxes for which live is false:
// sandboxes deleted while berthd was not running.
func (r *Registry) PruneJournals(live func(id string) bool) {
	if r.dir == "" {
		return
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), journalSuffix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if live(id) {
			continue
		}
		if _, seen := r.sandboxes[id]; seen {
			continue // created since keep was listed
		}
		os.Remove(filepath.Join(r.dir, e.Name()))
	}
}
