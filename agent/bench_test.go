package agent_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/procfs"
)

// BenchmarkExecTrue measures one `true` round trip through the real agent
// over its unix socket, on a kept connection: start, started, exited. It
// also reports the CPU time the agent and its launcher used per exec
// (agent-us/op: their threads' run time, procfs.CPU; the `true`s are not
// in it), the figure the concurrent benchmark's throughput follows on a
// busy host (issue 23), and how many times the agent's and launcher's
// threads were put on a CPU per exec (agent-runs/op: each a wake-up).
func BenchmarkExecTrue(b *testing.B) {
	a := startAgent(b, "--retention", "1s")
	// The launcher starts with the first exec.
	if r := a.run(b, "warm", argv("true")); r.result.GetExitCode() != 0 {
		b.Fatalf("exit code %d", r.result.GetExitCode())
	}
	pids := append([]uint32{uint32(a.pid)}, procfs.ChildrenNamed(uint32(a.pid), launcher.Comm)...)
	cpu := func() (sum time.Duration) {
		for _, pid := range pids {
			d, err := procfs.CPU(pid)
			if err != nil {
				b.Fatalf("CPU of %d: %v", pid, err)
			}
			sum += d
		}
		return sum
	}
	slices := func() (sum uint64) {
		for _, pid := range pids {
			sum += timeslices(pid)
		}
		return sum
	}
	before, slicesBefore := cpu(), slices()
	n := 0
	for i := 0; b.Loop(); i++ {
		r := a.run(b, fmt.Sprintf("true-%d", i), argv("true"))
		if r.result.GetExitCode() != 0 {
			b.Fatalf("exit code %d", r.result.GetExitCode())
		}
		n++
	}
	b.ReportMetric(float64(cpu()-before)/float64(time.Microsecond)/float64(n), "agent-us/op")
	b.ReportMetric(float64(slices()-slicesBefore)/float64(n), "agent-runs/op")
}

// timeslices returns how many times the threads of process pid were put
// on a CPU (field 3 of /proc/<pid>/task/*/schedstat, the kernel's
// sched-stats.rst): each wake-up of a thread counts one. Threads that
// ended are not counted.
func timeslices(pid uint32) (sum uint64) {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
		var run, wait, n uint64
		if _, err := fmt.Sscan(string(b), &run, &wait, &n); err == nil {
			sum += n
		}
	}
	return sum
}

// BenchmarkExecOutput measures output throughput: 64 MiB from head(1)
// through the agent's pipe, ring and stream to a client that only counts
// the bytes, with the default ring: flow control delivers every byte; the
// short retention frees each exec soon after the next starts.
func BenchmarkExecOutput(b *testing.B) {
	const size = 64 << 20
	a := startAgent(b, "--retention", "10ms")
	b.SetBytes(size)
	var events uint64
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		spec := argv("head", "-c", fmt.Sprint(size), "/dev/zero")
		stream := a.startExec(b, ctx, fmt.Sprintf("out-%d", i), spec)
		var received uint64
		for {
			resp, err := stream.Recv()
			if err != nil {
				b.Fatalf("Recv: %v", err)
			}
			if o := resp.GetOutput(); o != nil {
				received += uint64(len(o.GetData()))
				events++
			}
			if res := resp.GetExited().GetResult(); res != nil {
				if res.GetStdoutBytes() != size || received != size {
					b.Fatalf("stdout_bytes = %d, received %d bytes, want %d", res.GetStdoutBytes(), received, size)
				}
				break
			}
		}
		cancel()
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}

// BenchmarkExecTrueConcurrent is BenchmarkExecTrue with 10 streams at
// once, as each sandbox of the concurrent benchmark gets, for the agent
// with Go's default GOMAXPROCS and with one P (FitProcs: a sandbox capped
// at one CPU). agent-us/op and agent-runs/op are as in BenchmarkExecTrue.
func BenchmarkExecTrueConcurrent(b *testing.B) {
	const streams = 10
	for _, procs := range []string{"default", "1"} {
		b.Run("procs="+procs, func(b *testing.B) {
			dir, err := os.MkdirTemp("", "ag")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
			var prefix []string
			if procs != "default" {
				prefix = []string{"env", "GOMAXPROCS=" + procs}
			}
			a := startAgentCmd(b, dir, prefix, "--retention", "1s")
			if r := a.run(b, "warm", argv("true")); r.result.GetExitCode() != 0 {
				b.Fatalf("exit code %d", r.result.GetExitCode())
			}
			pids := append([]uint32{uint32(a.pid)}, procfs.ChildrenNamed(uint32(a.pid), launcher.Comm)...)
			usage := func() (cpu time.Duration, runs uint64) {
				for _, pid := range pids {
					d, err := procfs.CPU(pid)
					if err != nil {
						b.Fatalf("CPU of %d: %v", pid, err)
					}
					cpu += d
					runs += timeslices(pid)
				}
				return cpu, runs
			}
			cpuBefore, runsBefore := usage()
			var next atomic.Int64
			b.SetParallelism((streams + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := a.run(b, fmt.Sprintf("true-%d", next.Add(1)), argv("true"))
					if r.result.GetExitCode() != 0 {
						b.Errorf("exit code %d", r.result.GetExitCode())
						return
					}
				}
			})
			b.StopTimer()
			cpu, runs := usage()
			n := float64(next.Load())
			b.ReportMetric(float64(cpu-cpuBefore)/float64(time.Microsecond)/n, "agent-us/op")
			b.ReportMetric(float64(runs-runsBefore)/n, "agent-runs/op")
		})
	}
}
