package server

import (
	"sync"
	"time"
)

// refusalSampler rate-limits the log lines of refused calls
// (RESOURCE_EXHAUSTED): one line per method and code per interval, the
// next one carrying how many were left out since ("suppressed"). Under
// load every refusal wrote a 635-byte INFO line, 32 MB of log in 3 minutes
// (issue 23); the refusals stay counted in berth_capacity_* and the
// callers' own statuses. golang.org/x/time/rate's Sometimes limits the
// same way but cannot say how many it left out.
type refusalSampler struct {
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*sampled
}

type sampled struct {
	last       time.Time
	suppressed int
}

// maxSampledKeys bounds the keys a sampler remembers; keys are method
// names, which a caller may choose, so past it the oldest are forgotten.
const maxSampledKeys = 1024

func newRefusalSampler(interval time.Duration) *refusalSampler {
	return &refusalSampler{interval: interval, now: time.Now, keys: make(map[string]*sampled)}
}

// allow reports whether the line of key is to be written now, and how many
// lines of key were left out since the last one written.
func (s *refusalSampler) allow(key string) (ok bool, suppressed int) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil {
		if len(s.keys) >= maxSampledKeys {
			for old, v := range s.keys {
				if now.Sub(v.last) >= s.interval {
					delete(s.keys, old)
				}
			}
			if len(s.keys) >= maxSampledKeys {
				return false, 0
			}
		}
		s.keys[key] = &sampled{last: now}
		return true, 0
	}
	if now.Sub(k.last) < s.interval {
		k.suppressed++
		return false, 0
	}
	n := k.suppressed
	k.last, k.suppressed = now, 0
	return true, n
}
