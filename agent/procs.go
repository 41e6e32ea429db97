package agent

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// FitProcs runs the agent's goroutines on one P (runtime.GOMAXPROCS(1))
// when its cgroup caps its CPU at one CPU or less (cpuCap), and returns
// the GOMAXPROCS it leaves. Go's default rounds a cap below two CPUs up to
// two Ps (runtime/cgroup_linux.go), and with two Ps each goroutine an exec
// readies while the other P is idle wakes a second thread to spin for work
// and sleep again: with one P the agent's and launcher's threads were put
// on a CPU 14.1-14.6 times an exec instead of 16.6-18.6, with 10 execs at
// once (BenchmarkExecTrueConcurrent, issue 23). berthd's default cap is
// one CPU (--default-cpu-millis 1000). A sandbox berthd pins to one CPU
// (--cpuset auto) has one P already, since Go follows the CPU affinity
// too; this serves those it does not pin. A cap above one CPU, none, or
// one that cannot be read leaves Go's default. It reads the cgroup files
// under cgroupRoot.
func FitProcs() int {
	selfCgroup, _ := os.ReadFile("/proc/self/cgroup")
	if limit, ok := cpuCap(cgroupRoot, selfCgroup); ok && limit <= 1 {
		runtime.GOMAXPROCS(1)
	}
	return runtime.GOMAXPROCS(0)
}

// cpuCap returns the CPU cap of the cgroup named by procSelfCgroup (the
// content of /proc/self/cgroup), in CPUs: cpu.max's quota over its period
// on cgroup v2, cpu.cfs_quota_us over cpu.cfs_period_us on v1, under the
// cgroup filesystem mounted at root, trying the mount's top directory after
// the path named, as findOOMCounter does. It is false without a cap ("max",
// -1) or when no file can be read.
func cpuCap(root string, procSelfCgroup []byte) (float64, bool) {
	for _, cg := range cgroupsOf(procSelfCgroup) {
		switch {
		case cg.unified():
			for _, dir := range []string{filepath.Join(root, cg.path), root} {
				b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
				if err != nil {
					continue
				}
				// "$MAX $PERIOD" (cgroup-v2.rst), $MAX "max" for none.
				f := strings.Fields(string(b))
				if len(f) != 2 {
					return 0, false
				}
				return capOf(f[0], f[1])
			}
		case containsController(cg.controllers, "cpu"):
			for _, dir := range []string{filepath.Join(root, "cpu", cg.path), filepath.Join(root, "cpu")} {
				quota, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
				if err != nil {
					continue
				}
				period, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
				if err != nil {
					return 0, false
				}
				return capOf(strings.TrimSpace(string(quota)), strings.TrimSpace(string(period)))
			}
		}
	}
	return 0, false
}

// capOf returns quota/period in CPUs, false when quota is no cap ("max" or
// a negative number) or either is not a number.
func capOf(quota, period string) (float64, bool) {
	q, err := strconv.ParseInt(quota, 10, 64)
	if err != nil || q <= 0 {
		return 0, false
	}
	p, err := strconv.ParseInt(period, 10, 64)
	if err != nil || p <= 0 {
		return 0, false
	}
	return float64(q) / float64(p), true
}
