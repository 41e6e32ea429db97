package runtime

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestAgentArgs(t *testing.T) {
	base := []string{AgentPath, "--socket", RunDir + "/agent.sock", "--secret-file", RunDir + "/agent.secret", "--user", "1000:1001", "--workdir", "/home/dev", "--login-env", "--name-host"}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"agent defaults", Config{}, base},
		{"exec settings", Config{ExecHeartbeat: 500 * time.Millisecond, ExecRetention: 90 * time.Second, ExecRingBytes: 1 << 20},
			append(slices.Clone(base), "--heartbeat-interval", "500ms", "--retention", "1m30s", "--ring-bytes", "1048576")},
	}
	for _, tt := range tests {
		r := &Runtime{cfg: tt.cfg}
		if got := r.agentArgs(SandboxSpec{UID: 1000, GID: 1001, WorkDir: "/home/dev"}); !slices.Equal(got, tt.want) {
			t.Errorf("%s: agentArgs() = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestDigestShm keeps the digest of a spec with the default /dev/shm size
// what it was before shm_bytes existed, so that a repeated create of a
// sandbox recorded by an older berthd still matches.
func TestDigestShm(t *testing.T) {
	old := SandboxSpec{Image: "i", PidsLimit: 10}
	def := old
	def.ShmBytes = DefaultShmBytes
	big := old
	big.ShmBytes = 256 << 20
	if old.Digest() != def.Digest() {
		t.Errorf("the default shm size changes the digest")
	}
	if big.Digest() == def.Digest() {
		t.Errorf("shm_bytes 256 MiB does not change the digest")
	}
}

// TestAllowRegistry: a registry on berthd's host is reached only when
// named; "*" and the empty list allow every other registry; a list allows
// only what it names.
func TestAllowRegistry(t *testing.T) {
	for _, tc := range []struct {
		registry string
		allowed  []string
		ok       bool
		ports    []string
	}{
		{"docker.io", nil, true, nil},
		{"registry.example.com:5000", []string{"*"}, true, nil},
		{"localhost:5000", nil, false, nil},
		{"127.0.0.1:6379", nil, false, nil},
		{"127.0.0.1:6379", []string{"*"}, false, nil},
		{"[::1]:80", nil, false, nil},
		{"0.0.0.0:22", nil, false, nil},
		{"foo.localhost:22", nil, false, nil},
		{"LOCALHOST:5000", []string{"localhost:5000"}, true, []string{"5000"}},
		{"127.0.0.1:5000", []string{"127.0.0.1:5000"}, true, []string{"5000"}},
		{"127.0.0.1:5001", []string{"127.0.0.1:5000"}, false, nil},
		{"docker.io", []string{"registry.example.com"}, false, nil},
		{"registry.example.com", []string{"registry.example.com"}, true, nil},
		{"127.0.0.1:41234", []string{"*", "127.0.0.1:*"}, true, []string{"41234"}},
		{"localhost:41234", []string{"127.0.0.1:*"}, false, nil},
	} {
		ports, err := allowRegistry(tc.registry, tc.allowed)
		if (err == nil) != tc.ok || !slices.Equal(ports, tc.ports) {
			t.Errorf("allowRegistry(%q, %q) = %q, %v; want allowed %v, local ports %q", tc.registry, tc.allowed, ports, err, tc.ok, tc.ports)
		}
		if err != nil && !errors.Is(err, ErrRegistryNotAllowed) {
			t.Errorf("allowRegistry(%q) error %v is not ErrRegistryNotAllowed", tc.registry, err)
		}
	}
}

// TestDialControl: whatever name a registry has, the pull dials no address
// on berthd's host but the ports of registries named there (a name that
// resolves to 127.0.0.1, a redirect to a local service).
func TestDialControl(t *testing.T) {
	for _, tc := range []struct {
		address string
		ports   []string
		ok      bool
	}{
		{"203.0.113.7:443", nil, true},
		{"[2001:db8::1]:443", nil, true},
		{"127.0.0.1:443", nil, false},
		{"127.0.1.1:5000", nil, false},
		{"[::1]:443", nil, false},
		{"0.0.0.0:80", nil, false},
		{"127.0.0.1:5000", []string{"5000"}, true},
		{"127.0.0.1:6379", []string{"5000"}, false},
	} {
		err := dialControl(tc.ports)("tcp", tc.address, nil)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrRegistryNotAllowed)) {
			t.Errorf("dialControl(%q)(%s) = %v, want allowed %v", tc.ports, tc.address, err, tc.ok)
		}
	}
}
