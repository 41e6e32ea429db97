package memrelease

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// spike has n goroutines hold 1 MiB each (as connections hold their
// buffers) until the returned function ends them.
func spike(n int) (end func()) {
	var ready, done sync.WaitGroup
	stop := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(i)
			}
			ready.Done()
			<-stop
			runtime.KeepAlive(buf)
		}()
	}
	ready.Wait()
	return func() { close(stop); done.Wait() }
}

// TestRunReturnsSpike: 160 MiB held by goroutines and let go is back with
// the kernel within a second with Run, and still held without it (the Go
// runtime collects no garbage while nothing allocates).
func TestRunReturnsSpike(t *testing.T) {
	debug.FreeOSMemory()
	base, _ := Usage()
	above := base + 48<<20
	for _, run := range []bool{false, true} {
		end := spike(160)
		if held, _ := Usage(); held < base+128<<20 {
			t.Fatalf("RSS %d MiB during the spike, want at least %d MiB", held>>20, (base+128<<20)>>20)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		if run {
			wg.Add(1)
			go func() {
				defer wg.Done()
				Run(ctx, Config{Above: above, Interval: 10 * time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			}()
		}
		end()
		start := time.Now()
		held, _ := Usage()
		for held > above && time.Since(start) < time.Second {
			time.Sleep(10 * time.Millisecond)
			held, _ = Usage()
		}
		cancel()
		wg.Wait()
		t.Logf("Run %v: RSS %d MiB %v after the spike (base %d MiB)", run, held>>20, time.Since(start).Round(time.Millisecond), base>>20)
		if run && held > above {
			t.Errorf("with Run: RSS %d MiB a second after the spike, want under %d MiB", held>>20, above>>20)
		}
		if !run && held <= above {
			t.Logf("without Run the runtime returned the spike by itself: this test cannot show Run's effect")
		}
		debug.FreeOSMemory()
	}
}

// TestRunReturnsBufferWithoutGoroutinesEnding: memory freed while the
// goroutine count stays the same (a Run's output buffer) goes back within
// Pause of the release that found it still live.
func TestRunReturnsBufferWithoutGoroutinesEnding(t *testing.T) {
	debug.FreeOSMemory()
	base, _ := Usage()
	above := base + 48<<20
	bufs := make([][]byte, 128)
	for i := range bufs {
		bufs[i] = make([]byte, 1<<20)
		for j := range bufs[i] {
			bufs[i][j] = byte(j)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Config{Above: above, Interval: 10 * time.Millisecond, Pause: 100 * time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { cancel(); <-done }()
	// Let Run find the buffers live at least once: a release that
	// returns little, after which it waits Pause.
	time.Sleep(100 * time.Millisecond)
	runtime.KeepAlive(bufs)
	bufs = nil
	start := time.Now()
	rss, _ := Usage()
	for rss > above && time.Since(start) < time.Second {
		time.Sleep(10 * time.Millisecond)
		rss, _ = Usage()
	}
	t.Logf("RSS %d MiB %v after the buffers were let go (base %d MiB)", rss>>20, time.Since(start).Round(time.Millisecond), base>>20)
	if rss > above {
		t.Errorf("RSS %d MiB a second after the buffers were let go, want under %d MiB", rss>>20, above>>20)
	}
}
