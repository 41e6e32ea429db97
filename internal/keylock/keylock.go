// Package keylock serializes operations on one key while operations on
// different keys run in parallel: berthd's lifecycle operations on one
// sandbox id (create, delete, task restart, removal by the reaper), and
// the task creates of one shim group (a fork's children).
package keylock

import (
	"context"
	"sync"
)

// Locks is a set of mutexes keyed by string, made on first use and dropped
// when no one holds or waits for them. The zero value is ready to use.
type Locks struct {
	mu sync.Mutex
	m  map[string]*lock
}

type lock struct {
	held chan struct{} // holds a value while the lock is held
	refs int           // holders and waiters
}

// Lock waits until it holds the lock of key or ctx ends, and returns the
// function that releases it (safe to call more than once). Waiters are
// not served in any particular order.
func (l *Locks) Lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*lock)
	}
	k := l.m[key]
	if k == nil {
		k = &lock{held: make(chan struct{}, 1)}
		l.m[key] = k
	}
	k.refs++
	l.mu.Unlock()

	select {
	case k.held <- struct{}{}:
	case <-ctx.Done():
		l.drop(key, k)
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-k.held
			l.drop(key, k)
		})
	}, nil
}

// Held reports whether someone holds or waits for the lock of key.
func (l *Locks) Held(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[key] != nil
}

func (l *Locks) drop(key string, k *lock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k.refs--; k.refs == 0 {
		delete(l.m, key)
	}
}
