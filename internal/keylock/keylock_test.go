package keylock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLockSerializesOneKey(t *testing.T) {
	var l Locks
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.Lock(context.Background(), "a")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			inside.Add(-1)
			unlock()
			unlock() // idempotent
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d holders of one key at once, want 1", most.Load())
	}
	if l.Held("a") {
		t.Error("the lock of a is still known after every holder released it")
	}
}

func TestLockOtherKeysAndCancel(t *testing.T) {
	var l Locks
	unlockA, err := l.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// Another key is free.
	unlockB, err := l.Lock(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock of a held key until the deadline = %v, want DeadlineExceeded", err)
	}
	unlockA()
	if l.Held("a") {
		t.Error("a canceled waiter left the lock of a behind")
	}
}
