package agent

import (
	"context"
	"time"
)

// janitor deletes execs that finished more than Config.Retention ago, until
// ctx ends. It sweeps every Retention/4, at least every minute and at most
// every 10ms, so an exec lives at most 1.25 x Retention after it finished.
// Streams still following a deleted exec finish normally; later attaches get
// NOT_FOUND.
func (s *Server) janitor(ctx context.Context) {
	t := time.NewTicker(min(max(s.cfg.Retention/4, 10*time.Millisecond), time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sweep(now.Add(-s.cfg.Retention))
		}
	}
}

// sweep deletes the execs that finished before cutoff.
func (s *Server) sweep(cutoff time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, e := range s.execs {
		if e.finishedBefore(cutoff) {
			delete(s.execs, id)
			e.log.Drop()
		}
	}
}
