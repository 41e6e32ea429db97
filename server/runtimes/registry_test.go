package runtimes

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func boot(n int) string { return fmt.Sprintf("%032x", n) }

func TestIdentitiesRecordsRuntimes(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		name := "memory"
		if dir != "" {
			name = "journal"
		}
		t.Run(name, func(t *testing.T) {
			r := NewRegistry(dir, discard)
			one := identity{BootID: boot(1), TaskPID: 10, StartedAt: time.Unix(1000, 0), AgentVersion: "v1"}
			two := identity{BootID: boot(2), TaskPID: 20, AgentVersion: "v1"}
			if prev := r.Observe("sb", one); prev != (identity{}) {
				t.Errorf("first observe returned %v, want the zero identity", prev)
			}
			r.RecordExec("sb", "build", one.BootID)
			r.RecordExec("sb", "test", one.BootID)
			if prev := r.Observe("sb", two); prev != one {
				t.Errorf("observe(two) returned %v, want %v", prev, one)
			}
			r.RecordExec("sb", "test", two.BootID) // started again in the new runtime
			if got := r.Current("sb"); got != two {
				t.Errorf("current = %v, want %v", got, two)
			}
			for execID, want := range map[string]identity{"build": one, "test": two} {
				if got, ok := r.ExecRuntime("sb", execID); !ok || got != want {
					t.Errorf("execRuntime(%s) = %v, %v; want %v", execID, got, ok, want)
				}
			}
			if got, ok := r.ExecRuntime("sb", "never"); ok {
				t.Errorf("execRuntime(never) = %v, want none", got)
			}
			if dir == "" {
				return
			}
			// A new berthd reads the journal back.
			fresh := NewRegistry(dir, discard)
			if got := fresh.Current("sb"); got != two {
				t.Errorf("reloaded current = %v, want %v", got, two)
			}
			if got, ok := fresh.Live("sb"); ok {
				t.Errorf("reloaded runtime %v is live before its agent answered", got)
			}
			if got, ok := fresh.ExecRuntime("sb", "build"); !ok || got != one {
				t.Errorf("reloaded execRuntime(build) = %v, %v; want %v", got, ok, one)
			}
			fresh.Forget("sb")
			if _, err := os.Stat(filepath.Join(dir, "sb"+journalSuffix)); !os.IsNotExist(err) {
				t.Errorf("journal after forget: %v, want it removed", err)
			}
			if _, ok := NewRegistry(dir, discard).ExecRuntime("sb", "build"); ok {
				t.Error("exec record survived forget")
			}
		})
	}
}

// TestJournalDamageFailsClosed: a journal with a line that fails its
// checksum or does not parse (random bytes written over it, a legacy line
// after sealed ones) keeps every record that holds, and from then on an
// exec id berthd does not know in that sandbox is taken for one of an
// earlier runtime (STALE_HANDLE), never started again; the mark survives a
// reload. A last line cut short by a crash is no damage.
func TestJournalDamageFailsClosed(t *testing.T) {
	seal := func(l string) string { return strings.TrimSuffix(sealLine(l+"\n"), "\n") }
	for _, tc := range []struct {
		name    string
		lines   []string
		damaged bool
	}{
		{"sealed", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1")}, false},
		{"legacy", []string{"r " + boot(1) + " 10 0 v1", "e " + boot(1) + " ok-1"}, false},
		{"cut short", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1"), "e " + boot(1) + " ha"}, false},
		{"random bytes", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1"), "\x8f\x01 zz\xff q", seal("e " + boot(1) + " ok-3")}, true},
		{"checksum", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1"), strings.Replace(seal("e "+boot(1)+" ok-2"), "ok-2", "ok-9", 1)}, true},
		{"legacy after sealed", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1"), "e " + boot(1) + " ok-2"}, true},
		{"malformed legacy", []string{"r " + boot(1) + " 10 0 v1", "e " + boot(1) + " ok-1", "e " + boot(1) + " bad/id"}, true},
		{"long line", []string{seal("r " + boot(1) + " 10 0 v1"), seal("e " + boot(1) + " ok-1"), strings.Repeat("z", 100000)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			text := strings.Join(tc.lines, "\n")
			if tc.name != "cut short" {
				text += "\n"
			}
			if err := os.WriteFile(filepath.Join(dir, "sb"+journalSuffix), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			first := NewRegistry(dir, slog.New(slog.NewJSONHandler(&logged, nil)))
			for round, r := range []*Registry{first, nil} {
				if r == nil {
					r = NewRegistry(dir, discard) // after the rewrite
				}
				if got := r.Current("sb"); got.BootID != boot(1) || got.TaskPID != 10 {
					t.Errorf("round %d: current = %v, want boot 1 pid 10", round, got)
				}
				if got, ok := r.ExecRuntime("sb", "ok-1"); !ok || got.BootID != boot(1) {
					t.Errorf("round %d: execRuntime(ok-1) = %v, %v; want runtime 1", round, got, ok)
				}
				got, known := r.ExecRuntime("sb", "never-started")
				if known != tc.damaged || got.BootID != "" {
					t.Errorf("round %d: execRuntime(never-started) = %v, %v; want known=%v (damaged journal: fail closed) with no runtime", round, got, known, tc.damaged)
				}
				if tc.damaged {
					if _, ok := r.ExecRuntime("sb", "ok-9"); !ok {
						t.Errorf("round %d: ok-9 of a line that fails its checksum is startable", round)
					}
				}
			}
			// The damage is said once, at ERROR, naming the sandbox and
			// the journal; an intact journal logs no error.
			errs := 0
			for line := range strings.Lines(logged.String()) {
				if strings.Contains(line, `"level":"ERROR"`) {
					errs++
					if !strings.Contains(line, "runtime journal damaged") || !strings.Contains(line, `"sandbox_id":"sb"`) || !strings.Contains(line, journalSuffix) {
						t.Errorf("ERROR line %s does not name the damage, the sandbox and the journal", line)
					}
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.damaged]; errs != want {
				t.Errorf("%d ERROR lines loading the journal; want %d:\n%s", errs, want, logged.String())
			}
		})
	}
}

func TestJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	r := NewRegistry(dir, discard)
	r.Observe("sb", identity{BootID: boot(1), TaskPID: 1})
	// Restarting an exec under alternating runtimes appends a line each
	// time while the records stay few.
	for i := range 5000 {
		b := boot(1 + i%2)
		r.Observe("sb", identity{BootID: b, TaskPID: uint32(1 + i%2)})
		r.RecordExec("sb", "same", b)
	}
	b, err := os.ReadFile(filepath.Join(dir, "sb"+journalSuffix))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 2*(1+maxPastRuntimes)+1024+2 {
		t.Errorf("journal has %d lines after compaction, want about the records", n)
	}
	fresh := NewRegistry(dir, discard)
	if got, ok := fresh.ExecRuntime("sb", "same"); !ok || got.BootID != r.Current("sb").BootID {
		t.Errorf("after compaction execRuntime = %v, %v; want the current runtime %v", got, ok, r.Current("sb"))
	}
}

func TestExecRecordsBounded(t *testing.T) {
	r := NewRegistry("", discard)
	for i := range maxExecRecords + 10 {
		r.RecordExec("sb", fmt.Sprintf("ex-%d", i), boot(1))
	}
	if _, ok := r.ExecRuntime("sb", "ex-0"); ok {
		t.Error("oldest record kept beyond the bound")
	}
	if _, ok := r.ExecRuntime("sb", fmt.Sprintf("ex-%d", maxExecRecords+9)); !ok {
		t.Error("newest record dropped")
	}
}

// TestJournalBounded records five times as many execs as are remembered:
// the journal file stays within a bound (compaction), whatever the count,
// and reloads the newest records.
func TestJournalBounded(t *testing.T) {
	dir := t.TempDir()
	r := NewRegistry(dir, discard)
	r.Observe("sb", identity{BootID: boot(1), TaskPID: 1})
	path := filepath.Join(dir, "sb"+journalSuffix)
	var largest int64
	for i := range 5 * maxExecRecords {
		r.RecordExec("sb", fmt.Sprintf("ex-%d", i), boot(1))
		if i%1000 == 999 {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			largest = max(largest, st.Size())
		}
	}
	// README: "stays under about 1.1 MB however many execs run" (51-byte
	// lines, twice the 10 000 records and some before a compaction).
	const bound = 1200 << 10
	if largest > bound {
		t.Errorf("journal reached %d bytes after %d execs, want at most %d", largest, 5*maxExecRecords, bound)
	}
	fresh := NewRegistry(dir, discard)
	if _, ok := fresh.ExecRuntime("sb", fmt.Sprintf("ex-%d", 5*maxExecRecords-1)); !ok {
		t.Error("newest record not reloaded")
	}
	if _, ok := fresh.ExecRuntime("sb", "ex-0"); ok {
		t.Error("a record beyond the bound was reloaded")
	}
}

func TestAwaitReplacement(t *testing.T) {
	r := NewRegistry("", discard)
	old := identity{BootID: boot(1), TaskPID: 1}
	r.Observe("sb", old)

	// No restart under way: at once, nothing.
	if got, restarting := r.AwaitReplacement(context.Background(), "sb", old.BootID); got != (identity{}) || restarting {
		t.Errorf("without a restart = %v, %v; want nothing", got, restarting)
	}
	// A restart that completes.
	r.SetRestarting("sb", true)
	next := identity{BootID: boot(2), TaskPID: 2}
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(20 * time.Millisecond)
		r.Observe("sb", next)
		r.SetRestarting("sb", false)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, _ := r.AwaitReplacement(ctx, "sb", old.BootID); got != next {
		t.Errorf("after a restart = %v, want %v", got, next)
	}
	// The restart's end must not land in the next case's restart.
	<-restarted
	// A restart that does not complete in time.
	r.SetRestarting("sb", true)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if got, restarting := r.AwaitReplacement(ctx, "sb", next.BootID); got != (identity{}) || !restarting {
		t.Errorf("during a slow restart = %v, %v; want nothing yet, restarting", got, restarting)
	}
}

func TestLookupsLeaveNothing(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		r := NewRegistry(dir, discard)
		for i := range 100 {
			id := fmt.Sprintf("no-such-%d", i)
			r.Current(id)
			r.Live(id)
			r.ExecRuntime(id, "x")
			r.TaskGone(id, 1)
			r.AwaitReplacement(context.Background(), id, "")
		}
		if len(r.sandboxes) != 0 {
			t.Errorf("journal %q: lookups of unknown sandboxes left %d records", dir, len(r.sandboxes))
		}
	}
}

// TestJournalFailsClosed checks that an exec record the journal cannot
// take is refused and not kept, that a retracted record reads back as
// unknown, and that a failed write leaves the journal's lines whole.
func TestJournalFailsClosed(t *testing.T) {
	dir := t.TempDir()
	r := NewRegistry(dir, discard)
	one := identity{BootID: boot(1), TaskPID: 10}
	r.Observe("sb", one)
	if added, err := r.RecordExec("sb", "spent", one.BootID); err != nil || !added {
		t.Fatalf("recordExec(spent) = %v, %v; want added", added, err)
	}
	if added, err := r.RecordExec("sb", "refused", one.BootID); err != nil || !added {
		t.Fatalf("recordExec(refused) = %v, %v; want added", added, err)
	}
	r.RetractExec("sb", "refused", one.BootID)
	if got, ok := r.ExecRuntime("sb", "refused"); ok {
		t.Errorf("execRuntime(refused) after retraction = %v, want unknown", got)
	}

	// The journal's descriptor on /dev/full: every write fails with
	// ENOSPC, as on a full file system.
	saved, err := os.ReadFile(filepath.Join(dir, "sb"+journalSuffix))
	if err != nil {
		t.Fatal(err)
	}
	sr := r.sandboxes["sb"]
	sr.closeJournal()
	if sr.journal, err = os.OpenFile("/dev/full", os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	}
	added, err := r.RecordExec("sb", "blocked", one.BootID)
	if err == nil || added {
		t.Fatalf("recordExec(blocked) on a full journal = %v, %v; want an error", added, err)
	}
	if got, ok := r.ExecRuntime("sb", "blocked"); ok {
		t.Errorf("execRuntime(blocked) after a failed record = %v, want unknown", got)
	}
	sr.closeJournal()
	journal := filepath.Join(dir, "sb"+journalSuffix)

	fresh := NewRegistry(dir, discard)
	if got, ok := fresh.ExecRuntime("sb", "spent"); !ok || got.BootID != one.BootID {
		t.Errorf("reloaded execRuntime(spent) = %v, %v; want %v", got, ok, one)
	}
	for _, id := range []string{"refused", "blocked"} {
		if got, ok := fresh.ExecRuntime("sb", id); ok {
			t.Errorf("reloaded execRuntime(%s) = %v, want unknown", id, got)
		}
	}
	if b, _ := os.ReadFile(journal); string(b) != string(saved) {
		t.Errorf("journal after the failed write = %q, want %q", b, saved)
	}
}
