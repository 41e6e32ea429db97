package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/internal/procfs"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// benchEnvInt returns the positive integer in the environment variable
// name, or def when it is unset.
func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// concurrentDiskBytes is the disk quota of each sandbox of the concurrent
// group: 50 of the tests' default 1 GiB exceed the test btrfs pool's disk
// budget (20 GiB), and `true` writes nothing.
const concurrentDiskBytes = 64 << 20

// benchConcurrent is the concurrent group of BenchmarkSideBySide (issue 23:
// "50 x 10 concurrent Runs >= 0.8x the host's concurrent fork+exec rate
// with zero refusals at default flags"): BERTH_BENCH_CONCURRENT_SANDBOXES
// sandboxes (default 50) of the tests' berthd, whose admission flags are
// berthd's defaults, each with BERTH_BENCH_CONCURRENT_LOOPS goroutines
// (default 10) calling Run(true) one after the other for
// BERTH_BENCH_CONCURRENT_SECONDS (default 20) on the raw gRPC stub (no
// client retry hides a refusal); beside as many goroutines on the host,
// each running fork+exec+wait of busybox true (os/exec, as the round trip's
// host anchor) one after the other for the same time. Each side is one
// window per benchmark run; the table shows completed execs per second of
// the window, the ratio, the Runs refused (RESOURCE_EXHAUSTED) and the CPU
// time each side used per completed exec (sandboxCPU; a note splits it),
// which holds better than the rate on a loaded host.
func benchConcurrent(b *testing.B) {
	sandboxes := benchEnvInt(b, "BERTH_BENCH_CONCURRENT_SANDBOXES", 50)
	loops := benchEnvInt(b, "BERTH_BENCH_CONCURRENT_LOOPS", 10)
	window := time.Duration(benchEnvInt(b, "BERTH_BENCH_CONCURRENT_SECONDS", 20)) * time.Second
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, sandboxes)
	// Created four at a time: the host has few cores and creating is not
	// what is measured.
	errs := make([]error, sandboxes)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			resp, err := env.sandboxes.CreateSandbox(context.Background(), &berthv1.CreateSandboxRequest{Image: env.image,
				Resources: &berthv1.Resources{DiskBytes: concurrentDiskBytes}})
			ids[i], errs[i] = resp.GetSandbox().GetId(), err
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if id != "" {
			b.Cleanup(func() {
				env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
			})
		}
		if errs[i] != nil {
			b.Fatalf("create sandbox %d of %d: %v", i+1, sandboxes, errs[i])
		}
	}
	n := sandboxes * loops
	parts := sandboxCPU(b, ids)
	measureRate(b, "concurrent/berth-Run", n, window, parts, func(ctx context.Context, i int) (bool, error) {
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: ids[i%sandboxes], Process: &berthv1.ProcessSpec{Argv: []string{"true"}}})
		switch {
		case status.Code(err) == codes.ResourceExhausted:
			return true, nil
		case err != nil:
			return false, err
		case resp.GetResult().GetExitCode() != 0:
			return false, fmt.Errorf("true exited %d", resp.GetResult().GetExitCode())
		}
		return false, nil
	})
	host := func() []cpuPart {
		return []cpuPart{{what: "this process and its reaped children", cpu: rusageCPU(unix.RUSAGE_SELF) + rusageCPU(unix.RUSAGE_CHILDREN)}}
	}
	measureRate(b, "concurrent/host-fork-exec", n, window, host, func(context.Context, int) (bool, error) {
		return false, exec.Command(busybox, "true").Run()
	})
	note(fmt.Sprintf("concurrent: %d sandboxes x %d Run(true) loops beside %d host fork+exec loops, windows of %v; refused: Runs that failed RESOURCE_EXHAUSTED (FLEET_BUSY).",
		sandboxes, loops, n, window))
}

// cpuPart is the CPU time one part of a side has used so far.
type cpuPart struct {
	what string
	cpu  time.Duration
	// within marks a breakdown of the part before it (counted there): it
	// is printed, not added to the side's sum.
	within bool
}

// rusageCPU is the user and system time getrusage(2) reports for who.
func rusageCPU(who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sandboxCPU returns a reader of the CPU time berth's side of the
// concurrent group has used: this test process (berthd and the client),
// the sandboxes' cgroups (each agent, its launchers and the `true`s they
// start: procfs.CgroupCPUFiles.Usage), of which the agents' own and their
// launchers' (every thread's run time, procfs.CPU: the rest is the
// `true`s), and their containerd shims (the agent's parent, every
// thread's run time). The test process's figure leaves out the CPU the
// reader itself spends reading /proc.
func sandboxCPU(b *testing.B, ids []string) func() []cpuPart {
	var cgroups []procfs.CgroupCPUFiles
	var agentPIDs, shims []uint32
	var probe time.Duration // the reader's own CPU so far
	for _, id := range ids {
		got, err := env.sandboxes.GetSandbox(context.Background(), &berthv1.GetSandboxRequest{SandboxId: id})
		if err != nil {
			b.Fatal(err)
		}
		pid := got.GetSandbox().GetRuntime().GetTaskPid()
		cg, err := procfs.CgroupCPUFilesOf(pid)
		if err != nil {
			b.Fatal(err)
		}
		cgroups = append(cgroups, cg)
		agentPIDs = append(agentPIDs, pid)
		shim, err := parentOf(pid)
		if err != nil {
			b.Fatal(err)
		}
		shims = append(shims, shim)
	}
	return func() []cpuPart {
		start := rusageCPU(unix.RUSAGE_SELF)
		var cgroupsCPU, agents, launchers, shim time.Duration
		for _, f := range cgroups {
			if d, err := f.Usage(); err == nil {
				cgroupsCPU += d
			}
		}
		for _, pid := range agentPIDs {
			if d, err := procfs.CPU(pid); err == nil {
				agents += d
			}
			// A launcher starts with its agent's first exec; one that
			// was replaced takes its CPU with it.
			for _, l := range procfs.ChildrenNamed(pid, launcher.Comm) {
				if d, err := procfs.CPU(l); err == nil {
					launchers += d
				}
			}
		}
		for _, pid := range shims {
			if d, err := procfs.CPU(pid); err == nil {
				shim += d
			}
		}
		end := rusageCPU(unix.RUSAGE_SELF)
		probe += end - start
		return []cpuPart{
			{what: "test process (berthd, client)", cpu: end - probe},
			{what: "sandbox cgroups (agent, launcher, true)", cpu: cgroupsCPU},
			{what: "of which agents", cpu: agents, within: true},
			{what: "launchers", cpu: launchers, within: true},
			{what: "shims", cpu: shim},
		}
	}
}

// parentOf is host process pid's parent (PPid of /proc/<pid>/status).
func parentOf(pid uint32) (uint32, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			return uint32(n), err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no PPid", pid)
}

// measureRate runs n goroutines calling op(ctx, i) one call after the
// other for window, once per benchmark iteration, and records the calls
// completed per second of wall time (until the last call in flight
// returned) as name. op reports a refusal (counted apart, not completed);
// any other error fails the benchmark. cpu, read before and after each
// window, gives the CPU time of the side's parts: the measurement holds
// their sum, and a note each part's CPU per completed call.
func measureRate(b *testing.B, name string, n int, window time.Duration, cpu func() []cpuPart, op func(ctx context.Context, i int) (refused bool, err error)) {
	b.Run(name[len("concurrent/"):], func(b *testing.B) {
		var m measurement
		for b.Loop() {
			var done, refused atomic.Int64
			var (
				mu    sync.Mutex
				first error
				fails int
			)
			ctx, cancel := context.WithTimeout(context.Background(), window+time.Minute)
			cpuBefore := cpu()
			start := time.Now()
			end := start.Add(window)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(end) {
						r, err := op(ctx, i)
						switch {
						case err != nil:
							mu.Lock()
							fails++
							if first == nil {
								first = err
							}
							mu.Unlock()
						case r:
							refused.Add(1)
						default:
							done.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			wall := time.Since(start)
			cpuAfter := cpu()
			cancel()
			if first != nil {
				b.Fatalf("%s: %d calls failed, the first: %v", name, fails, first)
			}
			m.ops += done.Load()
			m.refused += refused.Load()
			m.wall += wall
			if ops := done.Load(); ops > 0 {
				split := make([]string, len(cpuAfter))
				for j, p := range cpuAfter {
					used := p.cpu - cpuBefore[j].cpu
					if !p.within {
						m.cpu += used
					}
					split[j] = fmt.Sprintf("%s %.0f us", p.what, float64(used)/float64(ops)/1e3)
				}
				note(fmt.Sprintf("%s: %d execs, CPU per exec: %s", name, ops, strings.Join(split, ", ")))
			}
		}
		b.ReportMetric(m.opsRate(), "execs/s")
		b.ReportMetric(float64(m.refused), "refused")
		record(name, m)
	})
}
