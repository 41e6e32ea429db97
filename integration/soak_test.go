package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/e2e"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// BenchmarkSoak runs BERTH_SOAK_EXECS (default 100 000) execs of `true`,
// one after another, in one sandbox of a berthd process of its own (the
// real binary), and checks that nothing grows with the count: the median
// latency of the last tenth is within 20 % of the first tenth's, and
// berthd's and the agent's memory (RSS) and open descriptors stay flat.
// It samples both processes, the runtime journal and the agent log twenty
// times and prints a table (BENCHMARKS.md records one). `make soak` runs
// it; it is not part of `make test` or `make bench` (it takes minutes).
func BenchmarkSoak(b *testing.B) {
	if env.skip != "" {
		e2e.Missing(b, "integration environment unavailable: "+env.skip)
	}
	execs := 100_000
	if v := os.Getenv("BERTH_SOAK_EXECS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			b.Fatalf("BERTH_SOAK_EXECS=%q: want a number of at least 100", v)
		}
		execs = n
	}
	rt, ns, stateDir := newNamespaceRuntime(b, "soak")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, "soak.sock")}
	p := startBerthd(b, e, "--log-level", "WARN")
	e.importBase(b)
	c := dialClient(b, "unix://"+e.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.GetId()) })
	berthd, agent := p.cmd.Process.Pid, int(sb.GetRuntime().GetTaskPid())
	journal := filepath.Join(stateDir, "journal", sb.GetId()+".journal")
	agentLog := rt.LogPath(sb.GetId())

	type sample struct {
		execs                int
		at                   time.Duration
		berthdRSS, agentRSS  int64 // bytes
		berthdFDs, agentFDs  int
		journalSize, logSize int64
		medianLatency, p99   time.Duration // of the execs since the last sample
	}
	var samples []sample
	latencies := make([]time.Duration, 0, execs)
	began := time.Now()
	take := func(done int) {
		s := sample{execs: done, at: time.Since(began),
			berthdRSS: rss(b, berthd), agentRSS: rss(b, agent), berthdFDs: fds(b, berthd), agentFDs: fds(b, agent),
			journalSize: size(journal), logSize: size(agentLog) + size(agentLog+".1")}
		if len(samples) > 0 {
			since := slices.Clone(latencies[samples[len(samples)-1].execs:done])
			slices.Sort(since)
			s.medianLatency, s.p99 = since[len(since)/2], since[len(since)*99/100]
		}
		samples = append(samples, s)
	}
	spec := &berthv1.ProcessSpec{Argv: []string{"true"}}
	b.ResetTimer()
	take(0)
	for i := range execs {
		start := time.Now()
		res, err := c.Run(ctx, sb.GetId(), spec)
		latencies = append(latencies, time.Since(start))
		if err != nil || res.GetResult().GetExitCode() != 0 {
			b.Fatalf("exec %d: %v, %v", i, res.GetResult(), err)
		}
		if (i+1)%(execs/20) == 0 {
			take(i + 1)
		}
	}
	b.StopTimer()

	tenth := execs / 10
	first, last := medianOf(latencies[:tenth]), medianOf(latencies[execs-tenth:])
	ratio := float64(last) / float64(first)
	fmt.Printf("\n=== berth soak: %d execs of `true` in one sandbox, one after another, %s\n", execs, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("    load average: %s\n", loadAverage())
	fmt.Printf("%8s %9s %10s %10s %10s %10s %7s %7s %10s %10s\n", "execs", "elapsed", "median", "p99", "berthd RSS", "agent RSS", "b fds", "a fds", "journal", "agent log")
	for _, s := range samples {
		fmt.Printf("%8d %9s %10s %10s %9.1fM %9.1fM %7d %7d %9.1fK %9.1fK\n", s.execs, s.at.Round(time.Second), s.medianLatency.Round(time.Microsecond),
			s.p99.Round(time.Microsecond), float64(s.berthdRSS)/(1<<20), float64(s.agentRSS)/(1<<20), s.berthdFDs, s.agentFDs,
			float64(s.journalSize)/1024, float64(s.logSize)/1024)
	}
	fmt.Printf("median latency, first tenth %v, last tenth %v: %.2fx (within 1.20x: %v)\n", first.Round(time.Microsecond), last.Round(time.Microsecond), ratio, ratio <= 1.2)
	b.ReportMetric(float64(first.Microseconds()), "first-tenth-p50-us")
	b.ReportMetric(float64(last.Microseconds()), "last-tenth-p50-us")
	b.ReportMetric(ratio, "last/first")

	if ratio > 1.2 {
		b.Errorf("median exec latency grew from %v (first tenth) to %v (last tenth): %.2fx, want within 1.20x", first, last, ratio)
	}
	// Flat: the last sample within 20 % (memory) or a few descriptors of
	// the one after the first tenth, when the caches are warm.
	warm, end := samples[2], samples[len(samples)-1]
	for _, m := range []struct {
		what      string
		warm, end int64
		slack     int64
	}{
		{"berthd RSS", warm.berthdRSS, end.berthdRSS, warm.berthdRSS / 5},
		{"agent RSS", warm.agentRSS, end.agentRSS, warm.agentRSS / 5},
		{"berthd descriptors", int64(warm.berthdFDs), int64(end.berthdFDs), 4},
		{"agent descriptors", int64(warm.agentFDs), int64(end.agentFDs), 4},
	} {
		if m.end > m.warm+m.slack {
			b.Errorf("%s grew from %d after %d execs to %d after %d", m.what, m.warm, warm.execs, m.end, end.execs)
		}
	}
}

func medianOf(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// rss returns the resident memory of process pid, in bytes (VmRSS).
func rss(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status VmRSS %q: %v", pid, v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

// fds returns how many descriptors process pid has open.
func fds(t testing.TB, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func size(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
