package agent

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in      string
		want    syscall.Signal
		wantErr bool
	}{
		{"TERM", unix.SIGTERM, false},
		{"SIGTERM", unix.SIGTERM, false},
		{"sigterm", unix.SIGTERM, false},
		{"kill", unix.SIGKILL, false},
		{"9", unix.SIGKILL, false},
		{"64", syscall.Signal(64), false},
		{"0", 0, true},
		{"65", 0, true},
		{"-9", 0, true},
		{"", 0, true},
		{"NOPE", 0, true},
		{"SIG", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSignal(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseSignal(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestMergeEnv(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/root", "A=1"}
	got, err := mergeEnv(base, map[string]string{"HOME": "/h", "Z": "z=z", "B": "x\ny"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/bin", "A=1", "B=x\ny", "HOME=/h", "Z=z=z"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mergeEnv diff (-want +got):\n%s", diff)
	}
	if got := envPath(got); got != "/bin" {
		t.Errorf("envPath = %q, want /bin", got)
	}
}

func TestConfigDefaults(t *testing.T) {
	got, err := Config{KillGrace: 5 * time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.KillGrace = 5 * time.Second
	if got.KillGrace != want.KillGrace || got.DefaultTimeout != want.DefaultTimeout || got.RingBytes != want.RingBytes || got.WorkDir != want.WorkDir {
		t.Errorf("withDefaults = %+v, want %+v", got, want)
	}
	bad := []Config{
		{MinTimeout: time.Hour, MaxTimeout: time.Minute},
		{DefaultTimeout: 48 * time.Hour},
		{KillGrace: -1},
		{RingBytes: EventOverhead}, // no event would fit the ring
	}
	for _, c := range bad {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("withDefaults(%+v): err = nil, want an error", c)
		}
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "exe")
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := "relative:" + dir
	tests := []struct {
		file    string
		want    string
		wantErr error
	}{
		{"exe", exe, nil},
		{"plain", "", unix.EACCES},
		{"sub", "", unix.ENOENT},
		{"missing", "", unix.ENOENT},
		{"./x", "./x", nil},
	}
	for _, tt := range tests {
		got, err := lookPath(tt.file, path)
		if got != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("lookPath(%q) = %q, %v; want %q, %v", tt.file, got, err, tt.want, tt.wantErr)
		}
	}
}
