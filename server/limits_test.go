package server

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestRunSpecCapsNoWrap: two caps whose sum wraps past 2^64 are refused
// naming the cap that made it too large, not waved through as a small sum
// (issue 21: stderr_limit_bytes 2^64-1 took berthd to 1.4 GB).
func TestRunSpecCapsNoWrap(t *testing.T) {
	s := &Service{}
	s.cfg.setDefaults()
	for _, tc := range []struct {
		out, errOut uint64
		field       string
	}{
		{0, math.MaxUint64, "process.stderr_limit_bytes"},
		{1, math.MaxUint64, "process.stderr_limit_bytes"},
		{math.MaxUint64, 0, "process.stdout_limit_bytes"},
		{math.MaxUint64, math.MaxUint64, "process.stdout_limit_bytes"},
		{32 << 20, math.MaxUint64 - 32<<20 + 1, "process.stderr_limit_bytes"},
		{0, 0, ""},
		{32 << 20, 32 << 20, ""},
	} {
		spec, err := s.runSpec(&berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: tc.out, StderrLimitBytes: tc.errOut})
		if got := badRequestField(err); got != tc.field {
			t.Errorf("runSpec(stdout %d, stderr %d) = %v, %v; want INVALID_ARGUMENT naming %q", tc.out, tc.errOut, spec, err, tc.field)
		}
		if err == nil && spec.GetStdoutLimitBytes()+spec.GetStderrLimitBytes() > s.cfg.RunMaxOutputBytes {
			t.Errorf("runSpec(stdout %d, stderr %d) caps %d + %d, above the maximum %d", tc.out, tc.errOut,
				spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes(), s.cfg.RunMaxOutputBytes)
		}
	}
}

// TestValidateProcess: every size, duration and string of a process spec
// is bounded before anything starts, with the field named.
func TestValidateProcess(t *testing.T) {
	long := strings.Repeat("a", maxArgBytes+1)
	for _, tc := range []struct {
		name  string
		spec  *berthv1.ProcessSpec
		field string
	}{
		{"plain", &berthv1.ProcessSpec{Argv: []string{"ls", "-l"}, Env: map[string]string{"A": "b=c\n"}, Cwd: "/tmp", Timeout: durationpb.New(time.Minute)}, ""},
		{"zero timeout is the default", &berthv1.ProcessSpec{ShellCommand: "true", Timeout: &durationpb.Duration{}}, ""},
		{"negative timeout", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(-time.Second)}, "process.timeout"},
		{"timeout below the floor", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(time.Millisecond)}, "process.timeout"},
		{"timeout above the cap", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(25 * time.Hour)}, "process.timeout"},
		{"invalid timeout", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: &durationpb.Duration{Seconds: math.MaxInt64}}, "process.timeout"},
		{"long argument", &berthv1.ProcessSpec{Argv: []string{"echo", long}}, "process.argv[1]"},
		{"NUL in argument is the agent's to refuse", &berthv1.ProcessSpec{Argv: []string{"echo", "a\x00b"}}, ""},
		{"bad UTF-8 in argument", &berthv1.ProcessSpec{Argv: []string{"echo", "a\xffb"}}, "process.argv[1]"},
		{"too many arguments", &berthv1.ProcessSpec{Argv: make([]string, maxArgvEntries+1)}, "process.argv"},
		{"long shell command", &berthv1.ProcessSpec{ShellCommand: long}, "process.shell_command"},
		{"bad UTF-8 in shell command", &berthv1.ProcessSpec{ShellCommand: "echo \xc3"}, "process.shell_command"},
		{"long cwd", &berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "/" + strings.Repeat("d", maxPathBytes)}, "process.cwd"},
		{"bad UTF-8 in cwd", &berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "/\xff"}, "process.cwd"},
		{"long env value", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"A": long}}, "process.env[A]"},
		{"bad UTF-8 env key", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"\xff": "v"}}, "process.env"},
		{"bad UTF-8 in env value", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"A": "\xc3("}}, "process.env[A]"},
		{"all strings together too long", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: func() map[string]string {
			m := map[string]string{}
			for i := range 10 {
				m[strings.Repeat("K", i+1)] = long[:maxArgBytes-20]
			}
			return m
		}()}, "process.env"},
		{"long user", &berthv1.ProcessSpec{Argv: []string{"true"}, User: strings.Repeat("u", 300)}, "process.user"},
	} {
		err := validateProcess("process", tc.spec)
		if got := badRequestField(err); got != tc.field {
			t.Errorf("%s: validateProcess = %v; want INVALID_ARGUMENT naming %q", tc.name, err, tc.field)
		}
	}
}

// TestSandboxSpecFloorsAndIDs: limits below what a sandbox can run with,
// or below the kernel's own floor, are refused; so is an oversized
// request_id even beside a sandbox_id.
func TestSandboxSpecFloorsAndIDs(t *testing.T) {
	cfg := Config{MaxMemoryBytes: 1 << 30}
	cfg.setDefaults()
	s := &Service{cfg: cfg}
	for _, tc := range []struct {
		name  string
		req   *berthv1.CreateSandboxRequest
		field string
	}{
		{"defaults", &berthv1.CreateSandboxRequest{}, ""},
		{"at the floors", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{CpuMillis: minCPUMillis, PidsLimit: minPidsLimit, ShmBytes: minShmBytes}}, ""},
		{"cpu below 1 ms per period", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{CpuMillis: 1}}, "resources.cpu_millis"},
		{"one pid", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{PidsLimit: 1}}, "resources.pids_limit"},
		{"one byte of shm", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{ShmBytes: 1}}, "resources.shm_bytes"},
		{"huge disk", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: math.MaxUint64}}, "resources.disk_bytes"},
		{"tiny disk", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: 1}}, "resources.disk_bytes"},
		{"1 MB request_id beside sandbox_id", &berthv1.CreateSandboxRequest{SandboxId: "sb-1", RequestId: strings.Repeat("r", 1<<20)}, "request_id"},
		{"1 MB request_id", &berthv1.CreateSandboxRequest{RequestId: strings.Repeat("r", 1<<20)}, "request_id"},
		{"bad UTF-8 in env", &berthv1.CreateSandboxRequest{Env: map[string]string{"A": "\xff"}}, "env"},
		{"bad UTF-8 in workdir", &berthv1.CreateSandboxRequest{Workdir: "/\xff"}, "workdir"},
		{"negative idle timeout", &berthv1.CreateSandboxRequest{IdleTimeout: durationpb.New(-time.Second)}, "idle_timeout"},
		{"negative max lifetime", &berthv1.CreateSandboxRequest{MaxLifetime: durationpb.New(-time.Hour)}, "max_lifetime"},
	} {
		tc.req.Image = "berth.dev/base:latest"
		spec, err := s.sandboxSpec(tc.req, "")
		if got := badRequestField(err); got != tc.field {
			t.Errorf("%s: sandboxSpec = %+v, %v; want INVALID_ARGUMENT naming %q", tc.name, spec, err, tc.field)
		}
	}
}
