package files

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-sandbox/berth/internal/tartree"
)

// An upload extracts into a staging directory (tartree.Extract), which it
// removes or renames into place before it answers. An agent that dies
// meanwhile (SIGKILL, the OOM killer, a stopped sandbox) leaves it behind:
// mode 0700, holding part of an archive, counted against the disk quota.
// So while it exists it is recorded in the agent's own directory
// (Config.AgentDir, /.berth-run in a sandbox, which outlives the agent's
// restarts), one file per staging directory named stagingRecordPrefix and
// the directory's random suffix, holding its absolute path; at start
// RemoveStaleStaging removes what the records name.
//
// Only recorded paths are removed, never a name found by pattern: a
// workload's own ".berth-upload-..." directory stays. A record the workload
// forged (its root can write in /.berth-run) can only name a directory of
// that pattern, which is removed as the workload user: nothing the
// workload could not remove itself.

// stagingRecordPrefix starts the name of a staging directory's record.
const stagingRecordPrefix = "upload-"

// recordStaging records the staging directory path before it is made
// (tartree.Options.Staging), as the agent: the workload user may not
// write in the agent's directory. It returns forget, which drops the
// record once the directory is gone; a directory that Extract could not
// remove keeps its record for the next start. Without an agent directory,
// or when the record cannot be written (its tmpfs is full), the upload
// goes on unrecorded and the failure is logged: a crash would then leave
// the directory, as before.
func (s *Service) recordStaging(path string) (forget func()) {
	if s.cfg.AgentDir == "" {
		return func() {}
	}
	base := filepath.Base(path)
	record := filepath.Join(s.cfg.AgentDir, stagingRecordPrefix+base[strings.LastIndexByte(base, '-')+1:])
	if err := asAgent(func() error { return os.WriteFile(record, []byte(path), 0o600) }); err != nil {
		s.log.Warn("upload staging directory not recorded: a crash would leave it behind", "staging", path, "err", err)
		return func() {}
	}
	return func() {
		err := asAgent(func() error {
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("staging directory still there (%v): record kept for the next start", err)
			}
			return os.Remove(record)
		})
		if err != nil {
			s.log.Warn("upload staging record", "record", record, "staging", path, "err", err)
		}
	}
}

// asAgent runs fn with the agent's own identity: on another thread than
// the workload user's of asUser, which may be the caller's.
func asAgent(fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	return <-done
}

// maxStagingRecord bounds a record's size: a path (PATH_MAX, 4096 bytes).
const maxStagingRecord = 4096

// RemoveStaleStaging removes the staging directories of uploads that a
// previous agent left (see recordStaging) and their records. The agent calls it at start, before it
// serves: no upload of its own is in flight. A record is dropped when the
// path it holds is absolute and named as a staging directory
// (tartree.IsStagingName) with the record's suffix, after removing that
// directory (lstat(2): not through a symbolic link) as the workload user;
// a record that says anything else is dropped with the directory left.
// Failures are logged, never fatal.
func (s *Service) RemoveStaleStaging() {
	if s.cfg.AgentDir == "" {
		return
	}
	entries, err := os.ReadDir(s.cfg.AgentDir)
	if err != nil {
		s.log.Warn("stale upload staging directories not looked for", "dir", s.cfg.AgentDir, "err", err)
		return
	}
	for _, e := range entries {
		suffix, ok := strings.CutPrefix(e.Name(), stagingRecordPrefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		record := filepath.Join(s.cfg.AgentDir, e.Name())
		path, err := readRecord(record)
		switch {
		case err != nil:
			s.log.Warn("upload staging record unreadable; dropped", "record", record, "err", err)
		case !filepath.IsAbs(path) || filepath.Clean(path) != path || !tartree.IsStagingName(filepath.Base(path)) || !strings.HasSuffix(path, "-"+suffix):
			s.log.Warn("upload staging record names no staging directory; dropped", "record", record, "path", path)
		default:
			err := s.asUser(func() error {
				fi, err := os.Lstat(path)
				switch {
				case errors.Is(err, fs.ErrNotExist):
					return nil // moved into place or removed before the crash
				case err != nil:
					return err
				case !fi.IsDir():
					return fmt.Errorf("not a directory (%v)", fi.Mode().Type())
				}
				return os.RemoveAll(path)
			})
			if err != nil {
				s.log.Warn("stale upload staging directory not removed", "staging", path, "err", err)
			} else {
				s.log.Info("stale upload staging directory removed", "staging", path)
			}
		}
		if err := os.Remove(record); err != nil {
			s.log.Warn("upload staging record not removed", "record", record, "err", err)
		}
	}
}

// readRecord reads a staging record of at most maxStagingRecord bytes.
func readRecord(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, maxStagingRecord+1)
	n, err := f.Read(b)
	if err != nil {
		return "", err
	}
	if n > maxStagingRecord {
		return "", fmt.Errorf("longer than %d bytes", maxStagingRecord)
	}
	return string(b[:n]), nil
}
