package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// identity is one runtime of a sandbox: a containerd task and the agent
// running as its PID 1. A new task, or a new agent in the same task, is a
// new runtime; the agent's boot id (random per agent start) tells runtimes
// apart.
type identity struct {
	BootID  string
	TaskPID uint32
	// StartedAt is when the task's process started, from /proc; zero when
	// unknown.
	StartedAt    time.Time
	AgentVersion string
}

// proto returns id as a RuntimeIdentity, or nil for the zero identity.
func (id identity) proto() *berthv1.RuntimeIdentity {
	if id.BootID == "" && id.TaskPID == 0 {
		return nil
	}
	out := &berthv1.RuntimeIdentity{AgentBootId: id.BootID, TaskPid: id.TaskPID}
	if !id.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(id.StartedAt)
	}
	return out
}

// String names the runtime for messages: "agent boot 1a2b3c4d, task pid 42".
func (id identity) String() string {
	if id.BootID == "" {
		if id.TaskPID == 0 {
			return "no runtime"
		}
		return fmt.Sprintf("task pid %d", id.TaskPID)
	}
	return fmt.Sprintf("agent boot %s, task pid %d", shortBoot(id.BootID), id.TaskPID)
}

// shortBoot abbreviates a boot id for messages; details carry it whole.
func shortBoot(boot string) string {
	if len(boot) > 8 {
		return boot[:8]
	}
	return boot
}

// runtimeIdentity returns the RuntimeIdentity reported for a sandbox by
// GetSandbox and ListSandboxes: the running task's pid and start time and
// the agent's boot id when it answered; nil when the task does not run.
func runtimeIdentity(sb runtime.Sandbox, info *agentv1.InfoResponse) *berthv1.RuntimeIdentity {
	if !sb.Running {
		return nil
	}
	id := identity{TaskPID: sb.TaskPID, BootID: info.GetBootId()}
	id.StartedAt, _ = procStartTime(sb.TaskPID)
	out := id.proto()
	if out == nil {
		out = &berthv1.RuntimeIdentity{}
	}
	return out
}

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

// identities remembers, per sandbox, its current runtime, its earlier
// runtimes, and which runtime each exec id was started in: the facts that
// tell a stale exec id (STALE_HANDLE) from an unknown one (EXEC_NOT_FOUND)
// and fill RuntimeReplaced's before and after.
//
// With a journal directory it appends every new runtime and exec record to
// a per-sandbox journal file there, and reads it back the first time a
// sandbox is looked at, so that a restarted berthd still recognizes exec
// ids from earlier runtimes. Without one, it remembers only what this
// berthd process saw.
type identities struct {
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

func newIdentities(dir string, log *slog.Logger) *identities {
	return &identities{dir: dir, log: log, sandboxes: make(map[string]*sandboxRuntimes)}
}

// get returns the record of sandboxID, loading its journal on first use
// and creating it when there is none. The caller holds r.mu.
func (r *identities) get(sandboxID string) *sandboxRuntimes {
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
func (r *identities) peek(sandboxID string) *sandboxRuntimes {
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

// current returns the sandbox's last observed runtime; the zero identity
// when none was observed.
func (r *identities) current(sandboxID string) identity {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sr := r.peek(sandboxID); sr != nil {
		return sr.current
	}
	return identity{}
}

// observe records id as the sandbox's current runtime. A different boot id
// than before makes the previous runtime an earlier one. It returns the
// previous current runtime.
func (r *identities) observe(sandboxID string, id identity) identity {
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

// taskGone notes that the task with host pid pid (0: whichever) of the
// sandbox exited or was deleted.
func (r *identities) taskGone(sandboxID string, pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr, ok := r.sandboxes[sandboxID]
	if ok && (pid == 0 || sr.current.TaskPID == pid) {
		sr.gone = true
	}
}

// live returns the sandbox's current runtime unless containerd reported
// its task gone; ok is false when there is none.
func (r *identities) live(sandboxID string) (id identity, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil {
		return identity{}, false
	}
	return sr.current, sr.current.BootID != "" && !sr.gone
}

// setRestarting marks whether berthd is starting a new task for the
// sandbox.
func (r *identities) setRestarting(sandboxID string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	if sr.restarting != on {
		sr.restarting = on
		sr.notify()
	}
}

// awaitReplacement waits until the sandbox has a runtime other than the one
// with boot id old, and returns it. It returns the zero identity and
// whether a restart is still under way when ctx ends first, and at once
// when no restart is under way.
func (r *identities) awaitReplacement(ctx context.Context, sandboxID, old string) (identity, bool) {
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

// recordExec records that execID is started in the runtime with bootID,
// and reports whether the record is new. It is called before the start is sent to the agent (a write-ahead
// record): when the journal cannot take the record it returns the
// journal's error and records nothing, and the start must not be sent —
// an exec the journal does not know could run a second time after a
// berthd restart, when its id no longer reads as stale.
func (r *identities) recordExec(sandboxID, execID, bootID string) (added bool, err error) {
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

// retractExec forgets the write-ahead record of execID in the runtime with
// bootID: the agent refused the start, or it was never sent, so nothing
// ran. The retraction is journaled too; when that write fails the journal
// keeps the record, which errs on the safe side (a later start of the id
// in another runtime is STALE_HANDLE although nothing ran).
func (r *identities) retractExec(sandboxID, execID, bootID string) {
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

// execRuntime returns the runtime execID was started in, and false when
// no start of it was recorded; the zero identity and true when none was
// recorded but the sandbox's journal was found damaged. A runtime no longer remembered in full is
// returned with its boot id only.
func (r *identities) execRuntime(sandboxID, execID string) (identity, bool) {
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

// setOwner remembers owner as the owner of the sandbox whose runtime has
// boot id bootID; an empty bootID forgets the owner (a warm-pool claim).
func (r *identities) setOwner(sandboxID, bootID, owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.get(sandboxID)
	sr.owner, sr.ownerBoot = owner, bootID
}

// ownerOf returns the owner remembered for the sandbox's runtime with boot
// id bootID; false when none is.
func (r *identities) ownerOf(sandboxID, bootID string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.peek(sandboxID)
	if sr == nil || bootID == "" || sr.ownerBoot != bootID {
		return "", false
	}
	return sr.owner, true
}

// forget drops everything known about the sandbox, journal included.
func (r *identities) forget(sandboxID string) {
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

// pruneJournals removes the journals of sandboxes not in keep: sandboxes
// deleted while berthd was not running.
func (r *identities) pruneJournals(keep map[string]uint64) {
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
		if _, live := keep[id]; live {
			continue
		}
		if _, seen := r.sandboxes[id]; seen {
			continue // created since keep was listed
		}
		os.Remove(filepath.Join(r.dir, e.Name()))
	}
}

// The journal is a text file per sandbox, one record per line:
//
//	r <boot id> <task pid> <task start, unix ns> <agent version>
//	e <boot id> <exec id>
//	x <boot id> <exec id>
//
// "r" records a runtime berthd observed (the last one is the current one),
// "e" that an exec id was started in the runtime of that boot id (written
// before the start reaches the agent), "x" that such a start was refused or
// never sent, so the "e" before it no longer holds. Lines that
// do not parse are skipped: the journal holds hints, never authority over
// what runs.
const journalSuffix = ".journal"

var (
	bootIDPattern  = regexp.MustCompile(`^[0-9a-f]{1,64}$`)
	versionPattern = regexp.MustCompile(`^[!-~]{1,64}$`)
)

func (r *identities) journalPath(sandboxID string) string {
	return filepath.Join(r.dir, sandboxID+journalSuffix)
}

func runtimeLine(id identity) string {
	var started int64
	if !id.StartedAt.IsZero() {
		started = id.StartedAt.UnixNano()
	}
	version := id.AgentVersion
	if !versionPattern.MatchString(version) {
		version = "-"
	}
	return fmt.Sprintf("r %s %d %d %s\n", id.BootID, id.TaskPID, started, version)
}

// appendJournal appends line to the sandbox's journal, compacting the
// journal first when it holds far more lines than records (sr must hold
// line's record already). The caller holds r.mu. It returns the write's
// error; a partly written line (a full file system) is cut off again, so
// the journal's lines stay whole.
func (r *identities) appendJournal(sandboxID string, sr *sandboxRuntimes, line string) error {
	if r.dir == "" {
		return nil
	}
	if sr.journalLines > maxJournalLines(len(sr.execs)+len(sr.past)) {
		if err := r.compact(sandboxID, sr); err != nil {
			r.log.Warn("compact runtime journal", slog.String("sandbox_id", sandboxID), slog.Any("error", err))
		} else {
			return nil // the compacted journal holds line's record already
		}
	}
	if sr.journal == nil {
		f, err := os.OpenFile(r.journalPath(sandboxID), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open runtime journal: %w", err)
		}
		sr.journal = f
	}
	st, err := sr.journal.Stat()
	if err == nil {
		var n int
		n, err = sr.journal.WriteString(sealLine(line))
		if err != nil && n > 0 {
			sr.journal.Truncate(st.Size())
		}
	}
	if err != nil {
		return fmt.Errorf("append to runtime journal: %w", err)
	}
	sr.journalLines++
	return nil
}

// closeJournal closes sr's journal file, if open.
func (sr *sandboxRuntimes) closeJournal() {
	if sr.journal != nil {
		sr.journal.Close()
		sr.journal = nil
	}
}

// maxJournalLines is how many lines a journal holding records records may
// grow to before it is compacted: with at most maxExecRecords exec records
// and maxPastRuntimes runtimes, a journal stays under about 1.1 MB (51
// bytes a line), however many execs the sandbox ran.
func maxJournalLines(records int) int { return 2*(records+1) + 1024 }

// compact rewrites the sandbox's journal from memory, atomically.
func (r *identities) compact(sandboxID string, sr *sandboxRuntimes) error {
	var b bytes.Buffer
	lines := 0
	add := func(line string) {
		b.WriteString(sealLine(line))
		lines++
	}
	if sr.damaged {
		add("d\n")
	}
	for _, id := range sr.past {
		add(runtimeLine(id))
	}
	if sr.current.BootID != "" {
		add(runtimeLine(sr.current))
	}
	for _, execID := range sr.order {
		add(fmt.Sprintf("e %s %s\n", sr.execs[execID], execID))
	}
	tmp := r.journalPath(sandboxID) + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, r.journalPath(sandboxID)); err != nil {
		os.Remove(tmp)
		return err
	}
	// The file open for appending is the replaced one now.
	sr.closeJournal()
	sr.journalLines = lines
	return nil
}

// load reads the sandbox's journal into sr.
func (r *identities) load(sandboxID string, sr *sandboxRuntimes) error {
	f, err := os.Open(r.journalPath(sandboxID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := newLineScanner(io.LimitReader(f, maxJournalBytes), maxJournalLine)
	sealed := false // a sealed line was read: unsealed ones are damage
	for sc.Scan() {
		sr.journalLines++
		line, ok := openLine(sc.Text())
		switch {
		case ok:
			sealed = true
		case !sc.Whole():
			continue // a write cut short: it recorded nothing
		case sealed || !legacyRecord(line):
			sr.damaged = true
			continue
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) == 1 && fields[0] == "d":
			sr.damaged = true
		case len(fields) == 5 && fields[0] == "r" && bootIDPattern.MatchString(fields[1]):
			pid, err1 := strconv.ParseUint(fields[2], 10, 32)
			started, err2 := strconv.ParseInt(fields[3], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			id := identity{BootID: fields[1], TaskPID: uint32(pid)}
			if started > 0 {
				id.StartedAt = time.Unix(0, started)
			}
			if fields[4] != "-" {
				id.AgentVersion = fields[4]
			}
			if sr.current.BootID != "" && sr.current.BootID != id.BootID {
				sr.past = append(sr.past, sr.current)
			}
			sr.current = id
		case len(fields) == 3 && fields[0] == "e" && bootIDPattern.MatchString(fields[1]) && execIDPattern.MatchString(fields[2]):
			sr.record(fields[2], fields[1])
		case len(fields) == 3 && fields[0] == "x" && bootIDPattern.MatchString(fields[1]) && execIDPattern.MatchString(fields[2]):
			if sr.execs[fields[2]] == fields[1] {
				sr.unrecord(fields[2])
			}
		default:
			sr.damaged = true
		}
	}
	if sc.skipped > 0 {
		sr.damaged = true // no record is that long
	}
	if len(sr.past) > maxPastRuntimes {
		sr.past = sr.past[len(sr.past)-maxPastRuntimes:]
	}
	return sc.Err()
}

// maxJournalLine is the longest journal line read: a record is under 250
// bytes; a longer line is not a record and is skipped whole.
const maxJournalLine = 4 << 10

// journalTable is the CRC-32C table of the journal's line checksums.
var journalTable = crc32.MakeTable(crc32.Castagnoli)

// sealLine returns line (one record and its newline) with the CRC-32C of
// the record appended as 8 hex digits: "e <boot> <exec> 1a2b3c4d\n".
func sealLine(line string) string {
	rec := strings.TrimSuffix(line, "\n")
	return fmt.Sprintf("%s %08x\n", rec, crc32.Checksum([]byte(rec), journalTable))
}

// openLine returns the record of a sealed line and whether its checksum
// holds; for any other line, the line itself and false.
func openLine(line string) (string, bool) {
	i := strings.LastIndexByte(line, ' ')
	if i < 0 || len(line)-i-1 != 8 {
		return line, false
	}
	sum, err := strconv.ParseUint(line[i+1:], 16, 32)
	if err != nil || uint32(sum) != crc32.Checksum([]byte(line[:i]), journalTable) {
		return line, false
	}
	return line[:i], true
}

// legacyRecord reports whether line is a whole record as berthds before
// sealed lines wrote them (accepted only in a journal with no sealed line).
func legacyRecord(line string) bool {
	f := strings.Fields(line)
	switch {
	case len(f) == 5 && f[0] == "r" && bootIDPattern.MatchString(f[1]):
		_, err1 := strconv.ParseUint(f[2], 10, 32)
		_, err2 := strconv.ParseInt(f[3], 10, 64)
		return err1 == nil && err2 == nil
	case len(f) == 3 && (f[0] == "e" || f[0] == "x"):
		return bootIDPattern.MatchString(f[1]) && execIDPattern.MatchString(f[2])
	}
	return false
}

// lineScanner reads lines like bufio.Scanner, except that a line longer
// than its buffer is skipped whole instead of ending the scan: a Scanner
// stops at the first line over its 64 KiB and drops every line after it.
type lineScanner struct {
	r       *bufio.Reader
	line    []byte
	whole   bool
	skipped int // lines over the buffer's size, skipped
	err     error
}

func newLineScanner(r io.Reader, max int) *lineScanner {
	return &lineScanner{r: bufio.NewReaderSize(r, max)}
}

// Scan advances to the next line of at most the buffer's size, without its
// newline (a last line without one included); false at the end or on a
// read error (Err).
func (s *lineScanner) Scan() bool {
	skipping := false
	for {
		line, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			skipping = true
			continue
		}
		if !skipping && len(line) > 0 {
			s.whole = bytes.HasSuffix(line, []byte("\n"))
			s.line = bytes.TrimSuffix(line, []byte("\n"))
			if err != nil && !errors.Is(err, io.EOF) {
				s.err = err
			}
			return true
		}
		if skipping {
			s.skipped++ // the end of a long line, dropped
		}
		skipping = false
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			return false
		}
	}
}

// Whole reports whether the current line ended with a newline (the last
// line of a file may not: a write cut short).
func (s *lineScanner) Whole() bool { return s.whole }

// Text returns the current line.
func (s *lineScanner) Text() string { return string(s.line) }

// Err returns the first read error other than io.EOF.
func (s *lineScanner) Err() error { return s.err }

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's starttime: 100 on
// every Linux architecture berth runs on (proc(5)).
const clockTicks = 100

// bootTime is when the host booted, to the nanosecond: the wall clock less
// CLOCK_BOOTTIME, the clock /proc/<pid>/stat's starttime counts on
// (proc(5)), taken once so that a runtime's start time reads the same every
// time. /proc/stat's btime has whole seconds only, which put start times up
// to a second early — before events they followed.
var bootTime = sync.OnceValues(func() (time.Time, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, fmt.Errorf("clock_gettime(CLOCK_BOOTTIME): %w", err)
	}
	return time.Now().Add(-time.Duration(ts.Nano())), nil
})

// procStartTime returns when host process pid started: boot time plus
// field 22 (starttime, in clock ticks) of /proc/<pid>/stat (proc(5)). Its
// resolution is a clock tick (10 ms), rounded down.
func procStartTime(pid uint32) (time.Time, error) {
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, err
	}
	fields, err := procfs.Stat(pid)
	if err != nil {
		return time.Time{}, err
	}
	ticks, err := strconv.ParseUint(fields[procfs.StartTimeField], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat starttime: %w", pid, err)
	}
	return boot.Add(time.Duration(ticks) * (time.Second / clockTicks)), nil
}

// procCPU returns the CPU time host process pid has used in its current
// threads, to the nanosecond: the sum of the first field of
// /proc/<pid>/task/<tid>/schedstat (run time, ns), falling back to fields
// 14 and 15 (utime, stime: 10 ms ticks) of /proc/<pid>/stat (proc(5)). A
// thread that exits takes its time with it, so only a change means work.
func procCPU(pid uint32) (time.Duration, error) {
	if pid == 0 {
		return 0, errors.New("no pid")
	}
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		var sum uint64
		read := 0
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				if ns, err := strconv.ParseUint(f[0], 10, 64); err == nil {
					sum += ns
					read++
				}
			}
		}
		if read > 0 {
			return time.Duration(sum), nil
		}
	}
	fields, err := procfs.Stat(pid)
	if err != nil {
		return 0, err
	}
	const utime, stime = 14, 15
	u, err1 := strconv.ParseUint(fields[utime], 10, 64)
	s, err2 := strconv.ParseUint(fields[stime], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat utime, stime: %w", pid, err)
	}
	return time.Duration(u+s) * (time.Second / clockTicks), nil
}

// procRunnable reports whether a thread of host process pid is running or
// waiting for a CPU (state R in /proc/<pid>/task/<tid>/stat, proc(5)).
func procRunnable(pid uint32) bool {
	if pid == 0 {
		return false
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue
		}
		// The state, field 3, follows the command name's last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'R' {
			return true
		}
	}
	return false
}

// procStopped reports whether host process pid is stopped by a signal
// (state T, or t when traced, in /proc/<pid>/stat, proc(5)).
func procStopped(pid uint32) bool {
	fields, err := procfs.Stat(pid)
	return err == nil && (fields[3] == "T" || fields[3] == "t")
}
