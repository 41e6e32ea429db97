package runtime

import (
	"context"
	"sync"
)

// coalescer makes concurrent reads of one key share containerd requests
// while each reader still sees the state of a moment after it asked: a
// reader never takes the result of a read that began before it arrived,
// but waits for the next one, which begins when the one under way ends.
// So at most two reads of a key are outstanding, however many readers
// wait.
type coalescer[T any] struct {
	mu   sync.Mutex
	keys map[string]*rounds[T]
}

type rounds[T any] struct {
	running bool      // a read is under way
	next    *round[T] // the read that begins when it ends, with its waiters
}

type round[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// do returns the result of a read of key that began after do was called:
// read itself, run by this caller, or another caller's.
func (c *coalescer[T]) do(ctx context.Context, key string, read func(context.Context) (T, error)) (T, error) {
	c.mu.Lock()
	if c.keys == nil {
		c.keys = make(map[string]*rounds[T])
	}
	rs := c.keys[key]
	if rs == nil {
		rs = &rounds[T]{}
		c.keys[key] = rs
	}
	if rs.running {
		// Wait for the next read: the one under way may have begun
		// before this call.
		if rs.next == nil {
			rs.next = &round[T]{done: make(chan struct{})}
		}
		r := rs.next
		c.mu.Unlock()
		select {
		case <-r.done:
			return r.val, r.err
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
	rs.running = true
	c.mu.Unlock()
	val, err := read(ctx)
	c.finish(key, rs, context.WithoutCancel(ctx), read)
	return val, err
}

// finish ends the read under way of key and begins the next one, if any
// caller waits for it, on behalf of its waiters.
func (c *coalescer[T]) finish(key string, rs *rounds[T], ctx context.Context, read func(context.Context) (T, error)) {
	c.mu.Lock()
	next := rs.next
	rs.next = nil
	if next == nil {
		rs.running = false
		delete(c.keys, key)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	go func() {
		next.val, next.err = read(ctx)
		close(next.done)
		c.finish(key, rs, ctx, read)
	}()
}
