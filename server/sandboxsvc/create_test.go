package sandboxsvc

import (
	"math"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/lifecycle"
	berthstatus "github.com/berth-sandbox/berth/server/status"
	"github.com/berth-sandbox/berth/server/validate"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in       string
		uid, gid uint32
		ok       bool
	}{
		{"", 0, 0, true},
		{"1000", 1000, 1000, true},
		{"1000:2000", 1000, 2000, true},
		{"0:0", 0, 0, true},
		{"4294967294:1", 4294967294, 1, true},
		{"4294967295", 0, 0, false},
		{"alice", 0, 0, false},
		{"1000:", 0, 0, false},
		{"-1", 0, 0, false},
	} {
		uid, gid, err := parseUser("user", tc.in)
		if (err == nil) != tc.ok || uid != tc.uid || gid != tc.gid {
			t.Errorf("parseUser(%q) = %d, %d, %v; want %d, %d, ok %v", tc.in, uid, gid, err, tc.uid, tc.gid, tc.ok)
		}
	}
}

func TestValidateWorkDir(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "/workspace", true},
		{"/", "/", true},
		{"/home/dev", "/home/dev", true},
		{"home", "", false},
		{"/a/../b", "", false},
		{"/a/", "", false},
		{"/proc", "", false},
		{"/sys/fs", "", false},
		{"/.berth-run/x", "", false},
		{"/procs", "/procs", true},
	} {
		got, err := validateWorkDir("workdir", tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("validateWorkDir(%q) = %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestSandboxSpecBoundsNumbers: a resource number near 2^64 is refused by
// name before it is rounded, summed or converted to the OCI spec's signed
// fields; none wraps into a small value, or into "unset" and the default.
func TestSandboxSpecBoundsNumbers(t *testing.T) {
	cfg := Config{MaxMemoryBytes: 1 << 30}
	s := &Service{cfg: withDefaults(cfg)}
	huge := []uint64{1<<64 - 1, 1<<64 - 50, 1 << 63, 1<<63 - 1}
	for _, tc := range []struct {
		field string
		res   func(n uint64) *berthv1.Resources
	}{
		{"resources.memory_bytes", func(n uint64) *berthv1.Resources { return &berthv1.Resources{MemoryBytes: n} }},
		{"resources.pids_limit", func(n uint64) *berthv1.Resources { return &berthv1.Resources{PidsLimit: n} }},
		{"resources.cpu_millis", func(n uint64) *berthv1.Resources { return &berthv1.Resources{CpuMillis: n} }},
		{"resources.open_files_limit", func(n uint64) *berthv1.Resources { return &berthv1.Resources{OpenFilesLimit: n} }},
		{"resources.shm_bytes", func(n uint64) *berthv1.Resources { return &berthv1.Resources{ShmBytes: n} }},
		{"resources.shm_bytes", func(n uint64) *berthv1.Resources { return &berthv1.Resources{ShmBytes: n, MemoryBytes: 64 << 20} }},
	} {
		for _, n := range huge {
			res := tc.res(n)
			spec, err := s.sandboxSpec(&berthv1.CreateSandboxRequest{Image: "berth.dev/base:latest", Resources: res}, "")
			if got := berthstatus.InvalidField(err); got != tc.field {
				t.Errorf("sandboxSpec(%v) = shm %d memory %d pids %d cpu %d, %v; want INVALID_ARGUMENT naming %s",
					res, spec.ShmBytes, spec.MemoryBytes, spec.PidsLimit, spec.CPUMillis, err, tc.field)
			}
		}
	}
	// Within the bounds, shm_bytes is rounded up to whole KiB.
	spec, err := s.sandboxSpec(&berthv1.CreateSandboxRequest{Image: "berth.dev/base:latest", Resources: &berthv1.Resources{ShmBytes: 1<<20 + 1}}, "")
	if err != nil || spec.ShmBytes != 1<<20+1024 {
		t.Errorf("shm_bytes 1 MiB + 1 = %d, %v; want 1 MiB + 1 KiB", spec.ShmBytes, err)
	}
}

// TestResources checks the server's default limits and the bound on a
// sandbox's worst case of open files (pids_limit × open_files_limit).
func TestResources(t *testing.T) {
	s := &Service{cfg: withDefaults(Config{MaxCPUMillis: 2000})}
	for _, tt := range []struct {
		name      string
		in        *berthv1.Resources
		want      runtime.SandboxSpec // limits only
		wantField string              // the field an INVALID_ARGUMENT names
	}{
		{"defaults", nil, runtime.SandboxSpec{PidsLimit: 512, CPUMillis: 1000, MemoryBytes: 1 << 30, OpenFiles: 1024}, ""},
		{"asked", &berthv1.Resources{PidsLimit: 64, CpuMillis: 250, MemoryBytes: 64 << 20, OpenFilesLimit: 4096},
			runtime.SandboxSpec{PidsLimit: 64, CPUMillis: 250, MemoryBytes: 64 << 20, OpenFiles: 4096}, ""},
		{"many pids, few files", &berthv1.Resources{PidsLimit: 16384, OpenFilesLimit: 64},
			runtime.SandboxSpec{PidsLimit: 16384, CPUMillis: 1000, MemoryBytes: 1 << 30, OpenFiles: 64}, ""},
		{"many pids, default files", &berthv1.Resources{PidsLimit: 32768}, runtime.SandboxSpec{}, "resources.pids_limit"},
		{"default pids, many files", &berthv1.Resources{OpenFilesLimit: 1 << 20}, runtime.SandboxSpec{}, "resources.open_files_limit"},
		{"at the bound", &berthv1.Resources{PidsLimit: 1024, OpenFilesLimit: 1024},
			runtime.SandboxSpec{PidsLimit: 1024, CPUMillis: 1000, MemoryBytes: 1 << 30, OpenFiles: 1024}, ""},
		{"files above the maximum", &berthv1.Resources{PidsLimit: minPidsLimit, OpenFilesLimit: 1<<20 + 1}, runtime.SandboxSpec{}, "resources.open_files_limit"},
		{"too few files", &berthv1.Resources{OpenFilesLimit: 10}, runtime.SandboxSpec{}, "resources.open_files_limit"},
		{"pids above the maximum", &berthv1.Resources{PidsLimit: 40000, OpenFilesLimit: 64}, runtime.SandboxSpec{}, "resources.pids_limit"},
	} {
		var spec runtime.SandboxSpec
		err := s.resources(&spec, tt.in)
		if tt.wantField != "" {
			var field string
			for _, d := range status.Convert(berthstatus.Of(err)).Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					field = br.GetFieldViolations()[0].GetField()
				}
			}
			if field != tt.wantField {
				t.Errorf("%s: resources(%v) = %v, want INVALID_ARGUMENT naming %s", tt.name, tt.in, err, tt.wantField)
			}
			continue
		}
		got := [4]uint64{spec.PidsLimit, spec.CPUMillis, spec.MemoryBytes, spec.OpenFiles}
		if err != nil || got != [4]uint64{tt.want.PidsLimit, tt.want.CPUMillis, tt.want.MemoryBytes, tt.want.OpenFiles} {
			t.Errorf("%s: resources(%v) = %+v, %v; want %+v", tt.name, tt.in, spec, err, tt.want)
		}
	}
}

// TestValidateLabelsReserved: berth's own label prefix and containerd's
// (whose garbage collector follows containerd.io/gc.ref.* labels from a
// container: a caller's could keep or free another sandbox's snapshot)
// are refused with the key named.
func TestValidateLabelsReserved(t *testing.T) {
	for _, key := range []string{
		runtime.LabelPrefix + "owner",
		"containerd.io/gc.ref.snapshot.overlayfs",
		"containerd.io/gc.root",
	} {
		err := validate.Labels("labels", map[string]string{key: "sb-other"})
		if status.Code(berthstatus.Of(err)) != codes.InvalidArgument || !strings.Contains(status.Convert(berthstatus.Of(err)).Message(), key) {
			t.Errorf("validate.Labels(%q) = %v, want INVALID_ARGUMENT naming the key", key, err)
		}
	}
	if err := validate.Labels("labels", map[string]string{"app.kubernetes.io/name": "x", "containerd.iox": "y"}); err != nil {
		t.Errorf("validate.Labels of ordinary keys = %v, want nil", err)
	}
}

// TestSandboxSpecFloorsAndIDs: limits below what a sandbox can run with,
// or below the kernel's own floor, are refused; so is an oversized
// request_id even beside a sandbox_id.
func TestSandboxSpecFloorsAndIDs(t *testing.T) {
	cfg := Config{MaxMemoryBytes: 1 << 30}
	s := &Service{cfg: withDefaults(cfg)}
	for _, tc := range []struct {
		name  string
		req   *berthv1.CreateSandboxRequest
		field string
	}{
		{"defaults", &berthv1.CreateSandboxRequest{}, ""},
		{"at the floors", &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{CpuMillis: minCPUMillis, PidsLimit: minPidsLimit, ShmBytes: lifecycle.MinShmBytes}}, ""},
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
		if got := berthstatus.InvalidField(err); got != tc.field {
			t.Errorf("%s: sandboxSpec = %+v, %v; want INVALID_ARGUMENT naming %q", tc.name, spec, err, tc.field)
		}
	}
}

// withDefaults fills c's zero fields with server.Config's documented
// defaults (server.Config.setDefaults), as server.New passes them.
func withDefaults(c Config) Config {
	set := func(v *uint64, d uint64) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.DefaultPidsLimit, 512)
	set(&c.MaxPidsLimit, 32768)
	set(&c.MaxCPUMillis, uint64(goruntime.NumCPU())*1000)
	set(&c.MaxMemoryBytes, 24<<30)
	set(&c.DefaultOpenFiles, 1024)
	set(&c.MaxOpenFiles, 1<<20)
	set(&c.MaxSandboxOpenFiles, 1<<20)
	if c.DefaultCPUMillis == 0 {
		c.DefaultCPUMillis = 1000
	}
	if c.DefaultMemoryBytes == 0 {
		c.DefaultMemoryBytes = 1 << 30
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.DefaultIdleTimeout, 30 * time.Minute}, {&c.MaxIdleTimeout, 24 * time.Hour}, {&c.DefaultMaxLifetime, 24 * time.Hour}, {&c.MaxLifetime, 7 * 24 * time.Hour}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return c
}
