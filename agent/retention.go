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

// retire notes that e finished: it is kept for Config.Retention, and among
// at most Config.MaxRetained finished execs, the oldest of which are
// forgotten at once when there are more.
func (s *Server) retire(e *execution) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retireLocked(e)
}

// retireLocked is retire; the caller holds s.mu.
func (s *Server) retireLocked(e *execution) {
	if e.retired {
		return
	}
	e.retired = true
	s.retired = append(s.retired, e)
	for len(s.retired) > s.cfg.MaxRetained {
		old := s.retired[0]
		s.retired[0] = nil
		s.retired = s.retired[1:]
		// The janitor may have forgotten it, and its id be another
		// exec's since.
		if s.execs[old.id] == old {
			delete(s.execs, old.id)
			old.log.Drop()
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
