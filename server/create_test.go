package server

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

func TestSpecDiff(t *testing.T) {
	base := runtime.SandboxSpec{Image: "img", Labels: map[string]string{"a": "b"}, Env: map[string]string{"K": "v"}, PidsLimit: 10, WorkDir: "/workspace", IdleTimeout: time.Minute, MaxLifetime: time.Hour}
	if got := specDiff(base, runtime.EnvDigest(base.Env), base); len(got) != 0 {
		t.Errorf("specDiff(same) = %v, want none", got)
	}
	other := base
	other.Env = map[string]string{"K": "w"}
	other.Labels = nil
	other.UID = 1
	other.MaxLifetime = 2 * time.Hour
	other.DiskBytes = 1 << 30
	want := []string{"labels", "env", "resources.disk_bytes", "user", "max_lifetime"}
	if got := specDiff(base, runtime.EnvDigest(base.Env), other); !slices.Equal(got, want) {
		t.Errorf("specDiff = %v, want %v", got, want)
	}
	if base.Digest() == other.Digest() {
		t.Error("different specs have the same digest")
	}
}

// TestSandboxSpecBoundsNumbers: a resource number near 2^64 is refused by
// name before it is rounded, summed or converted to the OCI spec's signed
// fields; none wraps into a small value, or into "unset" and the default.
func TestSandboxSpecBoundsNumbers(t *testing.T) {
	cfg := Config{MaxMemoryBytes: 1 << 30}
	cfg.setDefaults()
	s := &Service{cfg: cfg}
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
			if got := badRequestField(err); got != tc.field {
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

// badRequestField returns the field of err's one BadRequest violation, or
// "" when err is not INVALID_ARGUMENT with exactly one.
func badRequestField(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return ""
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestResources checks the server's default limits and the bound on a
// sandbox's worst case of open files (pids_limit × open_files_limit).
func TestResources(t *testing.T) {
	s := &Service{cfg: Config{MaxCPUMillis: 2000}}
	s.cfg.setDefaults()
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
			for _, d := range status.Convert(err).Details() {
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
		err := validateLabels("labels", map[string]string{key: "sb-other"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), key) {
			t.Errorf("validateLabels(%q) = %v, want INVALID_ARGUMENT naming the key", key, err)
		}
	}
	if err := validateLabels("labels", map[string]string{"app.kubernetes.io/name": "x", "containerd.iox": "y"}); err != nil {
		t.Errorf("validateLabels of ordinary keys = %v, want nil", err)
	}
}

// TestSpecDiffEveryField: a create of an existing id with a spec that
// differs in any one field the caller sets is refused naming that field;
// the test walks SandboxSpec by reflection, so a field added without a
// comparison in specDiff fails here (the red team dropped the runtime and
// network comparisons and no test noticed: a create asking for gVisor got
// the existing runc sandbox).
func TestSpecDiffEveryField(t *testing.T) {
	// Not the caller's to set, or not part of the spec's identity.
	skip := map[string]bool{"ID": true, "Pooled": true, "Owner": true}
	base := runtime.SandboxSpec{Image: "img", Runtime: runtime.RuntimeRunc, WorkDir: "/workspace"}
	want := map[string]string{"UID": "user", "GID": "user", "Network": "network", "Runtime": "runtime", "Image": "image",
		"Labels": "labels", "Env": "env", "WorkDir": "workdir", "IdleTimeout": "idle_timeout", "MaxLifetime": "max_lifetime",
		"HostUsers": "host_users", "PidsLimit": "resources.pids_limit", "CPUMillis": "resources.cpu_millis",
		"MemoryBytes": "resources.memory_bytes", "OpenFiles": "resources.open_files_limit", "DiskBytes": "resources.disk_bytes",
		"ShmBytes": "resources.shm_bytes"}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		if skip[f.Name] {
			continue
		}
		other := base
		v := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Name {
		case "Network":
			other.Network = runtime.NetworkSpec{Egress: true, Allow: []string{"10.0.0.0/8"}}
		case "Runtime":
			other.Runtime = runtime.RuntimeGVisor
		default:
			switch v.Kind() {
			case reflect.String:
				v.SetString("/other")
			case reflect.Uint64, reflect.Uint32:
				v.SetUint(7)
			case reflect.Int64:
				v.SetInt(int64(5 * time.Second))
			case reflect.Bool:
				v.SetBool(true)
			case reflect.Map:
				v.Set(reflect.ValueOf(map[string]string{"k": "v"}))
			default:
				t.Fatalf("field %s of kind %v: teach this test to change it", f.Name, v.Kind())
			}
		}
		got := specDiff(base, runtime.EnvDigest(base.Env), other)
		if w, ok := want[f.Name]; !ok || !slices.Equal(got, []string{w}) {
			t.Errorf("a spec differing only in %s: specDiff = %v, want [%s]", f.Name, got, want[f.Name])
		}
	}
}
