package runtimes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/sandboxid"
)

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

func (r *Registry) journalPath(sandboxID string) string {
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
func (r *Registry) appendJournal(sandboxID string, sr *sandboxRuntimes, line string) error {
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
func (r *Registry) compact(sandboxID string, sr *sandboxRuntimes) error {
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
func (r *Registry) load(sandboxID string, sr *sandboxRuntimes) error {
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
		case len(fields) == 3 && fields[0] == "e" && bootIDPattern.MatchString(fields[1]) && sandboxid.ValidExec(fields[2]):
			sr.record(fields[2], fields[1])
		case len(fields) == 3 && fields[0] == "x" && bootIDPattern.MatchString(fields[1]) && sandboxid.ValidExec(fields[2]):
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
		return bootIDPattern.MatchString(f[1]) && sandboxid.ValidExec(f[2])
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
