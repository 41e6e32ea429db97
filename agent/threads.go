package agent

import (
	"runtime"
	"sync"
)

// ReserveThreads makes the Go runtime start n OS threads now and keep them
// idle for later. A Go program that cannot create a thread when it needs
// one dies ("runtime: failed to create new OS thread", fatal error
// newosproc), and in a sandbox whose pids limit a fork bomb exhausted,
// clone(2) fails with EAGAIN: without threads in reserve, the bomb would
// kill the agent — PID 1 — and with it the sandbox. The runtime reuses idle
// threads before creating new ones and never frees an unlocked idle thread,
// so threads made here stay available. berthd raises the sandbox's pids
// limit by runtime.AgentPidsReserve to pay for them.
//
// Each of n goroutines locks itself to a thread and waits until all are
// running, which forces one thread per goroutine; each then unlocks (a
// goroutine that exits locked takes its thread with it) and exits.
func ReserveThreads(n int) {
	var running, release sync.WaitGroup
	running.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	for range n {
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			running.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	running.Wait()
	release.Done()
	done.Wait()
}
