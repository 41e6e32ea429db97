package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// TrimLog bounds the agent log of sandbox id: when it is over max bytes, the
// newest half of max (from a line start) is kept as agent.log.1, replacing
// the one before, and agent.log is emptied in place (copytruncate, as
// logrotate(8) calls it). containerd's shim writes the log with O_APPEND,
// so its next line lands at the new end; what the agent writes between the
// copy and the truncation is lost. It reports whether it trimmed.
func (r *Runtime) TrimLog(id string, max int64) (bool, error) {
	path := r.LogPath(id)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open agent log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat agent log: %w", err)
	}
	if st.Size() <= max {
		return false, nil
	}
	keep := max / 2
	tail := make([]byte, keep)
	n, err := f.ReadAt(tail, st.Size()-keep)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read agent log: %w", err)
	}
	tail = tail[:n]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	if err := os.WriteFile(path+".1", tail, 0o600); err != nil {
		return false, fmt.Errorf("keep the agent log's tail: %w", err)
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("empty agent log: %w", err)
	}
	return true, nil
}

// LogTail returns the last max bytes of the agent log of sandbox id, from
// the log kept by TrimLog when the log itself holds less.
func (r *Runtime) LogTail(id string, max int64) []byte {
	out := tailOf(r.LogPath(id), max)
	if int64(len(out)) < max {
		out = append(tailOf(r.LogPath(id)+".1", max-int64(len(out))), out...)
	}
	return out
}

func tailOf(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	read, _ := f.ReadAt(b, off)
	return b[:read]
}

// createLog makes the agent log of sandbox id readable by root alone
// (0600): the shim creates it 0644 otherwise, and it holds exec ids,
// commands' first arguments and pids. The shim appends to the file as it
// finds it.
func (r *Runtime) createLog(id string) error {
	f, err := os.OpenFile(r.LogPath(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("agent log of sandbox %s: %w", id, err)
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("agent log of sandbox %s: %w", id, err)
	}
	return nil
}
