package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"golang.org/x/sys/unix"
)

// The side-by-side report: BenchmarkSideBySide's sub-benchmarks record what
// they measured here, and TestMain prints one table after the run, berth
// beside its anchors (printSideBySide). Nothing is recorded, and nothing
// printed, unless the benchmark ran (go test -bench).

// measurement is one sub-benchmark's run (one per -count).
type measurement struct {
	bytes   int64           // payload bytes per iteration; 0 for a latency
	samples []time.Duration // wall time of each iteration
	lost    int64           // payload bytes that did not arrive, over all iterations
	// A rate of operations (measureRate): ops completed over wall, and
	// refused, the calls refused meanwhile.
	ops, refused int64
	wall         time.Duration
	// cpu is the CPU time the processes that serve the operations used
	// during wall (measureRate's cpu), or during a side's timed
	// operations (measureABBA, sample.cpu), over all iterations; 0 when
	// not measured.
	cpu time.Duration
}

// cpuPerOp is the CPU time per completed operation; 0 when not measured.
func (m measurement) cpuPerOp() time.Duration {
	if m.ops == 0 {
		return 0
	}
	return m.cpu / time.Duration(m.ops)
}

// opsRate is the operations completed per second of wall time.
func (m measurement) opsRate() float64 {
	if m.wall == 0 {
		return 0
	}
	return float64(m.ops) / m.wall.Seconds()
}

// rate is the throughput in MB/s (10^6 bytes) over all iterations.
func (m measurement) rate() float64 {
	var total time.Duration
	for _, d := range m.samples {
		total += d
	}
	if total == 0 {
		return 0
	}
	return float64(m.bytes*int64(len(m.samples))-m.lost) / total.Seconds() / 1e6
}

// quantile is the q-quantile of the samples (nearest rank).
func (m measurement) quantile(q float64) time.Duration {
	s := slices.Clone(m.samples)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

var report struct {
	mu       sync.Mutex
	results  map[string][]measurement // by sub-benchmark name under BenchmarkSideBySide
	host     string                   // where the host side's files live, and their file system
	loadFrom string                   // load average when the first result came in
	notes    []string                 // lines printed after the table
}

// note adds a line to print after the table.
func note(line string) {
	report.mu.Lock()
	defer report.mu.Unlock()
	report.notes = append(report.notes, line)
}

// record keeps m as one run of the sub-benchmark name.
func record(name string, m measurement) {
	report.mu.Lock()
	defer report.mu.Unlock()
	if report.results == nil {
		report.results = make(map[string][]measurement)
		report.loadFrom = loadAverage()
	}
	report.results[name] = append(report.results[name], m)
}

// median returns the run of name with the median value of metric, and the
// number of runs.
func median(name string, metric func(measurement) float64) (measurement, int, bool) {
	runs := slices.Clone(report.results[name])
	if len(runs) == 0 {
		return measurement{}, 0, false
	}
	slices.SortFunc(runs, func(a, b measurement) int {
		x, y := metric(a), metric(b)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return runs[len(runs)/2], len(runs), true
}

// comparison is one row group of the table: berth's figure beside its
// anchors'.
type comparison struct {
	what    string   // what is measured, for people
	berth   string   // sub-benchmark name of berth's side
	anchors []string // sub-benchmark names of the anchors, the first one the target's
	latency bool     // a latency (p50, p99; lower is better), else a throughput
	ops     bool     // a rate of operations (execs/s; higher is better), else of bytes
	target  string   // the target for berth/first anchor, "" when none
	met     func(ratio float64) bool
	// metP50, when set, judges the target by berth's own p50 instead of
	// the ratio (an absolute target such as "resume <= 25 ms").
	metP50 func(p50 time.Duration) bool
}

// comparisons lists the table's rows in order; the names are those of
// BenchmarkSideBySide's sub-benchmarks.
var comparisons = []comparison{
	{what: "Exec stdout, " + stdoutLabel, berth: "stdout/berth-Exec", anchors: []string{"stdout/containerd-FIFO", "stdout/host-pipe"},
		target: ">= 1.0x", met: func(r float64) bool { return r >= 1.0 }},
	{what: "Exec stdout, " + stdoutLabel + ", StartExec over Connect (HTTP/1.1)", berth: "stdout/berth-StartExec-connect", anchors: []string{"stdout/berth-Exec", "stdout/host-pipe"}},
	{what: "ReadFile 128 MiB to a host file (same btrfs: berthd clones)", berth: "files/ReadFile", anchors: []string{"files/host-cp"}},
	{what: "ReadFile 1 GiB to a host file (same btrfs: berthd clones)", berth: "files/ReadFile-1GiB", anchors: []string{"files/host-cp-1GiB"}},
	{what: "ReadFile 1 GiB to a host tmpfs file (berthd copies)", berth: "files/ReadFile-1GiB-tmpfs", anchors: []string{"files/host-cp-1GiB-tmpfs"},
		target: ">= 0.9x", met: func(r float64) bool { return r >= 0.9 }},
	{what: "ReadFile 1 GiB to a host tmpfs file, streamed", berth: "files/ReadFile-1GiB-tmpfs-streamed", anchors: []string{"files/host-cp-1GiB-tmpfs-beside-streamed"}},
	{what: "WriteFile 128 MiB from a host file", berth: "files/WriteFile", anchors: []string{"files/host-cp-sync"},
		target: ">= 0.5x", met: func(r float64) bool { return r >= 0.5 }},
	{what: "ReadFile 128 MiB as a raw HTTP/1.1 body (GET .../files/content)", berth: "files/ReadFile-raw-http", anchors: []string{"files/ReadFile", "files/host-cp"}},
	{what: "WriteFile 128 MiB as a raw HTTP/1.1 body (PUT .../files/content)", berth: "files/WriteFile-raw-http", anchors: []string{"files/WriteFile", "files/host-cp-sync"}},
	{what: "berth cp of a 128 MiB file out", berth: "files/berth-cp-out", anchors: []string{"files/host-cp"}},
	{what: "berth cp of a 128 MiB file in", berth: "files/berth-cp-in", anchors: []string{"files/host-cp-sync"}},
	{what: "Download (tar) of a 128 MiB file", berth: "files/Download", anchors: []string{"files/host-tar-c"}},
	{what: "Upload (tar) of a 128 MiB file", berth: "files/Upload", anchors: []string{"files/host-tar-x-sync"}},
	{what: "Upload (tar) of 5,000 4 KiB files in 50 directories", berth: "files/Upload-5000", anchors: []string{"files/host-tar-x-sync-5000"}, latency: true,
		target: "<= 1.2x", met: func(r float64) bool { return r <= 1.2 }},
	{what: "exec round trip of `true`", berth: "roundtrip/berth-Exec", anchors: []string{"roundtrip/containerd-Exec", "roundtrip/host-fork-exec"}, latency: true,
		target: "p50 <= 1/30", met: func(r float64) bool { return r <= 1.0/30 }},
	{what: "exec round trip of `true`, StartExec over Connect (HTTP/1.1)", berth: "roundtrip/berth-StartExec-connect", anchors: []string{"roundtrip/berth-Exec", "roundtrip/containerd-Exec"}, latency: true},
	{what: "command in a shell session: built-in `true`", berth: "session/berth-Session-builtin", anchors: []string{"session/berth-Exec"}, latency: true},
	{what: "command in a shell session: program `/bin/true`", berth: "session/berth-Session-program", anchors: []string{"session/berth-Exec"}, latency: true},
	{what: "exec round trip of `true`, runtime gvisor", berth: "roundtrip/berth-Exec-gvisor", anchors: []string{"roundtrip/gvisor-fork-exec", "roundtrip/berth-Exec", "roundtrip/containerd-Exec"}, latency: true,
		target: "p50 <= 3x", met: func(r float64) bool { return r <= 3 }},
	{what: "concurrent Run(true) loops (execs/s)", berth: "concurrent/berth-Run", anchors: []string{"concurrent/host-fork-exec"}, ops: true,
		target: ">= 0.8x, 0 refused", met: func(r float64) bool { return r >= 0.8 }},
	{what: "exec round trip of `true` through a fleet node that routes it", berth: "fleet/routed-Exec", anchors: []string{"fleet/owner-Exec"}, latency: true},
	{what: "PortForward: HTTP GET of 256 MiB", berth: "portforward/berth-PortForward", anchors: []string{"portforward/direct-netns"},
		target: ">= 0.7x", met: func(r float64) bool { return r >= 0.7 }},
	{what: "berth port-forward: HTTP GET of 256 MiB", berth: "portforward/berth-cli", anchors: []string{"portforward/direct-netns"}},
	{what: "PauseSandbox of a sandbox running a CPU hog", berth: "pause/berth-Pause", anchors: []string{"pause/containerd-Pause"}, latency: true},
	{what: "ResumeSandbox", berth: "pause/berth-Resume", anchors: []string{"pause/containerd-Resume"}, latency: true,
		target: "p50 <= 25 ms", metP50: func(p50 time.Duration) bool { return p50 <= 25*time.Millisecond }},
	{what: "Exec of `true` that resumes a paused sandbox", berth: "pause/berth-Exec-resuming", anchors: []string{"pause/containerd-Resume", "roundtrip/berth-Exec"}, latency: true},
	{what: "HibernateSandbox (every process ended, files kept)", berth: "pause/berth-Hibernate", anchors: []string{"pause/berth-Pause"}, latency: true},
	{what: "Exec of `true` that wakes a hibernated sandbox (new task and agent)", berth: "pause/berth-Exec-waking", anchors: []string{"pause/berth-Exec-resuming"}, latency: true},
	{what: "gVisor checkpoint: HibernateSandbox keeping 100 MiB of memory", berth: "hibernate-gvisor/berth-Hibernate-memory", anchors: []string{"hibernate-gvisor/berth-Hibernate-ended"}, latency: true},
	{what: "gVisor restore: Exec of `true` that restores 100 MiB of memory", berth: "hibernate-gvisor/berth-Exec-restoring", anchors: []string{"hibernate-gvisor/berth-Exec-waking-ended"}, latency: true},
	{what: "CreateSnapshot of a sandbox with 256 MiB written", berth: "snapshot/berth-CreateSnapshot", anchors: []string{"snapshot/host-btrfs-snapshot", "snapshot/host-cp"}, latency: true},
	{what: "create to first exec (echo) from that snapshot", berth: "snapshot/berth-from-snapshot", anchors: []string{"snapshot/berth-cold"}, latency: true},
	{what: "ForkSandbox of 1, no standby member ready (cold child), parent with " + forkLabel, berth: "fork/berth-Fork-1", anchors: []string{"fork/berth-cold", "fork/host-cp"}, latency: true,
		target: "<= 1.5x", met: func(r float64) bool { return r <= 1.5 }},
	{what: "ForkSandbox of 1, no standby member ready (cold child), parent with " + forkLabel + " (absolute)", berth: "fork/berth-Fork-1", anchors: []string{"fork/host-cp"}, latency: true,
		target: "p50 <= 0.2 s", metP50: func(p50 time.Duration) bool { return p50 <= 200*time.Millisecond }},
	{what: "ForkSandbox of 1 served by a standby member, parent with " + forkLabel, berth: "fork/berth-Fork-1-standby", anchors: []string{"fork/berth-cold", "fork/host-cp"}, latency: true,
		target: "<= 1.5x", met: func(r float64) bool { return r <= 1.5 }},
	{what: "ForkSandbox of 1 served by a standby member, parent with " + forkLabel + " (absolute)", berth: "fork/berth-Fork-1-standby", anchors: []string{"fork/host-cp"}, latency: true,
		target: "p50 <= 0.2 s", metP50: func(p50 time.Duration) bool { return p50 <= 200*time.Millisecond }},
	{what: "ForkSandbox of 10, no standby member ready (cold children), parent with " + forkLabel, berth: "fork/berth-Fork-10", anchors: []string{"fork/berth-cold", "fork/host-cp"}, latency: true,
		target: "p50 <= 2 s", metP50: func(p50 time.Duration) bool { return p50 <= 2*time.Second }},
	{what: "ForkSandbox of 10 served by 10 standby members (--fork-standby 10), parent with " + forkLabel, berth: "fork/berth-Fork-10-standby", anchors: []string{"fork/berth-cold", "fork/host-cp"}, latency: true,
		target: "p50 <= 2 s", metP50: func(p50 time.Duration) bool { return p50 <= 2*time.Second }},
	{what: "ForkSandbox of 1 under gVisor (files only), parent with 64 MiB written", berth: "fork-gvisor/berth-Fork-1", anchors: []string{"fork-gvisor/berth-cold"}, latency: true},
	{what: "ForkSandbox of 1 under gVisor with memory, parent with 64 MiB written and 64 MiB in memory", berth: "fork-gvisor/berth-Fork-1-memory", anchors: []string{"fork-gvisor/berth-cold"}, latency: true},
	{what: "CommitSnapshot of that snapshot to an image", berth: "snapshot/berth-CommitSnapshot", anchors: []string{"snapshot/host-tar-gzip"}, latency: true},
	{what: "create to first exec (echo)", berth: "create/berth-cold", anchors: []string{"create/ctr-run"}, latency: true},
	{what: "create to first exec, host_users (no id mapping)", berth: "create/berth-cold-host-users", anchors: []string{"create/ctr-run"}, latency: true},
	{what: "create to first exec, runtime gvisor", berth: "create/berth-cold-gvisor", anchors: []string{"create/ctr-run"}, latency: true},
	{what: "create to first exec, warm pool", berth: "create/berth-warm", anchors: []string{"create/ctr-run"}, latency: true},
	{what: "create to first exec, Debian image (python3, git)", berth: "create/berth-cold-debian", anchors: []string{"create/ctr-run-debian", "create/berth-cold"}, latency: true,
		target: "<= 1.2x", met: func(r float64) bool { return r <= 1.2 }},
	{what: "create to first exec, Debian image, warm pool", berth: "create/berth-warm-debian", anchors: []string{"create/ctr-run-debian"}, latency: true,
		target: "<= 0.2x", met: func(r float64) bool { return r <= 0.2 }},
}

// anchorText says, for people, what each anchor does.
var anchorText = map[string]string{
	"stdout/containerd-FIFO":                   "containerd task.Exec, FIFO",
	"stdout/host-pipe":                         "host pipe",
	"stdout/berth-Exec":                        "berth Exec (gRPC)",
	"files/host-cp":                            "host cp --reflink=never",
	"files/host-cp-sync":                       "host cp --reflink=never && sync FILE",
	"files/host-tar-c":                         "host tar -c",
	"files/host-tar-x-sync":                    "host tar -x && sync -f",
	"files/host-cp-1GiB":                       "host cp --reflink=never",
	"files/host-tar-x-sync-5000":               "host mkdir && tar -x && sync -f",
	"roundtrip/berth-Exec":                     "berth Exec (gRPC), runtime runc",
	"roundtrip/containerd-Exec":                "containerd task.Exec",
	"roundtrip/host-fork-exec":                 "host fork+exec+wait",
	"roundtrip/gvisor-fork-exec":               "fork+exec+wait inside the gvisor sandbox",
	"concurrent/host-fork-exec":                "host fork+exec+wait loops, as many",
	"create/ctr-run":                           "ctr run --rm",
	"pause/containerd-Pause":                   "containerd task.Pause (cgroup freezer)",
	"pause/containerd-Resume":                  "containerd task.Resume",
	"pause/berth-Pause":                        "berth PauseSandbox",
	"pause/berth-Exec-resuming":                "berth Exec resuming a paused sandbox",
	"snapshot/host-btrfs-snapshot":             "host btrfs subvolume snapshot -r of the same data",
	"snapshot/host-cp":                         "host cp -a --reflink=never of the same data",
	"snapshot/berth-cold":                      "berth cold create of the base image",
	"fork/berth-cold":                          "berth CreateSandbox of the base image, to its answer",
	"fork-gvisor/berth-cold":                   "berth CreateSandbox of the base image under gVisor, to its answer",
	"fork/host-cp":                             "host cp -a --reflink=never of the same data",
	"snapshot/host-tar-gzip":                   "host tar c | gzip of the same data to a file",
	"create/ctr-run-debian":                    "ctr run --rm of the same image",
	"create/berth-cold":                        "berth, the 2 MiB base image",
	"fleet/owner-Exec":                         "the same through the node that holds it",
	"portforward/direct-netns":                 "direct connection in the sandbox's netns",
	"files/ReadFile":                           "berth ReadFile over gRPC",
	"files/WriteFile":                          "berth WriteFile over gRPC",
	"hibernate-gvisor/berth-Hibernate-ended":   "a gVisor sandbox like it holding a host socket: checkpoint fails, processes ended",
	"hibernate-gvisor/berth-Exec-waking-ended": "its wake: a new task and agent",
	"session/berth-Exec":                       "berth Exec of `true` (a new process), same sandbox",
}

// printSideBySide prints the table of what BenchmarkSideBySide recorded, if
// anything, with the date and the machine.
func printSideBySide(w io.Writer) {
	report.mu.Lock()
	defer report.mu.Unlock()
	if len(report.results) == 0 {
		return
	}
	fmt.Fprintf(w, "\n=== berth side by side: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	for _, line := range machine() {
		fmt.Fprintf(w, "    %s\n", line)
	}
	if report.host != "" {
		fmt.Fprintf(w, "    host files: %s\n", report.host)
	}
	fmt.Fprintf(w, "    load average: %s at the first result, %s at the end\n", report.loadFrom, loadAverage())
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "what\tberth\tanchor\tanchor's figure\tberth/anchor\ttarget\t")
	for _, c := range comparisons {
		metric := measurement.rate
		switch {
		case c.latency:
			metric = func(m measurement) float64 { return float64(m.quantile(0.5)) }
		case c.ops:
			metric = measurement.opsRate
		}
		b, runs, ok := median(c.berth, metric)
		if !ok {
			continue
		}
		what, berth := c.what, figure(b, c.latency)
		if runs > 1 {
			what += fmt.Sprintf(" (median of %d runs)", runs)
		}
		if b.lost > 0 {
			berth += fmt.Sprintf(", LOST %.1f of %.1f MiB", float64(b.lost)/(1<<20), float64(b.bytes*int64(len(b.samples)))/(1<<20))
		}
		shown := false
		for i, name := range c.anchors {
			a, _, ok := median(name, metric)
			if !ok {
				continue
			}
			ratio := metric(b) / metric(a)
			target := ""
			if i == 0 && c.target != "" {
				verdict := "MISSED"
				met := c.metP50 != nil && c.metP50(time.Duration(metric(b)))
				if c.metP50 == nil {
					met = c.met(ratio)
				}
				if met && b.lost == 0 && b.refused == 0 {
					verdict = "met"
				}
				target = c.target + " " + verdict
			}
			if shown {
				what, berth = "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", what, berth, anchorText[name], figure(a, c.latency), ratioText(ratio), target)
			shown = true
		}
		if !shown {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\n", what, berth)
		}
	}
	tw.Flush()
	if len(report.notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range report.notes {
			fmt.Fprintln(w, n)
		}
	}
	fmt.Fprintln(w, "\nMB/s: 10^6 payload bytes delivered per second of wall time. p50, p99: of n operations.")
	fmt.Fprintln(w, "berth/anchor: of MB/s and execs/s (higher is better for berth), of p50 (lower is better for berth).")
}

// figure formats a measurement: MB/s, execs/s and refusals, or p50/p99
// and the sample count.
func figure(m measurement, latency bool) string {
	if m.wall > 0 {
		if m.cpu > 0 {
			return fmt.Sprintf("%.0f execs/s, %d refused, %.0f us CPU/exec", m.opsRate(), m.refused, float64(m.cpuPerOp())/float64(time.Microsecond))
		}
		return fmt.Sprintf("%.0f execs/s, %d refused", m.opsRate(), m.refused)
	}
	if latency {
		return fmt.Sprintf("p50 %s p99 %s n=%d", ms(m.quantile(0.5)), ms(m.quantile(0.99)), len(m.samples))
	}
	return fmt.Sprintf("%.0f MB/s", m.rate())
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// ratioText formats berth/anchor; a ratio below 1/10 also as a fraction.
func ratioText(r float64) string {
	if r > 0 && r < 0.1 {
		return fmt.Sprintf("%.3fx (1/%.0f)", r, 1/r)
	}
	return fmt.Sprintf("%.2fx", r)
}

// machine describes the host: CPU, cores, memory, kernel, distribution, Go,
// containerd and runc.
func machine() []string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	unix.Sysinfo(&si)
	var uts unix.Utsname
	unix.Uname(&uts)
	distro := "unknown distribution"
	if f, err := os.Open("/etc/os-release"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if v, ok := strings.CutPrefix(s.Text(), "PRETTY_NAME="); ok {
				distro = strings.Trim(v, `"`)
			}
		}
		f.Close()
	}
	lines := []string{
		fmt.Sprintf("machine: %s, %d cores, %.1f GiB, %s, Linux %s, %s",
			cpu, runtime.NumCPU(), float64(si.Totalram)*float64(si.Unit)/(1<<30), distro, unix.ByteSliceToString(uts.Release[:]), runtime.Version()),
	}
	versions := []string{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cc, err := containerd.New(env.containerd); err == nil {
		if v, err := cc.Version(ctx); err == nil {
			versions = append(versions, "containerd "+v.Version)
		}
		cc.Close()
	}
	if out, err := exec.Command("runc", "--version").Output(); err == nil {
		first, _, _ := bytes.Cut(out, []byte("\n"))
		versions = append(versions, string(first))
	}
	if len(versions) > 0 {
		lines = append(lines, strings.Join(versions, ", "))
	}
	return lines
}

// loadAverage returns /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// fsType names the file system dir is on (statfs(2) f_type).
func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("f_type %#x", st.Type)
}
