package lifecycle

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/runtime"
)

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

// TestSpecDiffEveryField: a create of an existing id with a spec that
// differs in any one field the caller sets is refused naming that field;
// the test walks SandboxSpec by reflection, so a field added without a
// comparison in specDiff fails here (the red team dropped the runtime and
// network comparisons and no test noticed: a create asking for gVisor got
// the existing runc sandbox).
func TestSpecDiffEveryField(t *testing.T) {
	// Not the caller's to set, or not part of the spec's identity (Fork is
	// ForkSandbox's record; its children differ in FromSnapshot anyway;
	// Standby is how berthd makes a fork's child ahead, never recorded).
	skip := map[string]bool{"ID": true, "Pooled": true, "Owner": true, "Fork": true, "Standby": true}
	base := runtime.SandboxSpec{Image: "img", Runtime: runtime.RuntimeRunc, WorkDir: "/workspace"}
	want := map[string]string{"UID": "user", "GID": "user", "Network": "network", "Runtime": "runtime", "Image": "image",
		"Labels": "labels", "Env": "env", "WorkDir": "workdir", "IdleTimeout": "idle_timeout", "MaxLifetime": "max_lifetime",
		"HostUsers": "host_users", "PidsLimit": "resources.pids_limit", "CPUMillis": "resources.cpu_millis",
		"MemoryBytes": "resources.memory_bytes", "OpenFiles": "resources.open_files_limit", "DiskBytes": "resources.disk_bytes",
		"ShmBytes": "resources.shm_bytes", "IdleAction": "idle_action", "FromSnapshot": "from_snapshot", "Volumes": "volumes"}
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
		case "Volumes":
			other.Volumes = []runtime.VolumeMount{{Name: "v", Path: "/data"}}
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
