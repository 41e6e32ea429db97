package agent

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// activity remembers when an exec stream last opened, so that berthd's idle
// timeout sees work that went through the agent without it. Exec ends are
// read from the exec records themselves (execActivity).
type activity struct {
	last atomic.Int64 // unix nanoseconds; 0 before the first stream
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// execActivity returns how many execs still run and the latest of: the last
// stream opened, the last exec finished. A zero time means no activity yet.
func (s *Server) execActivity() (running uint32, last time.Time) {
	if n := s.activity.last.Load(); n != 0 {
		last = time.Unix(0, n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.execs {
		e.mu.Lock()
		if !e.finished {
			running++
		} else if e.finishedAt.After(last) {
			last = e.finishedAt
		}
		e.mu.Unlock()
	}
	return running, last
}

// Build identifies the binary: its VCS revision (12 hex digits, "+dirty"
// for a modified tree) when the build recorded one, and the Go version,
// e.g. "6fc4b1f0a1c2 go1.26.8". Reported by Info.
var Build = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return bi.GoVersion
	}
	return rev + dirty + " " + bi.GoVersion
})
