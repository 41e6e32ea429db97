package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCoalescerFreshAndShared: many concurrent readers of a key share a
// few reads, and every reader gets a read that began after it asked.
func TestCoalescerFreshAndShared(t *testing.T) {
	var c coalescer[int64]
	var reads, version atomic.Int64
	read := func(context.Context) (int64, error) {
		reads.Add(1)
		v := version.Load() // the state when the read begins
		time.Sleep(5 * time.Millisecond)
		return v, nil
	}
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%50 == 0 {
				version.Add(1) // a change, then a read that must see it
			}
			asked := version.Load()
			got, err := c.do(context.Background(), "k", read)
			if err != nil || got < asked {
				t.Errorf("reader asked at version %d got %d, %v: a read that began before it asked", asked, got, err)
			}
		}()
	}
	wg.Wait()
	if n := reads.Load(); n > 100 {
		t.Errorf("%d reads for 500 concurrent readers, want them shared", n)
	}
	t.Logf("%d reads for 500 readers", reads.Load())
	// The last read's goroutine ends just after its readers return.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		n := len(c.keys)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys left after every reader returned: %d", n)
		}
	}
}
